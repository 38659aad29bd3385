#!/usr/bin/env bash
# Build deploy/Dockerfile for real, check the running container, run deploy/compose.yaml's replicated stack, and
# lint, render and validate the Helm chart (deploy/test-chart.sh).
#
#   bash deploy/test-image.sh            # from anywhere; .ci/run calls it on every run
#
# With a Docker engine (`docker info` answers) it uses docker. Without one it uses podman (Debian's
# podman, runc, slirp4netns..., installed with apt-get when missing) and, when the Dockerfile's base image
# (python:3.11-slim) cannot be pulled, builds a stand-in for it with debootstrap: Debian bookworm's
# python3 with venv, pip and the headers, tagged exactly as the Dockerfile's FROM names it. The stand-in's
# root filesystem is cached in $MESSAGES_GATEWAY_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/messages-gateway)
# and its image is reused while its recipe and the host's extra CA certificates are unchanged.
#
# Then it runs the image as CI would not dare to run it in production: --read-only, a tmpfs /tmp, every
# capability dropped, no-new-privileges, published on 127.0.0.1 only; and checks /healthz, a JSON and a
# streamed POST /v1/messages, /metrics, the uid, the C extensions, the health check, a live reload of a
# config mounted the way the kubelet mounts a ConfigMap, and a stream that finishes during `stop`. Then it brings
# up compose.yaml's replicated shape (PostgreSQL, Redis, two gateways, Prometheus; where their upstream images cannot
# be pulled, stand-ins made of Debian's packages, deploy/test-standins/), sends requests through both gateways,
# checks that the rows land in PostgreSQL, the counters in Redis, and that Prometheus scrapes both with the admin
# key, and tears it down. Every check is an assertion; the summary table lists each one, and the script exits 1 if
# any failed.
#
# Environment:
#   MESSAGES_GATEWAY_SKIP_IMAGE=1   skip everything (says so and exits 0)
#   MESSAGES_GATEWAY_ENGINE         docker or podman (default: docker when `docker info` works)
#   MESSAGES_GATEWAY_IMAGE          the tag to build (default localhost/messages-gateway:test)
#   MESSAGES_GATEWAY_IMAGE_MAX_MB   the largest image accepted (default 350)
#   MESSAGES_GATEWAY_IMAGE_MAX_ADDED_MB  the most the Dockerfile may add to its base (default 120)
#   MESSAGES_GATEWAY_CACHE          where the stand-in base and the tools venv are kept
#   MESSAGES_GATEWAY_DEBIAN_MIRROR  debootstrap's mirror (default http://deb.debian.org/debian)
#   MESSAGES_GATEWAY_KEEP=1         keep the containers (and the compose stack) and the temporary directory
set -euo pipefail

if [ "${MESSAGES_GATEWAY_SKIP_IMAGE:-0}" = 1 ]; then
  echo "deploy/test-image.sh: skipped (MESSAGES_GATEWAY_SKIP_IMAGE=1): the image was NOT built or checked"
  exit 0
fi

cd "$(dirname "$0")/.."
CACHE=${MESSAGES_GATEWAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/messages-gateway}
IMAGE=${MESSAGES_GATEWAY_IMAGE:-localhost/messages-gateway:test}
MAX_MB=${MESSAGES_GATEWAY_IMAGE_MAX_MB:-350}
MAX_ADDED_MB=${MESSAGES_GATEWAY_IMAGE_MAX_ADDED_MB:-120}
MIRROR=${MESSAGES_GATEWAY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KUBERNETES_VALIDATE=kubernetes-validate==1.37.0
# The base image, exactly as the Dockerfile names it (ARG PYTHON_IMAGE=...), and its fully qualified name.
BASE=$(sed -n 's/^ARG PYTHON_IMAGE=//p' deploy/Dockerfile)
[ -n "$BASE" ] || {
  echo "deploy/test-image.sh: deploy/Dockerfile names no base (ARG PYTHON_IMAGE=...)" >&2
  exit 1
}
case "$BASE" in
  */*/*) BASE_REF=$BASE ;;
  */*) BASE_REF=docker.io/$BASE ;;
  *) BASE_REF=docker.io/library/$BASE ;;
esac
# The stand-in: what it is made of (a change here makes a new one).
STANDIN_SUITE=bookworm
STANDIN_PACKAGES=python3,python3-venv,python3-pip,libpython3.11-dev,ca-certificates
STANDIN_RECIPE=3
# The services compose.yaml runs beside the gateways, by deploy/test-standins/Containerfile's target names.
SERVICE_TARGETS=(postgres redis prometheus)
RUN_ID=mgw-test-$$
WORK=$(mktemp -d "${TMPDIR:-/tmp}/$RUN_ID.XXXXXX")
CONTAINERS=()
COMPOSE_PROJECT=""
STEPS=()
CHECKS=()
FAILED=0
T0=$(date +%s)

CURRENT_STEP=""
SUMMARY_DONE=0

log() { printf '\n==> %s\n' "$*"; }
die() {
  printf '\ndeploy/test-image.sh: %s\n' "$*" >&2
  exit 1
}

cleanup() {
  local rc=$?
  if [ "$rc" != 0 ] && [ "$SUMMARY_DONE" = 0 ]; then
    [ -z "$CURRENT_STEP" ] || echo "deploy/test-image.sh: failed in step: $CURRENT_STEP" >&2
    summary
    echo "deploy/test-image.sh: FAILED (exit $rc)" >&2
  fi
  if [ "${MESSAGES_GATEWAY_KEEP:-0}" = 1 ]; then
    echo "kept: containers ${CONTAINERS[*]:-none}, compose project ${COMPOSE_PROJECT:-none}, directory $WORK"
  else
    [ -z "$COMPOSE_PROJECT" ] || compose_down >/dev/null 2>&1 || true
    local c rm=(rm -f)
    [ "${ENGINE:-podman}" = podman ] && rm+=(-t 0) # docker rm -f has no -t (it kills at once anyway)
    for c in "${CONTAINERS[@]}"; do "${ENGINE:-podman}" "${rm[@]}" "$c" >/dev/null 2>&1 || true; done
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# step NAME COMMAND...: run a setup step, timed. It runs in this shell under `set -e`: its first failing
# command stops the script (the EXIT trap prints the summary and removes the containers).
step() {
  local name=$1 start
  shift
  log "$name"
  CURRENT_STEP=$name
  start=$(date +%s)
  "$@"
  STEPS+=("$(printf '%-58s %4ss' "$name" "$(($(date +%s) - start))")")
  CURRENT_STEP=""
}

# check NAME FUNCTION: run an assertion in a shell of its own (so that `set -e` holds inside it), record
# PASS or FAIL with its last output line, and go on with the next one.
check() {
  local name=$1 fn=$2 start out rc=0
  start=$(date +%s)
  out=$(bash -euo pipefail -c "$(declare -f); $fn" 2>&1) || rc=$?
  local secs=$(($(date +%s) - start)) last
  last=$(printf '%s\n' "$out" | sed '/^$/d' | tail -n 1)
  if [ "$rc" = 0 ]; then
    CHECKS+=("$(printf 'PASS  %-44s %3ss  %s' "$name" "$secs" "${last:0:90}")")
    echo "PASS  $name${last:+: $last}"
  else
    FAILED=$((FAILED + 1))
    CHECKS+=("$(printf 'FAIL  %-44s %3ss  %s' "$name" "$secs" "${last:0:90}")")
    echo "FAIL  $name"
    printf '%s\n' "$out" | tail -n 20 | sed 's/^/      /'
  fi
}

summary() {
  SUMMARY_DONE=1
  echo
  echo "deploy/test-image.sh summary (engine ${ENGINE:-?}, base ${BASE_KIND:-?}, image $IMAGE)"
  echo "--- steps ---------------------------------------------------------------"
  printf '%s\n' "${STEPS[@]}"
  echo "--- checks --------------------------------------------------------------"
  if [ "${#CHECKS[@]}" -gt 0 ]; then printf '%s\n' "${CHECKS[@]}"; fi
  echo "-------------------------------------------------------------------------"
  echo "image checks: $((${#CHECKS[@]} - FAILED)) of ${#CHECKS[@]} passed in $(($(date +%s) - T0)) s"
}

sha() { sha256sum | cut -c1-16; }
have() { command -v "$1" >/dev/null 2>&1; }

apt_install() {
  [ "$(id -u)" = 0 ] || die "needs $* (apt-get install as root): run as root or install them first"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >"$WORK/apt.log" 2>&1 \
    || {
      DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$WORK/apt.log" 2>&1 \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >>"$WORK/apt.log" 2>&1
    } || {
      tail -n 20 "$WORK/apt.log" >&2
      return 1
    }
}

# ---------------------------------------------------------------------------------------------------
# Tools

choose_engine() {
  ENGINE=${MESSAGES_GATEWAY_ENGINE:-}
  if [ -z "$ENGINE" ]; then
    if have docker && docker info >/dev/null 2>&1; then ENGINE=docker; else ENGINE=podman; fi
  fi
  echo "engine: $ENGINE"
}

install_tools() {
  local need=() cmd
  for cmd in curl python3; do have "$cmd" || need+=("$cmd"); done
  if [ "$ENGINE" = podman ]; then
    have podman || need+=(podman)
    have runc || need+=(runc)
    have slirp4netns || need+=(slirp4netns)
    have newuidmap || need+=(uidmap)
    have fuse-overlayfs || need+=(fuse-overlayfs)
    have debootstrap || need+=(debootstrap)
    have podman-compose || need+=(podman-compose)
  fi
  if [ "${#need[@]}" -gt 0 ]; then
    echo "installing: ${need[*]}"
    apt_install "${need[@]}"
  fi
  # podman-compose names services by DNS on the stack's network: with CNI (Debian's podman 4.3) that is the
  # dnsname plugin, without which gateway cannot resolve postgres (netavark has aardvark-dns built in).
  if [ "$ENGINE" = podman ] && [ "$(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null)" = cni ] \
    && [ ! -x /usr/lib/cni/dnsname ]; then
    echo "installing: golang-github-containernetworking-plugin-dnsname"
    apt_install golang-github-containernetworking-plugin-dnsname
  fi
  if [ "$ENGINE" = podman ]; then
    # These hosts: runc (crun cannot run with cgroups in hybrid mode), the cgroupfs manager (no systemd),
    # and ulimits no higher than the host's hard limits (runc cannot raise them). The container file is
    # this script's own: the host's containers.conf is left alone.
    local nofile nproc
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    if [ "$nofile" = unlimited ] || [ "$nofile" -gt 20000 ]; then nofile=20000; fi
    if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
    mkdir -p "$CACHE"
    cat >"$CACHE/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
EOF
    export CONTAINERS_CONF=$CACHE/containers.conf
    podman --version
  else
    docker version --format 'docker {{.Server.Version}}'
  fi
}

# ---------------------------------------------------------------------------------------------------
# The base image: the real one when it can be had, else the stand-in

standin_rootfs() { # the cached debootstrap tarball (no host certificates in it)
  local key=$1 tarball=$CACHE/standin-$1.tar dir=$WORK/rootfs
  if [ -s "$tarball" ]; then
    echo "stand-in root filesystem: cached ($tarball)"
    return 0
  fi
  echo "debootstrap --variant=minbase $STANDIN_SUITE ($STANDIN_PACKAGES) from $MIRROR"
  [ "$(id -u)" = 0 ] || die "debootstrap needs root"
  debootstrap --variant=minbase --include="$STANDIN_PACKAGES" "$STANDIN_SUITE" "$dir" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || {
    tail -n 20 "$WORK/debootstrap.log" >&2
    return 1
  }
  # As the official python:3.11-slim: python and python3 on the PATH in /usr/local/bin, no static
  # libpython (the official image deletes it), no apt lists or package cache, and Debian's slim image
  # rules (no docs, man pages or translations), kept for the packages the builder stage installs.
  ln -sf /usr/bin/python3 "$dir/usr/local/bin/python3"
  ln -sf /usr/bin/python3 "$dir/usr/local/bin/python"
  rm -f "$dir"/usr/lib/python3.11/config-3.11-*/libpython3.11*.a "$dir"/usr/lib/*-linux-gnu/libpython3.11.a
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/cache/apt/*.bin "$dir"/var/lib/apt/lists/*
  find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$dir"/usr/share/man/* "$dir"/usr/share/info/* "$dir"/usr/share/lintian/*
  find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  cat >"$dir/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  mkdir -p "$CACHE"
  tar --numeric-owner -C "$dir" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$dir"
  find "$CACHE" -maxdepth 1 -name 'standin-*.tar' -not -name "standin-$key.tar" -delete # older recipes
}

make_standin() {
  local recipe certs_key key label dir=$WORK/rootfs
  recipe=$(printf '%s\n' "$STANDIN_RECIPE" "$STANDIN_SUITE" "$STANDIN_PACKAGES" "$MIRROR" | sha)
  # The build's pip must trust what the host trusts (a TLS-inspecting proxy's CA, say): the host's extra
  # certificates go into the stand-in, and a change of them makes a new image (not a new debootstrap).
  certs_key=$(find /usr/local/share/ca-certificates -type f -name '*.crt' -exec cat {} + 2>/dev/null | sha)
  key=$recipe-$certs_key
  label=$(podman image inspect --format '{{index .Labels "io.messages-gateway.standin"}}' "$BASE_REF" 2>/dev/null || true)
  if [ "$label" = "$key" ]; then
    echo "stand-in $BASE_REF: reused (recipe $recipe, certificates $certs_key)"
    return 0
  fi
  standin_rootfs "$recipe"
  mkdir -p "$dir"
  tar --numeric-owner -C "$dir" -xf "$CACHE/standin-$recipe.tar"
  if [ -d /usr/local/share/ca-certificates ]; then
    cp -r /usr/local/share/ca-certificates/. "$dir/usr/local/share/ca-certificates/"
  fi
  chroot "$dir" update-ca-certificates >/dev/null 2>&1 || {
    echo "update-ca-certificates failed in the stand-in" >&2
    return 1
  }
  tar --numeric-owner -C "$dir" -cf - . | podman import \
    --change "LABEL io.messages-gateway.standin=$key" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' - "$BASE_REF" >/dev/null
  rm -rf "$dir"
  echo "stand-in $BASE_REF: made (recipe $recipe, certificates $certs_key)"
}

prepare_base() {
  if [ "$ENGINE" = docker ]; then
    BASE_KIND="$BASE (pulled by docker build)"
    return 0
  fi
  local label
  label=$(podman image inspect --format '{{index .Labels "io.messages-gateway.standin"}}' "$BASE_REF" 2>/dev/null || echo missing)
  if [ "$label" != missing ] && [ -z "$label" ]; then
    BASE_KIND="$BASE (the real image, present)"
  elif podman pull -q "$BASE_REF" >"$WORK/pull.log" 2>&1; then
    BASE_KIND="$BASE (the real image, pulled)"
  else
    echo "cannot pull $BASE_REF ($(tail -n 1 "$WORK/pull.log" | cut -c1-160))"
    echo "building the stand-in instead"
    make_standin
    BASE_KIND="$BASE (debootstrap stand-in)"
  fi
  podman image inspect --format "$BASE_REF: {{.Size}} bytes" "$BASE_REF"
}

build_image() {
  if [ "$ENGINE" = docker ]; then
    docker build -f deploy/Dockerfile -t "$IMAGE" . >"$WORK/build.log" 2>&1 || {
      tail -n 40 "$WORK/build.log" >&2
      return 1
    }
  else
    # --format docker: the OCI format has no HEALTHCHECK (podman build drops it with a warning).
    # --network host: the build's apt-get and pip reach the mirrors without a container network.
    # The builder stage is tagged too (the same cached layers), so that the prune below, of what earlier
    # runs built and no tag names any more (~660 MB a builder), keeps the cache of this one.
    local stage args=(--format docker --network host --pull=never --label io.messages-gateway.test-image=1
      -f deploy/Dockerfile)
    for stage in builder runtime; do
      podman build "${args[@]}" --target "$stage" -t "$IMAGE$([ "$stage" = runtime ] || echo -builder)" . \
        >>"$WORK/build.log" 2>&1 || {
        tail -n 40 "$WORK/build.log" >&2
        return 1
      }
    done
    podman image prune -f --filter label=io.messages-gateway.test-image=1 >/dev/null 2>&1 || true
    podman image prune -f --filter label=io.messages-gateway.standin >/dev/null 2>&1 || true # older stand-ins
  fi
  grep -iE 'warn' "$WORK/build.log" | grep -v -iE 'pip.*root|WARNING: Running pip' | sed 's/^/  build: /' || true
  "$ENGINE" image inspect --format "$IMAGE: {{.Size}} bytes" "$IMAGE"
}

# ---------------------------------------------------------------------------------------------------
# Containers

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# run_container NAME PORT [ENGINE-ARGS...]: the image's own CMD and HEALTHCHECK, hardened, on 127.0.0.1
run_container() {
  local name=$1 port=$2
  shift 2
  local net=()
  [ "$ENGINE" = podman ] && net=(--network slirp4netns)
  CONTAINERS+=("$name")
  # (podman's complaints that it cannot reach systemd to schedule the health check go to a file)
  "$ENGINE" run -d --name "$name" "${net[@]}" -p "127.0.0.1:$port:8080" \
    --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges "$@" "$IMAGE" \
    >/dev/null 2>"$WORK/run-$name.err" || {
    cat "$WORK/run-$name.err" >&2
    return 1
  }
}

wait_healthz() { # PORT NAME
  local i
  for i in $(seq 1 60); do
    if curl -fsS -m 2 "http://127.0.0.1:$1/healthz" >/dev/null 2>&1; then return 0; fi
    if [ "$("$ENGINE" inspect --format '{{.State.Running}}' "$2" 2>/dev/null)" != true ]; then
      "$ENGINE" logs "$2" 2>&1 | tail -n 20 >&2
      echo "container $2 exited" >&2
      return 1
    fi
    sleep 0.5
  done
  "$ENGINE" logs "$2" 2>&1 | tail -n 20 >&2
  echo "no /healthz answer on 127.0.0.1:$1 in 30 s" >&2
  return 1
}

# A ConfigMap volume as the kubelet lays it out: ..data -> ..<timestamp>/, gateway.yaml -> ..data/gateway.yaml.
# configmap_write DIR FILE: a new timestamped directory, then ..data_tmp renamed over ..data (atomic).
configmap_write() {
  local dir=$1 file=$2 stamp old=""
  stamp=..$(date -u +%Y_%m_%d_%H_%M_%S.%N)
  mkdir "$dir/$stamp"
  cp "$file" "$dir/$stamp/gateway.yaml"
  chmod 755 "$dir/$stamp"
  chmod 644 "$dir/$stamp/gateway.yaml"
  [ -L "$dir/..data" ] && old=$(readlink "$dir/..data")
  ln -s "$stamp" "$dir/..data_tmp"
  mv -T "$dir/..data_tmp" "$dir/..data"
  [ -L "$dir/gateway.yaml" ] || ln -s ..data/gateway.yaml "$dir/gateway.yaml"
  if [ -n "$old" ]; then rm -rf "${dir:?}/$old"; fi
}

# --- the checks (each runs in its own bash; they read the exported variables) ----------------------

# Output is matched with here-strings, not `printf | grep -q`: under pipefail an early grep -q exit can
# fail the printf with SIGPIPE.
has() { grep -q -- "$2" <<<"$1"; }                        # has TEXT PATTERN
logs_has() { has "$("$ENGINE" logs "$1" 2>&1)" "$2"; }   # logs_has CONTAINER PATTERN

post() { # PORT BODY: POST /v1/messages, response headers to $WORK/h.<check's pid>, body to stdout
  curl -sS -N -m 30 -D "$WORK/h.$$" -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' \
    --data "$2" "http://127.0.0.1:$1/v1/messages"
}

check_healthz() {
  local body
  body=$(curl -fsS -m 5 "http://127.0.0.1:$PORT/healthz")
  [ "$body" = '{"status":"ok"}' ] || {
    echo "/healthz answered $body"
    exit 1
  }
  echo "$body"
}

check_json_message() {
  local body
  body=$(post "$PORT" "{\"model\":\"$ALIAS\",\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}")
  grep -qi '^HTTP/[0-9.]* 200' "$WORK/h.$$" || {
    head -n 1 "$WORK/h.$$"
    echo "$body"
    exit 1
  }
  grep -qi '^content-type: application/json' "$WORK/h.$$"
  grep -qi '^x-gateway-mock: true' "$WORK/h.$$"
  printf '%s' "$body" | python3 -c '
import json, sys
m = json.load(sys.stdin)
assert m["type"] == "message" and m["role"] == "assistant", m
assert m["model"].startswith("mock:"), m["model"]
text = "".join(b.get("text", "") for b in m["content"] if b["type"] == "text")
assert text and m["stop_reason"] in ("end_turn", "max_tokens"), m
assert m["usage"]["output_tokens"] > 0, m["usage"]
print("%s, %s, %d output tokens" % (m["model"], m["stop_reason"], m["usage"]["output_tokens"]))'
}

check_stream() {
  local body
  body=$(post "$PORT" "{\"model\":\"$ALIAS\",\"max_tokens\":64,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}")
  grep -qi '^HTTP/[0-9.]* 200' "$WORK/h.$$"
  grep -qi '^content-type: text/event-stream' "$WORK/h.$$"
  has "$body" '^event: message_start'
  has "$body" '^event: content_block_delta'
  ! has "$body" '^event: error' || {
    echo "the stream carried an error event"
    exit 1
  }
  [ "$(printf '%s\n' "$body" | grep '^event: ' | tail -n 1)" = "event: message_stop" ] || {
    printf '%s\n' "$body" | tail -n 5
    echo "the stream did not end with message_stop"
    exit 1
  }
  echo "$(printf '%s\n' "$body" | grep -c '^event: ') events, last message_stop"
}

check_metrics() {
  local body
  body=$(curl -fsS -m 5 -D "$WORK/h.$$" "http://127.0.0.1:$PORT/metrics")
  grep -qi '^content-type: text/plain' "$WORK/h.$$"
  # the two requests above, counted under their alias
  has "$body" "^gateway_requests_total{.*alias=\"$ALIAS\""
  has "$body" '^gateway_inflight_requests'
  echo "$(printf '%s\n' "$body" | grep -vc '^#') samples, gateway_requests_total{alias=\"$ALIAS\"} present"
}

check_ledger() { # the requests above are rows of the usage ledger, in the image's volume, read back by its API
  local rows
  rows=$("$ENGINE" exec "$NAME" python -c '
import os, sqlite3, time
path = os.path.join(os.environ["MESSAGES_GATEWAY_DATA_DIR"], "ledger.db")
for _ in range(40):
    try:
        n = sqlite3.connect(path).execute("SELECT COUNT(*) FROM requests").fetchone()[0]
    except sqlite3.Error:
        n = 0
    if n >= 2:
        break
    time.sleep(0.25)
print(path, n)')
  [ "${rows##* }" -ge 2 ] || {
    echo "ledger: $rows"
    exit 1
  }
  "$ENGINE" inspect --format '{{range .Mounts}}{{.Destination}} {{end}}' "$NAME" | grep -q /var/lib/messages-gateway
  local report
  report=$(curl -fsS -m 5 "http://127.0.0.1:$PORT/v1/organizations/usage_report/messages?starting_at=$(date -u +%Y-%m-%d)T00:00:00Z&ending_at=$(date -u -d tomorrow +%Y-%m-%d)T00:00:00Z")
  printf '%s' "$report" | python3 -c '
import json, sys
d = json.load(sys.stdin)
n = sum(r["requests"] for b in d["data"] for r in b["results"])
assert n >= 2, d
print("usage report: %d requests today" % n)'
  echo "$rows rows in the volume; the usage report reads them"
}

proc1() { "$ENGINE" exec "$NAME" cat /proc/1/status; }

check_non_root() {
  local status uid gid
  status=$(proc1)
  uid=$(printf '%s\n' "$status" | awk '/^Uid:/ {print $2, $3, $4, $5}')
  gid=$(printf '%s\n' "$status" | awk '/^Gid:/ {print $2, $3, $4, $5}')
  [ "$uid" = "10001 10001 10001 10001" ] || {
    echo "PID 1 uids: $uid"
    exit 1
  }
  [ "$gid" = "10001 10001 10001 10001" ] || {
    echo "PID 1 gids: $gid"
    exit 1
  }
  [ "$("$ENGINE" image inspect --format '{{.Config.User}}' "$IMAGE")" = "10001:10001" ]
  echo "PID 1 ($(printf '%s\n' "$status" | awk '/^Name:/ {print $2}')) runs as 10001:10001"
}

check_hardening() {
  local status
  status=$(proc1)
  has "$status" $'^CapEff:[ \t]*0*$' || {
    grep ^Cap <<<"$status"
    exit 1
  }
  has "$status" $'^CapBnd:[ \t]*0*$'
  has "$status" $'^NoNewPrivs:[ \t]*1$'
  [ "$("$ENGINE" inspect --format '{{.HostConfig.ReadonlyRootfs}}' "$NAME")" = true ]
  if "$ENGINE" exec "$NAME" sh -c 'echo x > /opt/venv/written' 2>/dev/null; then
    echo "the root filesystem is writable"
    exit 1
  fi
  "$ENGINE" exec "$NAME" sh -c 'echo x > /tmp/written && rm /tmp/written'
  echo "no capabilities, no-new-privileges, read-only root, /tmp writable"
}

check_extensions() {
  # in the serving process itself (PID 1 maps both shared objects), and for any new interpreter
  local maps
  maps=$("$ENGINE" exec "$NAME" cat /proc/1/maps)
  has "$maps" '/adapters/_eventstream_c\.' || {
    echo "PID 1 has not loaded adapters/_eventstream_c"
    exit 1
  }
  has "$maps" '/gateway/wire/_views_c\.' || {
    echo "PID 1 has not loaded gateway/wire/_views_c"
    exit 1
  }
  has "$maps" '/gateway/observability/_otlp_c\.' || {
    echo "PID 1 has not loaded gateway/observability/_otlp_c"
    exit 1
  }
  "$ENGINE" exec "$NAME" python -c '
from adapters._eventstream import IMPLEMENTATION
from gateway.wire.events import COMPILED_VIEWS
from gateway.observability.otlp_proto import IMPLEMENTATION as OTLP
assert IMPLEMENTATION == "c", IMPLEMENTATION
assert COMPILED_VIEWS is True, COMPILED_VIEWS
assert OTLP == "c", OTLP'
  if logs_has "$NAME" 'was not built'; then
    echo "the gateway warned that an extension was not built"
    exit 1
  fi
  echo "PID 1 maps _eventstream_c, _views_c and _otlp_c; each in use"
}

check_no_build_tools() {
  "$ENGINE" run --rm --network none --entrypoint sh "$IMAGE" -c '
found=""
for c in cc gcc g++ c++ clang tcc x86_64-linux-gnu-gcc aarch64-linux-gnu-gcc as ld make; do
  command -v "$c" >/dev/null 2>&1 && found="$found $c"
done
for d in /usr/lib/gcc /usr/libexec/gcc; do
  [ -d "$d" ] && [ -n "$(find "$d" -name "cc1*" -print -quit)" ] && found="$found $d/.../cc1"
done
[ -z "$found" ] || { echo "in the runtime image:$found"; exit 1; }
for m in pip setuptools faker polyfactory; do
  if /opt/venv/bin/python -c "import $m" 2>/dev/null; then echo "/opt/venv has $m"; exit 1; fi
done
[ ! -e /opt/venv/bin/pip ] || { echo "/opt/venv/bin/pip exists"; exit 1; }
echo "no compiler, assembler, linker or make; no pip, setuptools, faker, polyfactory in /opt/venv"'
}

check_healthcheck() {
  local config status
  config=$("$ENGINE" image inspect --format '{{json .Config.Healthcheck}}' "$IMAGE")
  has "$config" '127.0.0.1:8080/healthz' || {
    echo "the image has no HEALTHCHECK ($config): built in the OCI format?"
    exit 1
  }
  if [ "$ENGINE" = podman ]; then
    # podman schedules health checks with systemd timers, which these hosts lack: run it as they would
    podman healthcheck run "$NAME"
  else
    local i
    for i in $(seq 1 30); do
      [ "$(docker inspect --format '{{.State.Health.Status}}' "$NAME")" = healthy ] && break
      sleep 1
    done
  fi
  status=$("$ENGINE" inspect --format '{{.State.Health.Status}}' "$NAME")
  [ "$status" = healthy ] || {
    echo "health: $status"
    exit 1
  }
  echo "HEALTHCHECK in the image; status healthy"
}

check_size() { # the whole image, and what the Dockerfile adds to its base (the venv, mostly)
  local bytes base
  bytes=$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")
  base=$("$ENGINE" image inspect --format '{{.Size}}' "$BASE_REF")
  echo "image $((bytes / 1000000)) MB: base $((base / 1000000)) MB + $(((bytes - base) / 1000000)) MB" \
    "(limits $MAX_MB MB and $MAX_ADDED_MB MB)"
  [ "$bytes" -le $((MAX_MB * 1000000)) ] && [ $((bytes - base)) -le $((MAX_ADDED_MB * 1000000)) ]
}

check_reload() {
  local i
  local models
  ! logs_has "$CM_NAME" 'config reloaded' || {
    echo "reloaded before the change"
    exit 1
  }
  models=$(curl -fsS -m 5 "http://127.0.0.1:$CM_PORT/v1/models?limit=100")
  has "$models" '"claude-slow"'
  if has "$models" '"claude-reloaded"'; then
    echo "claude-reloaded served before the change"
    exit 1
  fi
  configmap_write "$CM_DIR" "$WORK/gateway-v2.yaml"
  for i in $(seq 1 40); do
    models=$(curl -fsS -m 5 "http://127.0.0.1:$CM_PORT/v1/models?limit=100")
    if has "$models" '"claude-reloaded"'; then
      logs_has "$CM_NAME" 'config reloaded from /etc/messages-gateway/gateway.yaml'
      has "$(post "$CM_PORT" '{"model":"claude-reloaded","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}')" \
        '"mock:claude-reloaded"'
      echo "..data swapped: alias claude-reloaded served after $((i / 4)).$((i % 4 * 25)) s"
      return 0
    fi
    sleep 0.25
  done
  "$ENGINE" logs "$CM_NAME" 2>&1 | tail -n 5
  echo "the new alias did not appear within 10 s of the ..data swap"
  exit 1
}

check_drain() {
  local start stop_s code i
  post "$CM_PORT" '{"model":"claude-slow","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}' \
    >"$WORK/drain.out" 2>"$WORK/drain.err" &
  local curl_pid=$!
  for i in $(seq 1 40); do
    grep -q '^event: content_block_delta' "$WORK/drain.out" 2>/dev/null && break
    sleep 0.1
  done
  grep -q '^event: content_block_delta' "$WORK/drain.out" || {
    echo "the slow stream did not start"
    exit 1
  }
  start=$(date +%s%N)
  "$ENGINE" stop -t 40 "$CM_NAME" >/dev/null
  stop_s=$((($(date +%s%N) - start) / 1000000))
  wait "$curl_pid" || {
    cat "$WORK/drain.err"
    echo "curl failed"
    exit 1
  }
  ! grep -q '^event: error' "$WORK/drain.out" || {
    grep -A1 '^event: error' "$WORK/drain.out"
    exit 1
  }
  [ "$(grep '^event: ' "$WORK/drain.out" | tail -n 1)" = "event: message_stop" ] || {
    tail -n 4 "$WORK/drain.out"
    echo "the stream in flight did not finish"
    exit 1
  }
  code=$("$ENGINE" inspect --format '{{.State.ExitCode}}' "$CM_NAME")
  [ "$code" = 0 ] || {
    "$ENGINE" logs "$CM_NAME" 2>&1 | tail -n 5
    echo "exit code $code"
    exit 1
  }
  logs_has "$CM_NAME" 'draining: 1 streams in flight'
  [ "$stop_s" -lt 35000 ] # drained and exited, not killed at the grace period's end
  echo "the stream in flight ended with message_stop; stop took $((stop_s / 1000)).$((stop_s % 1000 / 100)) s; exit 0"
}

check_compose() {
  if [ "$ENGINE" = docker ]; then
    if docker compose version >/dev/null 2>&1; then
      docker compose -f deploy/compose.yaml config >"$WORK/compose.txt"
      grep -q 'host_ip: 127.0.0.1' "$WORK/compose.txt"
      if grep -q 'host_ip: 0.0.0.0' "$WORK/compose.txt" || grep -qF '${' "$WORK/compose.txt"; then
        echo "published on every interface, or a literal \${"
        exit 1
      fi
      echo "docker compose config: loopback ports, no literal \${"
    else
      echo "no docker compose plugin: not checked"
    fi
    return 0
  fi
  (cd deploy && podman-compose --dry-run -f compose.yaml up -d) >"$WORK/compose.txt" 2>&1 || true
  local run
  run=$(grep '^podman run --name=[a-z_]*gateway' "$WORK/compose.txt") || {
    tail -n 5 "$WORK/compose.txt"
    exit 1
  }
  [[ "$run" != *'${'* ]] || {
    echo "a literal \${ reaches podman: $run"
    exit 1
  }
  [ "$(grep -c . <<<"$run")" = 2 ] || { # gateway and gateway-2, the same definition (a YAML merge key)
    echo "gateway runs: $run"
    exit 1
  }
  local line
  while read -r line; do
    [[ "$line" == *" -e GATEWAY_API_KEY "* && "$line" == *" -e ANTHROPIC_API_KEY "* ]]
    [[ "$line" == *" -e PGPASSWORD="*" -e REDIS_PASSWORD="* ]]
    [[ "$line" == *"--healthcheck-command"*"127.0.0.1:8080/healthz"* ]]
  done <<<"$run"
  grep -q '^podman run --name=[a-z_]*postgres_1 .* -e POSTGRES_PASSWORD=' "$WORK/compose.txt"
  grep -q '^podman run --name=[a-z_]*redis_1 ' "$WORK/compose.txt"
  local ports version
  ports=$(grep -o ' -p [^ ]*' "$WORK/compose.txt" | awk '{print $2}' | sort -u)
  [ -n "$ports" ]
  ! grep -qv '^127\.0\.0\.1:' <<<"$ports" || {
    echo "published beyond 127.0.0.1: $ports"
    exit 1
  }
  version=$(podman-compose version 2>&1 | sed -n 's/^podman-composer* version *//p' | head -n 1)
  echo "podman-compose $version dry run: 2 gateways, env passed through, health check, ports $(tr '\n' ' ' <<<"$ports")"
}

# --- compose.yaml's replicated stack -----------------------------------------------------------------

qualify() { # an image name as podman stores it: docker.io/library/redis:7.0-bookworm
  case "$1" in
    */*/*) echo "$1" ;;
    */*) echo "docker.io/$1" ;;
    *) echo "docker.io/library/$1" ;;
  esac
}

compose_image() { # SERVICE: the image compose.yaml names for it
  "$TOOLS/bin/python" -c 'import sys, yaml; print(yaml.safe_load(open("deploy/compose.yaml"))["services"][sys.argv[1]]["image"])' "$1"
}

# The upstream images of the services beside the gateways, pulled; where they cannot be (no registry), stand-ins
# built from deploy/test-standins/Containerfile on the gateway's own base (bookworm), tagged as compose.yaml names the
# real ones and reused while the Containerfile, the entrypoint and the base are the same (a label says which).
service_images() {
  if [ "$ENGINE" = docker ]; then
    echo "docker compose pulls them"
    return 0
  fi
  local target ref label key
  key=$(cat deploy/test-standins/Containerfile deploy/test-standins/postgres-entrypoint.sh | sha)
  key=$key-$(podman image inspect --format '{{.Id}}' "$BASE_REF" | cut -c1-12)
  for target in "${SERVICE_TARGETS[@]}"; do
    ref=$(qualify "$(compose_image "$target")")
    label=$(podman image inspect --format '{{index .Labels "io.messages-gateway.standin-service"}}' "$ref" 2>/dev/null || echo missing)
    if [ "$label" = "$key" ]; then
      echo "$ref: stand-in, reused ($key)"
    elif [ "$label" != missing ] && [ -z "$label" ]; then
      echo "$ref: the real image, present"
    elif podman pull -q "$ref" >"$WORK/pull-$target.log" 2>&1; then
      echo "$ref: the real image, pulled"
    else
      echo "$ref: cannot pull ($(tail -n 1 "$WORK/pull-$target.log" | cut -c1-120)); building the stand-in"
      podman build --format docker --network host --pull=never --build-arg "BASE=$BASE_REF" --target "$target" \
        --label "io.messages-gateway.standin-service=$key" -t "$ref" deploy/test-standins \
        >>"$WORK/standins.log" 2>&1 || {
        tail -n 30 "$WORK/standins.log" >&2
        return 1
      }
      echo "$ref: stand-in, built ($key)"
    fi
  done
  podman image prune -f --filter label=io.messages-gateway.standin-service >/dev/null 2>&1 || true # older ones
}

compose() { # the stack of this run, on its own project name (containers, network, volumes) and free ports
  if [ "$ENGINE" = docker ]; then
    GATEWAY_IMAGE=$IMAGE docker compose -p "$COMPOSE_PROJECT" -f deploy/compose.yaml "$@"
  else
    GATEWAY_IMAGE=$IMAGE podman-compose -p "$COMPOSE_PROJECT" -f deploy/compose.yaml "$@"
  fi
}

compose_container() { # SERVICE: its container's id
  "$ENGINE" ps -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT" \
    --filter "label=com.docker.compose.service=$1" | head -n 1
}

compose_up() {
  # The image this run built is the gateways' (GATEWAY_IMAGE); Grafana's has no stand-in and is not started.
  compose up -d --no-build postgres redis gateway gateway-2 prometheus >"$WORK/compose-up.log" 2>&1 || {
    tail -n 30 "$WORK/compose-up.log" >&2
    return 1
  }
  local service missing=""
  for service in postgres redis gateway gateway-2 prometheus; do
    [ -n "$(compose_container "$service")" ] || missing="$missing $service"
  done
  [ -z "$missing" ] || { # podman-compose 1.0.3 exits 0 when a container fails to start
    grep -iE 'error|fail' "$WORK/compose-up.log" | grep -v systemd | tail -n 10 >&2
    echo "not running:$missing" >&2
    return 1
  }
  echo "project $COMPOSE_PROJECT: gateway 127.0.0.1:$GATEWAY_PORT, gateway-2 127.0.0.1:$GATEWAY_2_PORT," \
    "Prometheus 127.0.0.1:$PROMETHEUS_PORT"
}

compose_wait() {
  wait_healthz "$GATEWAY_PORT" "$(compose_container gateway)"
  wait_healthz "$GATEWAY_2_PORT" "$(compose_container gateway-2)"
}

compose_down() {
  compose down -t 5 -v >"$WORK/compose-down.log" 2>&1 || true
  # podman-compose 1.0.3 leaves the network behind (and the volumes of services it did not start)
  local ids
  ids=$("$ENGINE" ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT")
  [ -z "$ids" ] || "$ENGINE" rm -f $ids >/dev/null 2>&1 || true
  ids=$("$ENGINE" volume ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT")
  [ -z "$ids" ] || "$ENGINE" volume rm -f $ids >/dev/null 2>&1 || true
  "$ENGINE" network rm "${COMPOSE_PROJECT}_default" >/dev/null 2>&1 || true
  echo "removed project $COMPOSE_PROJECT"
  COMPOSE_PROJECT=""
}

check_compose_shared() { # requests through both gateways: one ledger, one set of counters
  local port body n=0 remaining="" rows=0 counted i
  for port in "$GATEWAY_PORT" "$GATEWAY_2_PORT" "$GATEWAY_2_PORT"; do
    body=$(post "$port" '{"model":"claude-sonnet-4-6","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}')
    grep -qi '^HTTP/[0-9.]* 200' "$WORK/h.$$" || {
      head -n 1 "$WORK/h.$$"
      echo "$body"
      exit 1
    }
    has "$body" '"mock:claude-sonnet-4-6"'
    n=$((n + 1))
    remaining="$remaining $(tr -d '\r' <"$WORK/h.$$" | sed -n 's/^anthropic-ratelimit-requests-remaining: *//Ip')"
  done
  local pg rd
  pg=$(compose_container postgres)
  for i in $(seq 1 40); do # the ledger writes its rows within its flush interval (1 s)
    rows=$("$ENGINE" exec "$pg" psql -U gateway -d gateway -tAc 'SELECT COUNT(*) FROM requests' 2>/dev/null || echo 0)
    [ "$rows" -ge "$n" ] && break
    sleep 0.25
  done
  [ "$rows" = "$n" ] || {
    "$ENGINE" logs "$(compose_container gateway)" 2>&1 | grep -i ledger | tail -n 5
    echo "PostgreSQL holds $rows rows for $n requests"
    exit 1
  }
  rd=$(compose_container redis)
  # shellcheck disable=SC2016 # expanded in the container
  counted=$("$ENGINE" exec "$rd" sh -c 'export REDISCLI_AUTH="$REDIS_PASSWORD"
for k in $(redis-cli --scan --pattern "mgw:key:|requests|*"); do redis-cli get "$k"; done' | awk '{s += $1} END {print s + 0}')
  [ "$counted" = "$n" ] || {
    echo "Redis counted $counted requests of $n"
    exit 1
  }
  echo "$n requests over 2 gateways: $rows rows in PostgreSQL, $counted counted in Redis (remaining:$remaining)"
}

check_compose_metrics_auth() {
  local key port code
  key=$(tr -d '\n' <deploy/prometheus/gateway-admin-key)
  for port in "$GATEWAY_PORT" "$GATEWAY_2_PORT"; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "http://127.0.0.1:$port/metrics")
    [ "$code" = 401 ] || {
      echo "/metrics without the admin key on $port: $code"
      exit 1
    }
    has "$(curl -fsS -m 5 -H "Authorization: Bearer $key" "http://127.0.0.1:$port/metrics")" \
      '^gateway_requests_total{alias="claude-sonnet-4-6"'
  done
  echo "both: 401 without the key, 200 with deploy/prometheus/gateway-admin-key as the bearer"
}

check_compose_prometheus() { # prometheus.yml's bearer, as Prometheus itself sends it
  local i out=""
  for i in $(seq 1 60); do
    out=$(curl -fsS -m 5 "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/targets?state=active" 2>/dev/null | python3 -c '
import json, sys
targets = [t for t in json.load(sys.stdin)["data"]["activeTargets"] if t["labels"]["job"] == "messages-gateway"]
words = sorted(t["labels"]["instance"] + "=" + t["health"] + ("(%s)" % t["lastError"] if t["lastError"] else "") for t in targets)
print(" ".join(words))
' 2>/dev/null) || out=""
    [ "$out" = "gateway-2:8080=up gateway:8080=up" ] && break
    sleep 0.5
  done
  [ "$out" = "gateway-2:8080=up gateway:8080=up" ] || {
    echo "targets: ${out:-none}"
    exit 1
  }
  echo "Prometheus $("$ENGINE" exec "$(compose_container prometheus)" prometheus --version 2>&1 | head -n 1 | awk '{print $3}'): $out"
}

check_chart() {
  TOOLS=$TOOLS KUBERNETES_VALIDATE=$KUBERNETES_VALIDATE MESSAGES_GATEWAY_CACHE=$CACHE bash deploy/test-chart.sh
}

# ---------------------------------------------------------------------------------------------------

main() {
  step "tools: engine and packages" choose_engine
  step "tools: install what is missing" install_tools
  step "base image: $BASE" prepare_base
  step "build deploy/Dockerfile" build_image
  TOOLS=$CACHE/tools-venv # kubernetes-validate, and PyYAML for the configs below
  step "tools: $KUBERNETES_VALIDATE" tools_venv

  # 1. the image as shipped: its default config, hardened
  NAME=$RUN_ID-default
  PORT=$(free_port)
  ALIAS=claude-sonnet-4-6
  step "run: image defaults, --read-only, no capabilities" run_container "$NAME" "$PORT"
  step "wait for /healthz" wait_healthz "$PORT" "$NAME"
  export ENGINE IMAGE NAME PORT ALIAS WORK MAX_MB MAX_ADDED_MB BASE_REF CONTAINERS_CONF="${CONTAINERS_CONF:-}"
  check "GET /healthz" check_healthz
  check "POST /v1/messages (JSON)" check_json_message
  check "POST /v1/messages (stream)" check_stream
  check "GET /metrics" check_metrics
  check "usage ledger in the data volume, report" check_ledger
  check "runs as uid 10001, not root" check_non_root
  check "read-only, no capabilities, no-new-privs" check_hardening
  check "C extensions active in the process" check_extensions
  check "no compiler in the runtime image" check_no_build_tools
  check "health check reports healthy" check_healthcheck
  check "image size" check_size

  # 2. a config mounted as the kubelet mounts a ConfigMap, with a slow alias for the drain
  CM_NAME=$RUN_ID-configmap
  CM_PORT=$(free_port)
  CM_DIR=$WORK/configmap
  mkdir -p "$CM_DIR"
  chmod 755 "$WORK" "$CM_DIR"
  # compose's config (the mock providers, listening on every interface) alone (no PostgreSQL, Redis or admin key)
  # with a slow alias; v2 adds one
  local v1=$WORK/gateway-v1.yaml
  "$TOOLS/bin/python" - deploy/config/gateway.yaml "$v1" "$WORK/gateway-v2.yaml" <<'EOF'
import sys
import yaml
source, v1, v2 = sys.argv[1:]
config = yaml.safe_load(open(source))
for shared in ("store", "limits", "admin"):  # compose's PostgreSQL, Redis and admin key: this container runs alone
    config.pop(shared, None)
config["server"]["drain_timeout_s"] = 30
config["providers"]["slow"] = {"kind": "mock", "deltas": 24, "event_delay_ms": 150}
config["models"] = {"claude-slow": {"targets": [{"provider": "slow"}]}, **config["models"]}
yaml.safe_dump(config, open(v1, "w"), sort_keys=False)
config["models"] = {"claude-reloaded": {"targets": [{"provider": "demo"}]}, **config["models"]}
yaml.safe_dump(config, open(v2, "w"), sort_keys=False)
EOF
  configmap_write "$CM_DIR" "$v1"
  step "run: ConfigMap-style mount (..data symlink)" run_container "$CM_NAME" "$CM_PORT" \
    -v "$CM_DIR:/etc/messages-gateway:ro"
  step "wait for /healthz" wait_healthz "$CM_PORT" "$CM_NAME"
  export CM_NAME CM_PORT CM_DIR
  check "config reload on a ..data symlink swap" check_reload
  check "stream in flight finishes during stop, exit 0" check_drain

  # 3. compose.yaml's replicated shape: PostgreSQL, Redis, two gateways, Prometheus with the admin key
  check "compose file: loopback ports, pass-through env" check_compose
  step "compose: the services' images" service_images
  COMPOSE_PROJECT=$RUN_ID-compose
  GATEWAY_PORT=$(free_port)
  GATEWAY_2_PORT=$(free_port)
  PROMETHEUS_PORT=$(free_port)
  GRAFANA_PORT=$(free_port)
  export COMPOSE_PROJECT GATEWAY_PORT GATEWAY_2_PORT PROMETHEUS_PORT GRAFANA_PORT CACHE KUBERNETES_VALIDATE
  step "compose: up postgres redis gateway gateway-2 prometheus" compose_up
  step "compose: wait for both gateways" compose_wait
  check "compose: 2 gateways, 1 ledger, 1 set of limits" check_compose_shared
  check "compose: /metrics needs the admin key" check_compose_metrics_auth
  check "compose: Prometheus scrapes both, bearer" check_compose_prometheus
  if [ "${MESSAGES_GATEWAY_KEEP:-0}" != 1 ]; then step "compose: down" compose_down; fi

  # 4. the Helm chart
  export TOOLS
  check "helm lint + template + validate --strict" check_chart

  summary
  if [ "$FAILED" != 0 ]; then
    echo "deploy/test-image.sh: $FAILED checks FAILED" >&2
    exit 1
  fi
}

tools_venv() {
  if ! "$TOOLS/bin/python" -c 'import kubernetes_validate' 2>/dev/null \
    || [ "$(cat "$TOOLS/.spec" 2>/dev/null)" != "$KUBERNETES_VALIDATE" ]; then
    rm -rf "$TOOLS"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q "$KUBERNETES_VALIDATE" 2>&1 | grep -v 'is ignored' || true
    "$TOOLS/bin/python" -c 'import kubernetes_validate'
    echo "$KUBERNETES_VALIDATE" >"$TOOLS/.spec"
  fi
  "$TOOLS/bin/kubernetes-validate" --version
}

main

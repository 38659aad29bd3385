"""The Helm chart (deploy/helm/messages-gateway), rendered by a real helm for each values file it ships: `helm lint
--strict` passes, and what it renders runs right. More than one pod shares a PostgreSQL ledger and Redis limits;
every pod with a read-only root mounts the ledger's data directory writable; the grace period covers the preStop
sleep and the drain; with an admin key the ServiceMonitor sends it to /metrics, from the same Secret; replicas have
a PodDisruptionBudget they can satisfy; the rendered gateway.yaml passes the gateway's own config parser. Shapes
that would run wrong are refused by `helm template`, each with the value to change.

helm comes from ``MESSAGES_GATEWAY_HELM``, the PATH, or the cache ``deploy/helm/get-helm.sh`` installs it into. Where
there is none the tests skip, unless ``MESSAGES_GATEWAY_REQUIRE_HELM=1`` (as .ci/run sets after get-helm.sh) makes
that a failure. The strict schema validation of the same renders (kubernetes-validate) is deploy/test-chart.sh's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.settings import Settings, parse_settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "messages-gateway"
VALUES = {"single": [], "replicated": ["-f", str(CHART / "values-replicated.yaml")]}
DATA_DIR = "/var/lib/messages-gateway"
HELM_VERSION = re.search(r"^HELM_VERSION=(\S+)", (CHART.parent / "get-helm.sh").read_text(), re.MULTILINE)


def find_helm() -> str | None:
    if os.environ.get("MESSAGES_GATEWAY_HELM"):
        return os.environ["MESSAGES_GATEWAY_HELM"]
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    cache_dir = Path(
        os.environ.get("MESSAGES_GATEWAY_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "messages-gateway"
    )
    cached = cache_dir / f"helm-{HELM_VERSION.group(1) if HELM_VERSION else '?'}" / "helm"
    return str(cached) if os.access(cached, os.X_OK) else None


@pytest.fixture(scope="module")
def helm() -> str:
    found = find_helm()
    if found is None:
        if os.environ.get("MESSAGES_GATEWAY_REQUIRE_HELM") == "1":
            pytest.fail("helm is required here (MESSAGES_GATEWAY_REQUIRE_HELM=1) but none was found")
        pytest.skip("no helm (bash deploy/helm/get-helm.sh installs one, or set MESSAGES_GATEWAY_HELM)")
    return found


def template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, "template", "gw", str(CHART), *args], capture_output=True, text=True, timeout=60, check=False
    )


@cache
def _rendered(helm: str, shape: str) -> tuple[dict[str, Any], ...]:
    done = template(helm, *VALUES[shape])
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def rendered(helm: str, shape: str) -> list[dict[str, Any]]:
    return list(_rendered(helm, shape))


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs}


def settings_of(docs: list[dict[str, Any]]) -> Settings:
    """The rendered gateway.yaml through the gateway's own parser, every ${VAR} it names set to a stand-in."""
    text = one(docs, "ConfigMap")["data"]["gateway.yaml"]
    names = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    return parse_settings(text, source="gateway.yaml", environ={name: f"stand-in-{name.lower()}" for name in names})


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (gateway,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return gateway  # type: ignore[no-any-return]


def secret_env(docs: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Variable -> (Secret, key) for the container's secretKeyRef variables."""
    return {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container(docs)["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def max_pods(docs: list[dict[str, Any]]) -> int:
    hpa = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    return int(hpa[0]["spec"]["maxReplicas"]) if hpa else int(one(docs, "Deployment")["spec"]["replicas"])


def min_pods(docs: list[dict[str, Any]]) -> int:
    hpa = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    return int(hpa[0]["spec"]["minReplicas"]) if hpa else int(one(docs, "Deployment")["spec"]["replicas"])


@pytest.mark.parametrize("shape", VALUES)
def test_helm_lint_strict(helm: str, shape: str) -> None:
    done = subprocess.run(
        [helm, "lint", "--strict", str(CHART), *VALUES[shape]], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("shape", VALUES)
def test_rendered_config_parses_and_names_where_state_lives(helm: str, shape: str) -> None:
    docs = rendered(helm, shape)
    settings = settings_of(docs)
    assert settings.server.host == "0.0.0.0" and settings.server.port == 8080
    url = settings.store.resolved_url()
    if shape == "single":
        assert url == f"sqlite:///{DATA_DIR}/ledger.db"
        assert settings.limits is None or settings.limits.redis_url is None
    else:
        assert url.startswith("postgresql://") and "@" in url and ":" not in url.split("//")[1].split("@")[0]
        assert settings.limits is not None and settings.limits.redis_url is not None


@pytest.mark.parametrize("shape", VALUES)
def test_more_than_one_pod_shares_the_ledger_and_the_limits(helm: str, shape: str) -> None:
    docs = rendered(helm, shape)
    settings = settings_of(docs)
    if max_pods(docs) > 1 or settings.server.workers > 1:
        assert settings.limits is not None and settings.limits.redis_url, "counters per process"
    if max_pods(docs) > 1:
        assert settings.store.resolved_url().startswith("postgresql://"), "a ledger per pod"
        env = secret_env(docs)
        assert "PGPASSWORD" in env  # asyncpg reads it: the URL holds no password
        assert "${MESSAGES_GATEWAY_REDIS_PASSWORD}" in one(docs, "ConfigMap")["data"]["gateway.yaml"]
        assert "MESSAGES_GATEWAY_REDIS_PASSWORD" in env
        # the HPA owns the count: a replicas in the manifest would reset a scaled-out Deployment on every upgrade
        assert "HorizontalPodAutoscaler" in kinds(docs) and "replicas" not in one(docs, "Deployment")["spec"]
    assert max_pods(docs) == (10 if shape == "replicated" else 1)


@pytest.mark.parametrize("shape", VALUES)
def test_read_only_root_mounts_the_data_dir_and_tmp(helm: str, shape: str) -> None:
    docs = rendered(helm, shape)
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    pods += [d["spec"] for d in docs if d["kind"] == "Pod"]
    for pod in pods:
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
            if c["name"] != "gateway":
                continue  # the `helm test` pod runs no gateway: it writes nothing
            for path in (DATA_DIR, "/tmp", "/etc/messages-gateway"):
                assert path in mounts, (c["name"], path)
                assert mounts[path]["name"] in volumes
            assert not mounts[DATA_DIR].get("readOnly") and not mounts["/tmp"].get("readOnly")
            config = mounts["/etc/messages-gateway"]
            assert config["readOnly"] is True and "subPath" not in config  # subPath mounts never update
            assert {"name": "MESSAGES_GATEWAY_DATA_DIR", "value": DATA_DIR} in c["env"]
    deployment = one(docs, "Deployment")
    data = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}["data"]
    if shape == "single":  # the SQLite ledger outlives the pod, on a ReadWriteOnce claim: no two pods at once
        claim = one(docs, "PersistentVolumeClaim")
        assert data["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    else:
        assert "emptyDir" in data
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


@pytest.mark.parametrize("shape", VALUES)
def test_grace_period_covers_prestop_and_drain(helm: str, shape: str) -> None:
    docs = rendered(helm, shape)
    settings = settings_of(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (sleep,) = [int(a) for a in container(docs)["lifecycle"]["preStop"]["exec"]["command"] if a.isdigit()]
    assert settings.server.drain_timeout_s == 30 and sleep == 5
    assert pod["terminationGracePeriodSeconds"] > sleep + settings.server.drain_timeout_s
    assert pod["terminationGracePeriodSeconds"] == (40 if shape == "single" else 45)


@pytest.mark.parametrize("shape", VALUES)
def test_admin_key_is_the_servicemonitor_bearer(helm: str, shape: str) -> None:
    docs = rendered(helm, shape)
    settings = settings_of(docs)
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"].get("annotations", {})
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    if not settings.admin.keys:
        assert shape == "single" and not monitors
        assert annotations["prometheus.io/scrape"] == "true"  # /metrics is open: annotation discovery works
        return
    assert settings.admin.keys == ["stand-in-messages_gateway_admin_key"]
    secret = secret_env(docs)["MESSAGES_GATEWAY_ADMIN_KEY"]
    (monitor,) = monitors
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["port"] == "http"
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": secret[0], "key": secret[1]}}
    # annotation discovery cannot send the bearer: no annotations that would only ever scrape 401s
    assert "prometheus.io/scrape" not in annotations


@pytest.mark.parametrize("shape", VALUES)
def test_disruption_budget_for_replicas_only(helm: str, shape: str) -> None:
    docs = rendered(helm, shape)
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    if max_pods(docs) == 1:
        assert not pdbs  # minAvailable 1 of 1 pod would block every node drain
        return
    (pdb,) = pdbs
    assert 1 <= pdb["spec"]["minAvailable"] < min_pods(docs)
    assert pdb["spec"]["selector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert one(docs, "Service")["spec"]["selector"] == pdb["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("shape", VALUES)
def test_probes_resources_non_root_and_secrets(helm: str, shape: str) -> None:
    docs = rendered(helm, shape)
    c = container(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["automountServiceAccountToken"] is False
    assert c["envFrom"] == [{"secretRef": {"name": "messages-gateway-credentials", "optional": False}}]
    # no secret is ever rendered: only references to Secrets the operator made
    assert "Secret" not in kinds(docs)
    config = {v["name"]: v for v in pod["volumes"]}["config"]
    assert config["configMap"]["name"] == one(docs, "ConfigMap")["metadata"]["name"]
    assert c["args"] == ["serve", "--config", "/etc/messages-gateway/gateway.yaml"]


REFUSED = [
    (["--set", "replicaCount=2"], "2 pods with store.type sqlite"),
    (["--set", "autoscaling.enabled=true"], "10 pods with store.type sqlite"),
    (
        ["--set", "replicaCount=3,store.type=postgresql,store.postgresql.host=db,store.postgresql.existingSecret=pg"],
        "3 pods without limits.redis.host",
    ),
    (["-f", str(CHART / "values-replicated.yaml"), "--set", "limits.redis.host="], "without limits.redis.host"),
    (["-f", str(CHART / "values-replicated.yaml"), "--set", "store.type=sqlite"], "store.type sqlite"),
    (["--set", "store.type=postgresql", "--set", "store.postgresql.host=db"], "store.postgresql.existingSecret"),
    (["--set", "server.terminationGracePeriodSeconds=35"], "must exceed server.preStopSleepSeconds"),
    (["--set", "server.drainTimeoutSeconds=120", "--set", "server.terminationGracePeriodSeconds=60"], "125"),
    (["--set", "podDisruptionBudget.enabled=true"], "node drains would hang"),
    (["--set", "server.workers=2", "--set", "config.limits.requests_per_minute=10"], "each worker would count"),
    (["--set", "config.store.url=sqlite:///x.db"], "config.store.url is the chart's"),
    (["--set", "config.limits.redis_url=redis://r"], "config.limits.redis_url is the chart's"),
    (["--set", "config.admin.keys[0]=k"], "config.admin is the chart's"),
    (["--set", "config.server.drain_timeout_s=5"], "server.drainTimeoutSeconds"),
    (["--set", "store.tpye=postgresql"], "additional properties 'tpye' not allowed"),  # values.schema.json
    (["--set", "store.type=mysql"], "value must be one of"),
]


@pytest.mark.parametrize(("args", "message"), REFUSED, ids=[" ".join(a[-1:]) for a, _ in REFUSED])
def test_shapes_that_would_run_wrong_are_refused(helm: str, args: list[str], message: str) -> None:
    done = template(helm, *args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_drain_period_moves_the_grace_period_and_workers_with_redis(helm: str) -> None:
    docs = [
        d
        for d in yaml.safe_load_all(
            template(
                helm,
                *VALUES["replicated"],
                *("--set", "server.drainTimeoutSeconds=90", "--set", "server.terminationGracePeriodSeconds=null"),
                *("--set", "server.workers=2", "--set", "limits.redis.tls=true", "--set", "limits.redis.username=gw"),
                *("--set", "store.postgresql.sslmode=require"),
            ).stdout
        )
        if d
    ]
    settings = settings_of(docs)
    assert settings.server.drain_timeout_s == 90 and settings.server.workers == 2
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 5 + 90 + 5
    assert settings.limits is not None and settings.limits.redis_url is not None
    assert settings.limits.redis_url.startswith("rediss://gw:stand-in-messages_gateway_redis_password@")
    assert settings.store.resolved_url().endswith("/gateway?sslmode=require")


def test_roll_on_config_change_and_persistence_off(helm: str) -> None:
    done = template(helm, "--set", "rollOnConfigChange=true", "--set", "store.sqlite.persistence.enabled=false")
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    deployment = one(docs, "Deployment")
    assert re.fullmatch(r"[0-9a-f]{64}", deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])
    assert "PersistentVolumeClaim" not in kinds(docs)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["data"]
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"

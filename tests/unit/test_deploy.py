"""The deploy/ manifests: kustomize renders them (or, without kubectl, they parse) with the fields operators
rely on; the container and compose files name the documented paths and probes."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

from gateway.settings import parse_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl:
        out = subprocess.run(
            [kubectl, "kustomize", str(DEPLOY / "kubernetes")], capture_output=True, text=True, check=True
        ).stdout
        return [d for d in yaml.safe_load_all(out) if d]
    kustomization = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]
    return docs


def test_kustomize_renders_every_kind() -> None:
    kinds = {d["kind"] for d in rendered()}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"} <= kinds
    if shutil.which("kubectl"):
        assert "ConfigMap" in kinds


def test_deployment_probes_resources_grace_and_secrets() -> None:
    (deployment,) = [d for d in rendered() if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] in ("gateway", "messages-gateway")]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    config = parse_settings(
        (DEPLOY / "kubernetes" / "gateway.yaml").read_text(), environ={"ANTHROPIC_API_KEY": "x", "GATEWAY_API_KEY": "y"}
    )
    assert pod["terminationGracePeriodSeconds"] > config.server.drain_timeout_s
    secret_refs = [e for e in container.get("envFrom", []) if "secretRef" in e] + [
        e for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert secret_refs
    assert pod["securityContext"].get("runAsNonRoot") or container["securityContext"].get("runAsNonRoot")


def test_dockerfile_and_compose() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "HEALTHCHECK" in dockerfile and "/healthz" in dockerfile and "USER" in dockerfile
    assert "/etc/messages-gateway/gateway.yaml" in dockerfile
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert {"gateway", "prometheus", "grafana"} <= set(compose["services"])
    parse_settings((DEPLOY / "config" / "gateway.yaml").read_text(), environ={})


def test_deployment_leaves_replicas_to_the_hpa() -> None:
    docs = rendered()
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "messages-gateway"}
    assert deployment["metadata"]["name"] == "messages-gateway"
    # every `kubectl apply -k` would reset a scaled-out Deployment to the manifest's count
    assert "replicas" not in deployment["spec"]


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in [str(k), *strings(v)]]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return [node] if isinstance(node, str) else []


def test_compose_binds_loopback_and_suits_podman_compose() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            # an open gateway, Grafana's admin/admin and Prometheus' /-/quit stay on this machine
            assert str(port).startswith("127.0.0.1:"), (name, port)
    # podman-compose 1.0.3 passes ${VAR:-} (an empty default) through literally: plain ${VAR} or none
    assert not [s for s in strings(compose) if re.search(r"\$\{[^}]*-\}", s)]
    gateway = compose["services"]["gateway"]
    # provider credentials and keys pass through from the shell (unset there: unset in the container)
    assert gateway["environment"]["GATEWAY_API_KEY"] is None
    assert gateway["environment"]["ANTHROPIC_API_KEY"] is None
    # the image's HEALTHCHECK again (an OCI-format build, podman-compose build's, drops it): the same probe
    kind, command = gateway["healthcheck"]["test"]
    probe = re.compile(r"import sys, urllib\.request; [^\"]*")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert kind == "CMD-SHELL" and "http://127.0.0.1:8080/healthz" in command
    assert probe.findall(command) == probe.findall(dockerfile.split("HEALTHCHECK", 1)[1])[:1]


def test_dockerfile_builds_offline_pinned_and_slim() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    # a `# syntax=` directive makes BuildKit pull a frontend image: offline builders fail on it
    assert not re.search(r"^#\s*syntax\s*=", dockerfile, re.MULTILINE | re.IGNORECASE)
    assert "COPY requirements/constraints.txt" in dockerfile
    assert re.search(r"pip install -c requirements/constraints\.txt \"\$\(ls /wheels/", dockerfile)
    # uid 10001 is above SYS_UID_MAX: a --system account warns
    (useradd,) = re.findall(r"useradd[^\n]*(?:\\\n[^\n]*)*", dockerfile)
    assert "--uid 10001" in useradd and "--system" not in useradd
    # what the runtime never runs leaves the venv in the builder stage, before the copy
    builder, runtime = dockerfile.split("AS runtime")
    assert re.search(r"pip uninstall -q -y faker polyfactory", builder)
    assert re.search(r"pip uninstall -q -y pip setuptools", builder)
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime and "gcc" not in runtime
    # the usage ledger's default SQLite file lives in a volume owned by the gateway's user
    assert 'VOLUME ["/var/lib/messages-gateway"]' in runtime
    assert "MESSAGES_GATEWAY_DATA_DIR=/var/lib/messages-gateway" in runtime
    assert "[postgres]" in dockerfile


def test_constraints_pin_every_dependency_within_pyproject() -> None:
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, version = line.split("==")
            pins[canonical(name)] = version
    wanted = [Requirement(r) for r in pyproject["dependencies"] + pyproject["optional-dependencies"]["test"]]
    for requirement in wanted:
        name = canonical(requirement.name)
        assert name in pins, f"{requirement.name} is not pinned: regenerate requirements/constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (str(requirement), pins[name])
    assert "messages-gateway" not in pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

"""The deploy/ manifests: kustomize renders them (or, without kubectl, they parse) with the fields operators
rely on; the container and compose files name the documented paths and probes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from gateway.settings import parse_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


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

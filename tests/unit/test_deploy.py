"""The deploy/ files: the container and compose files name the documented paths and probes, and compose runs the
replicated shape (two gateways, one PostgreSQL ledger, one Redis). The Helm chart's renders are
tests/unit/test_deploy_chart.py's; deploy/test-image.sh runs the image and the compose stack for real."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from gateway.settings import parse_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def test_dockerfile_and_compose() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "HEALTHCHECK" in dockerfile and "/healthz" in dockerfile and "USER" in dockerfile
    assert "/etc/messages-gateway/gateway.yaml" in dockerfile
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert {"gateway", "gateway-2", "postgres", "redis", "prometheus", "grafana"} <= set(compose["services"])
    config = parse_settings((DEPLOY / "config" / "gateway.yaml").read_text(), environ={"REDIS_PASSWORD": "x"})
    # both gateways: one ledger, one set of counters, and /metrics behind the admin key Prometheus sends
    assert config.store.url.startswith("postgresql://") and "@postgres:" in config.store.url
    assert config.limits.redis_url == "redis://:x@redis:6379/0"
    assert config.admin.keys
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "messages-gateway"]
    assert job["authorization"]["credentials_file"] == "/etc/prometheus/gateway-admin-key"
    assert sorted(job["static_configs"][0]["targets"]) == ["gateway-2:8080", "gateway:8080"]
    import hashlib

    key = (DEPLOY / "prometheus" / "gateway-admin-key").read_text().strip()
    assert [k.key_sha256 for k in config.admin.keys] == [hashlib.sha256(key.encode()).hexdigest()]


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
    assert "[postgres]" in dockerfile  # the ledger on PostgreSQL (OTLP over http/protobuf needs nothing more)


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

"""``/metrics`` passes ``promtool check metrics``, and a real Prometheus server scrapes the gateway and answers
PromQL with the exact token counts. Both need the Debian ``prometheus`` package (``.ci/run`` installs it and
sets MESSAGES_GATEWAY_REQUIRE_PROMETHEUS=1, so there they cannot be skipped)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI, final_message

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("MESSAGES_GATEWAY_REQUIRE_PROMETHEUS"):
            pytest.fail(f"{tool} is not installed")
        pytest.skip(f"{tool} is not installed (Debian package prometheus)")
    return path


def traffic(gw: RunningGateway) -> dict[str, Any]:
    client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
    with client.messages.stream(model="fake-text", **KW) as stream:
        stream.get_final_message()
    client.messages.create(model="fake-tools", **KW)
    for model in ("fake-status-529", "fake-error-midstream"):
        httpx.post(f"{gw.url}/v1/messages", json={"model": model, "stream": True, **KW})
    return final_message("fake-text")["usage"]


def config(fake: FakeClaudeAPI) -> str:
    return f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 2, base_delay_s: 0}}}}
providers:
  c1: {{kind: anthropic, api_key: p, base_url: "{fake.base_url}"}}
  c2: {{kind: anthropic, api_key: p, base_url: "{fake.base_url}"}}
models:
  fake-text: {{targets: [{{provider: c1, model: fake-text}}, {{provider: c2, model: fake-text}}]}}
  "*": {{targets: [{{provider: c1}}, {{provider: c2}}]}}
pricing: {{"fake-*": {{input: 3, output: 15}}}}
"""


def test_metrics_pass_promtool(fake: FakeClaudeAPI) -> None:
    promtool = need("promtool")
    with run_gateway(config(fake)) as gw:
        traffic(gw)
        text = httpx.get(f"{gw.url}/metrics").text
    assert "gateway_fallbacks_total" in text and "gateway_cost_usd_total" in text
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_a_real_prometheus_scrapes_exact_token_counts(fake: FakeClaudeAPI, tmp_path: Path) -> None:
    prometheus = need("prometheus")
    with run_gateway(config(fake)) as gw:
        usage = traffic(gw)
        target = gw.url.removeprefix("http://")
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s}\n"
            f"scrape_configs: [{{job_name: gateway, static_configs: [{{targets: ['{target}']}}]}}]\n"
        )
        port = _free_port()
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            query = 'sum(gateway_tokens_total{model="fake-text",type="output"})'
            value = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    result = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": query}).json()
                    series = result["data"]["result"]
                    if series:
                        value = float(series[0]["value"][1])
                        break
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                time.sleep(0.3)
            assert value == usage["output_tokens"]
            up = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}).json()
            assert up["data"]["result"][0]["value"][1] == "1"
        finally:
            proc.terminate()
            proc.wait(10)

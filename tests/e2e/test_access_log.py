"""One structured JSON access-log line per request: ids, route, status, outcome, timings, the four token
counts, attempts — and never the prompt or a key."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
import pytest

from tests.conftest import RunningGateway, access_lines
from tests.fakes.claude_api import FakeClaudeAPI, final_message

SECRET_PROMPT = "the launch code is 0000"
KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": SECRET_PROMPT}]}


def lines(caplog: pytest.LogCaptureFixture, request_id: str) -> list[dict[str, Any]]:
    return access_lines(caplog, request_id, settle_s=0)


def test_one_line_per_streamed_request(
    fake: FakeClaudeAPI, gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    resp = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": "fake-text", "stream": True, **KW},
        headers={"x-api-key": "gw-key-1"},
    )
    found = lines(caplog, resp.headers["request-id"])
    assert len(found) == 1
    line = found[0]
    usage = final_message("fake-text")["usage"]
    assert line["alias"] == "*" and line["provider"] == "claude" and line["model"] == "fake-text"
    assert (line["status"], line["outcome"], line["attempts"]) == (200, "completed", 1)
    assert line["input_tokens"] == usage["input_tokens"] and line["output_tokens"] == usage["output_tokens"]
    assert line["cache_read_input_tokens"] == usage["cache_read_input_tokens"]
    assert line["ttft_ms"] is not None and line["duration_ms"] >= line["ttft_ms"]
    everything = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET_PROMPT not in everything and "gw-key-1" not in everything and "provider-key" not in everything


def test_rejected_and_failed_requests_are_logged_too(
    fake: FakeClaudeAPI, gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    denied = httpx.post(f"{gateway.url}/v1/messages", json={"model": "fake-text", **KW}, headers={"x-api-key": "nope"})
    failed = httpx.post(
        f"{gateway.url}/v1/messages", json={"model": "fake-status-529", **KW}, headers={"x-api-key": "gw-key-1"}
    )
    (denied_line,) = lines(caplog, denied.headers["request-id"])
    (failed_line,) = lines(caplog, failed.headers["request-id"])
    assert (denied_line["status"], denied_line["outcome"]) == (401, "rejected")
    assert (failed_line["status"], failed_line["outcome"], failed_line["attempts"]) == (529, "upstream_error", 1)
    assert "nope" not in json.dumps(denied_line)


PLANTED = "sk-planted-secret-do-not-log-7f3a"


def test_a_line_for_each_outcome_and_the_planted_secret_never_appears(
    fake: FakeClaudeAPI, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.conftest import run_gateway

    caplog.set_level(logging.INFO)
    yaml = f"""
resilience: {{retry: {{max_attempts: 1}}, timeouts: {{total_s: 5}}}}
auth: {{keys: [gw-key]}}
providers:
  c1: {{kind: anthropic, api_key: "{PLANTED}", base_url: "{fake.base_url}", read_timeout_s: 0.02}}
  c2: {{kind: anthropic, api_key: "{PLANTED}", base_url: "{fake.base_url}"}}
  silent: {{kind: mock, first_event_delay_ms: 3000}}
models:
  timing-out: {{targets: [{{provider: c1, model: fake-slow}}]}}
  silent: {{targets: [{{provider: silent}}]}}
  "*": {{targets: [{{provider: c2}}]}}
"""
    auth = {"x-api-key": "gw-key"}
    with run_gateway(yaml) as gw:
        url = f"{gw.url}/v1/messages"
        httpx.post(url, json={"model": "fake-text", "stream": True, **KW}, headers=auth)  # completed
        httpx.post(url, json={"model": "fake-text", **KW}, headers={"x-api-key": PLANTED})  # rejected
        httpx.post(url, json={"model": "fake-status-500", **KW}, headers=auth)  # upstream_error
        httpx.post(url, json={"model": "timing-out", "stream": True, **KW}, headers=auth)  # timeout (idle gap)
        with (
            httpx.Client() as client,
            client.stream("POST", url, json={"model": "fake-slow", "stream": True, **KW}, headers=auth) as resp,
        ):
            for line in resp.iter_lines():
                if line.startswith("event: content_block_delta"):
                    break  # client_cancelled
        deadline = time.monotonic() + 5
        outcomes: set[str] = set()
        while time.monotonic() < deadline:
            outcomes = {json.loads(r.getMessage())["outcome"] for r in caplog.records if r.name == "gateway.access"}
            if {"completed", "rejected", "upstream_error", "timeout", "client_cancelled"} <= outcomes:
                break
            time.sleep(0.05)
        assert {"completed", "rejected", "upstream_error", "timeout", "client_cancelled"} <= outcomes
    everything = "\n".join(r.getMessage() for r in caplog.records) + caplog.text
    assert PLANTED not in everything and SECRET_PROMPT not in everything


def test_invalid_stream_outcome_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A provider whose stream breaks the protocol (a delta for a block that never started)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.conftest import run_gateway

    body = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":"message","role":'
        b'"assistant","model":"x","content":[],"stop_reason":null,"stop_sequence":null,'
        b'"usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":3,'
        b'"delta":{"type":"text_delta","text":"hi"}}\n\n'
    )

    class Broken(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    caplog.set_level(logging.INFO, logger="gateway.access")
    yaml = f"""
auth: {{open: true}}
providers: {{b: {{kind: anthropic, api_key: p, base_url: "http://127.0.0.1:{server.server_port}"}}}}
models: {{"*": {{targets: [{{provider: b}}]}}}}
"""
    try:
        with run_gateway(yaml) as gw:
            resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "broken", "stream": True, **KW})
            assert resp.text.rstrip().split("\n")[-1].startswith('data: {"type":"error"')
            deadline = time.monotonic() + 5
            found: list[dict[str, Any]] = []
            while not found and time.monotonic() < deadline:
                found = [
                    json.loads(r.getMessage())
                    for r in caplog.records
                    if r.name == "gateway.access" and '"model":"broken"' in r.getMessage()
                ]
                time.sleep(0.02)
            assert [line["outcome"] for line in found] == ["invalid_stream"]
            assert found[0]["input_tokens"] == 5
    finally:
        server.shutdown()


def test_the_line_names_the_principal_by_its_key_name(
    fake: FakeClaudeAPI, gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """The request's context carries who sent it: the access line names the client key (its name from the
    config, never the key) for both Messages-shaped routes, and "" when no key authenticated the request."""
    caplog.set_level(logging.INFO, logger="gateway.access")
    ok = httpx.post(f"{gateway.url}/v1/messages", json={"model": "fake-text", **KW}, headers={"x-api-key": "gw-key-1"})
    counted = httpx.post(
        f"{gateway.url}/v1/messages/count_tokens",
        json={"model": "fake-text", "messages": KW["messages"]},
        headers={"x-api-key": "gw-key-1"},
    )
    denied = httpx.post(f"{gateway.url}/v1/messages", json={"model": "fake-text", **KW}, headers={"x-api-key": "nope"})
    assert (ok.status_code, counted.status_code, denied.status_code) == (200, 200, 401)
    names = [lines(caplog, r.headers["request-id"])[0]["key"] for r in (ok, counted, denied)]
    assert names == ["key-1", "key-1", ""]  # gw-key-1 is the first of `auth.keys`: named key-1
    second = httpx.post(
        f"{gateway.url}/v1/messages", json={"model": "fake-text", **KW}, headers={"authorization": "Bearer gw-key-2"}
    )
    assert lines(caplog, second.headers["request-id"])[0]["key"] == "key-2"


def test_a_refusal_names_the_limit_that_refused_it(fake: FakeClaudeAPI, caplog: pytest.LogCaptureFixture) -> None:
    """Each limit that can refuse a request, named on its access line as its rule's scope and the limit's kind
    (what ``gateway_limited_total`` counts by ``limit`` and ``scope``); a request no limit refused has ``""``."""
    from tests.conftest import run_gateway

    caplog.set_level(logging.INFO, logger="gateway.access")
    yaml = f"""
auth:
  keys:
    - {{name: rpm, key: sk-rpm, limits: {{requests_per_minute: 1}}}}
    - {{name: tpm, key: sk-tpm, team: chatty}}
    - {{name: spender, key: sk-spender, limits: {{budget: {{usd: 0.000001, per: day}}}}}}
    - {{name: member, key: sk-member, team: frugal}}
    - {{name: busy, key: sk-busy, limits: {{max_inflight: 1}}}}
teams:
  chatty: {{limits: {{tokens_per_minute: 1}}}}
  frugal: {{limits: {{budget: {{usd: 0.000001, per: week}}}}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
pricing:
  "fake-*": {{input: 3, output: 15}}
"""

    def post(key: str, model: str = "fake-text") -> httpx.Response:
        return httpx.post(f"{url}/v1/messages", json={"model": model, **KW}, headers={"x-api-key": key})

    with run_gateway(yaml) as gw:
        url = gw.url
        if time.time() % 60 > 50:  # each first request and its refusal within one minute window
            time.sleep(61 - time.time() % 60)
        refused: dict[str, str] = {}
        for key in ("sk-rpm", "sk-tpm", "sk-spender", "sk-member"):
            first = post(key)
            assert first.status_code == 200, first.text
            (line,) = lines(caplog, first.headers["request-id"])
            assert line["limit"] == ""  # admitted: no limit named
            second = post(key)
            assert second.status_code == 429, (key, second.text)
            (line,) = lines(caplog, second.headers["request-id"])
            assert (line["status"], line["outcome"]) == (429, "rejected")
            refused[key] = line["limit"]
        with (
            httpx.Client() as client,
            client.stream(
                "POST",
                f"{url}/v1/messages",
                json={"model": "fake-slow", "stream": True, **KW},
                headers={"x-api-key": "sk-busy"},
            ) as held,
        ):
            stream = held.iter_lines()  # kept: a generator dropped here would close the stream
            next(stream)  # in flight
            busy = post("sk-busy")
            assert busy.status_code == 429
            (line,) = lines(caplog, busy.headers["request-id"])
            refused["sk-busy"] = line["limit"]
    assert refused == {
        "sk-rpm": "key requests_per_minute",
        "sk-tpm": "team tokens_per_minute",
        "sk-spender": "key budget",
        "sk-member": "team budget",
        "sk-busy": "key max_inflight",
    }


def test_a_request_shed_at_the_servers_limit_names_it(caplog: pytest.LogCaptureFixture) -> None:
    """``server.max_inflight`` reached: the 529 it answers names ``server max_inflight``."""
    from tests.conftest import run_gateway

    caplog.set_level(logging.INFO, logger="gateway.access")
    yaml = """
server: {max_inflight: 1}
auth: {open: true}
providers: {slow: {kind: mock, deltas: 40, event_delay_ms: 50}}
models: {"*": {targets: [{provider: slow}]}}
"""
    with run_gateway(yaml) as gw:
        body = {"model": "m", "stream": True, **KW}
        with httpx.Client() as client, client.stream("POST", f"{gw.url}/v1/messages", json=body) as held:
            stream = held.iter_lines()
            next(stream)
            shed = httpx.post(f"{gw.url}/v1/messages", json=body)
            assert shed.status_code == 529
            (line,) = lines(caplog, shed.headers["request-id"])
    assert (line["outcome"], line["limit"]) == ("shed", "server max_inflight")

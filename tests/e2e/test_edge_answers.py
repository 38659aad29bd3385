"""Answers a client can act on, on every route: ``x-should-retry: false`` where retrying cannot help, Claude
Code's HEAD probes, one access line per request (method, path, session and agent ids) and one outcome where the
request has an alias, and one error boundary: whatever escapes becomes ``500 api_error`` in the envelope."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import RunningGateway, access_lines, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
AUTH = {"x-api-key": "gw-key-1"}


# --- x-should-retry: false on what retrying cannot fix -------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status"),
    [
        ("POST", "/v1/messages", {"model": "fake-text", **KW}, {"x-api-key": "wrong"}, 401),
        ("POST", "/v1/messages", {"model": "fake-text"}, AUTH, 400),
        ("POST", "/v1/messages/count_tokens", {"messages": []}, AUTH, 400),
        ("POST", "/v1/messages", {"model": "fake-status-400", **KW}, AUTH, 400),  # the provider's own 400
        ("POST", "/v1/messages", {"model": "fake-status-401", **KW}, AUTH, 401),
        ("GET", "/v1/messages", None, AUTH, 405),
        ("GET", "/v1/no-such-route", None, AUTH, 404),
        ("GET", "/v1/models", None, {"x-api-key": "wrong"}, 401),
        ("POST", "/v1/messages", {"model": "x" * 300_000, **KW}, AUTH, 413),
    ],
)
def test_errors_retrying_cannot_fix_say_so(
    gateway: RunningGateway,
    fake: FakeClaudeAPI,
    method: str,
    path: str,
    body: Any,
    headers: dict[str, str],
    status: int,
) -> None:
    """Claude Code retries a 401 with back-off for over two minutes unless the answer says not to."""
    resp = httpx.request(method, f"{gateway.url}{path}", json=body, headers=headers)
    assert resp.status_code == status
    assert resp.headers["x-should-retry"] == "false"
    assert resp.json()["type"] == "error" and resp.headers["request-id"]


@pytest.mark.parametrize("model", ["fake-status-429", "fake-status-500", "fake-status-529"])
def test_retryable_errors_do_not_say_false(gateway: RunningGateway, fake: FakeClaudeAPI, model: str) -> None:
    resp = httpx.post(f"{gateway.url}/v1/messages", json={"model": model, **KW}, headers=AUTH)
    assert resp.status_code >= 429 and resp.headers.get("x-should-retry") != "false"


# --- HEAD probes -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/api/hello"])
def test_claude_codes_start_up_probes_answer_200_with_no_body(gateway: RunningGateway, path: str) -> None:
    resp = httpx.head(f"{gateway.url}{path}")
    assert resp.status_code == 200 and resp.content == b"" and resp.headers["content-length"] == "0"


# --- one access line per request, on every route --------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "outcome"),
    [
        ("POST", "/v1/messages/count_tokens", {"model": "fake-text", "messages": KW["messages"]}, 200, "completed"),
        ("GET", "/v1/models", None, 200, "completed"),
        ("GET", "/v1/models/sonnet", None, 200, "completed"),
        ("GET", "/v1/models/no-such-model-at-all", None, 200, "completed"),  # the glob route serves any name
        ("GET", "/healthz", None, 200, "completed"),
        ("GET", "/metrics", None, 200, "completed"),
        ("GET", "/playground", None, 200, "completed"),
        ("GET", "/v1/gateway/status", None, 200, "completed"),
        ("GET", "/nowhere", None, 404, "rejected"),
        ("HEAD", "/", None, 200, "completed"),
        ("HEAD", "/api/hello", None, 200, "completed"),
        ("PUT", "/v1/messages/count_tokens", None, 405, "rejected"),
    ],
)
def test_every_route_leaves_one_access_line(
    gateway: RunningGateway,
    fake: FakeClaudeAPI,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    body: Any,
    status: int,
    outcome: str,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    headers = {**AUTH, "x-claude-code-session-id": "sess-42", "x-claude-code-agent-id": "agent-7"}
    resp = httpx.request(method, f"{gateway.url}{path}", json=body, headers=headers)
    assert resp.status_code == status
    (line,) = access_lines(caplog, resp.headers["request-id"])
    assert (line["method"], line["path"], line["status"], line["outcome"]) == (method, path, status, outcome)
    assert (line["session_id"], line["agent_id"]) == ("sess-42", "agent-7")
    assert {"request_id", "upstream_request_id", "alias", "provider", "model", "duration_ms", "attempts"} <= set(line)


def test_count_tokens_is_counted_and_logged_like_a_message(
    gateway: RunningGateway, fake: FakeClaudeAPI, caplog: pytest.LogCaptureFixture
) -> None:
    """25 count_tokens calls from one Claude Code /context used to leave no trace at all."""
    caplog.set_level(logging.INFO, logger="gateway.access")
    labels = {"alias": "sonnet", "provider": "claude", "model": "fake-text", "outcome": "completed"}
    before = gateway.sample("gateway_requests_total", **labels)
    tokens_before = gateway.sample(
        "gateway_tokens_total", alias="sonnet", provider="claude", model="fake-text", type="input"
    )
    ids = []
    for _ in range(3):
        resp = httpx.post(
            f"{gateway.url}/v1/messages/count_tokens",
            json={"model": "sonnet", "messages": KW["messages"]},
            headers=AUTH,
        )
        assert resp.status_code == 200 and resp.json()["input_tokens"] > 0
        ids.append(resp.headers["request-id"])
    for rid in ids:
        (line,) = access_lines(caplog, rid)
        assert (line["alias"], line["provider"], line["model"], line["outcome"]) == (
            "sonnet",
            "claude",
            "fake-text",
            "completed",
        )
        assert line["upstream_request_id"].startswith("req_fake_")
    assert gateway.sample("gateway_requests_total", **labels) == before + 3
    # what a count counts was not spent: no tokens recorded for it
    assert (
        gateway.sample("gateway_tokens_total", alias="sonnet", provider="claude", model="fake-text", type="input")
        == tokens_before
    )


def test_session_and_agent_ids_are_on_the_messages_line(
    gateway: RunningGateway, fake: FakeClaudeAPI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    headers = {**AUTH, "x-claude-code-session-id": "0b9c-session", "x-claude-code-agent-id": "sub-1"}
    resp = httpx.post(f"{gateway.url}/v1/messages", json={"model": "fake-text", "stream": True, **KW}, headers=headers)
    (line,) = access_lines(caplog, resp.headers["request-id"])
    assert (line["session_id"], line["agent_id"], line["method"], line["path"]) == (
        "0b9c-session",
        "sub-1",
        "POST",
        "/v1/messages",
    )
    plain = httpx.post(f"{gateway.url}/v1/messages", json={"model": "fake-text", **KW}, headers=AUTH)
    (line,) = access_lines(caplog, plain.headers["request-id"])
    assert (line["session_id"], line["agent_id"]) == ("", "")


# --- bad input never reaches a bare 500 -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_json_nested_200000_levels_deep_is_a_400_in_the_envelope(
    mock_gateway: RunningGateway, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """Before: RecursionError inside the parser, and uvicorn's plain-text 500 (no envelope, no line)."""
    caplog.set_level(logging.INFO, logger="gateway.access")
    body = b'{"model":"fake-text","max_tokens":5,"messages":[{"role":"user","content":' + b"[" * 200_000
    body += b"]" * 200_000 + b"}]}"
    resp = httpx.post(f"{mock_gateway.url}{path}", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert resp.json()["error"] == {
        "type": "invalid_request_error",
        "message": "request body is nested too deeply to decode",
    }
    (line,) = access_lines(caplog, resp.headers["request-id"])
    assert (line["status"], line["outcome"]) == (400, "rejected")


@pytest.fixture(scope="module")
def mock_gateway() -> Iterator[RunningGateway]:
    yaml = "auth: {open: true}\nproviders: {m: {kind: mock}}\nmodels: {fake-text: {targets: [{provider: m}]}}\n"
    with run_gateway(yaml) as gw:
        yield gw


@pytest.fixture
def broken_mock(monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningGateway]:
    """The mock provider with a bug: it raises RuntimeError — before answering, or after its stream started."""
    from adapters import mock

    async def complete(self: Any, request: Any, model: str) -> Any:
        raise RuntimeError("adapter bug")

    original = mock._MockStream.batches

    async def batches(self: Any) -> Any:
        n = 0
        async for batch in original(self):
            yield batch
            n += 1
            if n == 1:
                raise RuntimeError("adapter bug mid-stream")

    monkeypatch.setattr(mock.MockAdapter, "complete", complete)
    monkeypatch.setattr(mock._MockStream, "batches", batches)
    yaml = """
auth: {open: true}
providers: {m: {kind: mock, deltas: 5, event_delay_ms: 1}}
models: {buggy: {targets: [{provider: m}]}}
"""
    with run_gateway(yaml) as gw:
        yield gw


def test_an_exception_before_the_answer_is_a_500_api_error_in_the_envelope(
    broken_mock: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: uvicorn's plain-text 500, and an access line saying status 0, client_cancelled."""
    caplog.set_level(logging.INFO)
    resp = httpx.post(f"{broken_mock.url}/v1/messages", json={"model": "buggy", **KW})
    assert resp.status_code == 500 and resp.headers["content-type"] == "application/json"
    rid = resp.headers["request-id"]
    assert resp.json() == {
        "type": "error",
        "error": {"type": "api_error", "message": "internal gateway error"},
        "request_id": rid,
    }
    (line,) = access_lines(caplog, rid)
    assert (line["status"], line["outcome"]) == (500, "internal_error")
    tracebacks = [r for r in caplog.records if r.exc_info and "adapter bug" in str(r.exc_info[1])]
    assert len(tracebacks) == 1  # logged once, with its traceback
    labels = {"alias": "buggy", "provider": "m", "model": "", "outcome": "internal_error"}
    assert broken_mock.sample("gateway_requests_total", **labels) == 1


def test_an_exception_mid_stream_ends_it_with_an_error_event(
    broken_mock: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    resp = httpx.post(f"{broken_mock.url}/v1/messages", json={"model": "buggy", "stream": True, **KW})
    assert resp.status_code == 200
    names = [line[7:] for line in resp.text.split("\n") if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "error" and "message_stop" not in names
    assert '"type":"api_error"' in resp.text.rstrip().split("\n")[-1]
    (line,) = access_lines(caplog, resp.headers["request-id"])
    assert line["outcome"] == "internal_error"
    assert broken_mock.sample("gateway_inflight_requests") == 0


def test_an_exception_in_a_litestar_route_is_a_500_in_the_envelope(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.http import routes as api

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("route bug")

    monkeypatch.setattr(api, "_model_info", boom)
    caplog.set_level(logging.INFO)
    resp = httpx.get(f"{gateway.url}/v1/models", headers=AUTH)
    assert resp.status_code == 500 and resp.json()["error"]["type"] == "api_error"
    (line,) = access_lines(caplog, resp.headers["request-id"])
    assert (line["path"], line["status"], line["outcome"]) == ("/v1/models", 500, "internal_error")

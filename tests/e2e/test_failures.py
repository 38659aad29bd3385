"""Failures before and after the stream starts, client disconnects, and bad input."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import RunningGateway, claude_config, run_gateway, sdk_error
from tests.fakes.claude_api import FakeClaudeAPI

KW: dict[str, Any] = {"max_tokens": 1024, "messages": [{"role": "user", "content": "Hello"}]}
AUTH = {"x-api-key": "gw-key-1"}


def via(gw: RunningGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="gw-key-1", max_retries=0)


@pytest.mark.parametrize(
    ("model", "status", "exc", "etype"),
    [
        ("fake-status-400", 400, anthropic.BadRequestError, "invalid_request_error"),
        ("fake-status-401", 401, anthropic.AuthenticationError, "authentication_error"),
        ("fake-status-429", 429, anthropic.RateLimitError, "rate_limit_error"),
        ("fake-status-529", 529, anthropic.InternalServerError, "overloaded_error"),
        ("fake-status-500", 500, anthropic.InternalServerError, "api_error"),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
def test_upstream_status_before_the_stream(
    model: str, status: int, exc: type[Exception], etype: str, stream: bool, gateway: RunningGateway
) -> None:
    err = sdk_error(via(gateway), model, exc, stream=stream, **KW)
    assert err.status_code == status
    assert err.body["error"]["type"] == etype  # type: ignore[index]
    assert err.response.headers["request-id"]
    if status == 429:
        assert err.response.headers["retry-after"] == "7"
        assert err.response.headers["anthropic-ratelimit-requests-remaining"] == "0"


def test_error_event_mid_stream_reaches_the_sdk_as_an_error(gateway: RunningGateway) -> None:
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        via(gateway).messages.stream(model="fake-error-midstream", **KW) as stream,
    ):
        stream.get_final_message()
    assert info.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def read_stream(gw: RunningGateway, model: str) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/messages", json={"model": model, "stream": True, **KW}, headers=AUTH)


def test_error_event_mid_stream_is_terminal(gateway: RunningGateway) -> None:
    resp = read_stream(gateway, "fake-error-midstream")
    assert resp.status_code == 200
    assert resp.content.endswith(b"event: error\ndata: " + resp.content.rsplit(b"data: ", 1)[1])
    assert b"message_stop" not in resp.content and b"message_delta" not in resp.content


def test_upstream_cut_mid_stream_ends_with_error_never_message_stop(gateway: RunningGateway) -> None:
    before = gateway.sample("gateway_requests_total", alias="*", provider="claude", model="", outcome="upstream_error")
    resp = read_stream(gateway, "fake-cut-midstream")
    assert resp.status_code == 200
    last = resp.content.strip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"event: error\ndata: ")
    assert b'"type":"api_error"' in last
    assert b"message_stop" not in resp.content
    assert (
        gateway.sample("gateway_requests_total", alias="*", provider="claude", model="", outcome="upstream_error")
        == before + 1
    )
    with (
        pytest.raises(anthropic.APIStatusError),
        via(gateway).messages.stream(model="fake-cut-midstream", **KW) as stream,
    ):
        stream.get_final_message()


def test_client_disconnect_closes_upstream_and_records_partial_usage(
    fake: FakeClaudeAPI, gateway: RunningGateway
) -> None:
    """Under the gateway's server protocol, which tells the edge of the lost connection (a DisconnectHook)."""
    _disconnect_closes_upstream(fake, gateway)


def test_client_disconnect_is_seen_under_a_server_without_the_hook(fake: FakeClaudeAPI) -> None:
    """Under uvicorn's own httptools protocol the edge waits on receive() for the disconnect instead."""
    with run_gateway(claude_config(fake.base_url), http="httptools") as stock:
        _disconnect_closes_upstream(fake, stock)


def _disconnect_closes_upstream(fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    labels = {"alias": "*", "provider": "claude", "model": ""}  # a forwarded name is no label
    before = gateway.sample("gateway_requests_total", **labels, outcome="client_cancelled")
    input_before = gateway.sample("gateway_tokens_total", **labels, type="input")
    with (
        httpx.Client() as client,
        client.stream(
            "POST", f"{gateway.url}/v1/messages", json={"model": "fake-slow", "stream": True, **KW}, headers=AUTH
        ) as resp,
    ):
        seen = 0
        for line in resp.iter_lines():
            seen += line.startswith("event: content_block_delta")
            if seen == 3:
                break
    assert fake.wait_for_disconnect(timeout=5)
    deadline = time.monotonic() + 5
    while gateway.sample("gateway_requests_total", **labels, outcome="client_cancelled") == before:
        assert time.monotonic() < deadline, "client_cancelled outcome not recorded"
        time.sleep(0.02)
    assert gateway.sample("gateway_tokens_total", **labels, type="input") > input_before  # partial usage
    assert gateway.sample("gateway_inflight_requests") == 0


@pytest.mark.parametrize(
    ("body", "status", "etype", "fragment"),
    [
        (b"{not json", 400, "invalid_request_error", "not valid JSON"),
        (b"[]", 400, "invalid_request_error", "Expected `object`"),
        (b'{"max_tokens": 5, "messages": []}', 400, "invalid_request_error", "model"),
        (b'{"model": "fake-text", "max_tokens": "5", "messages": []}', 400, "invalid_request_error", "max_tokens"),
        (b'{"model": "fake-text", "max_tokens": 5, "messages": "hi"}', 400, "invalid_request_error", "messages"),
        (
            b'{"model": "fake-text", "max_tokens": 5, "messages": [{"role": "user"}]}',
            400,
            "invalid_request_error",
            "content",
        ),
        (b'{"model": "fake-text", "max_tokens": 0, "messages": []}', 400, "invalid_request_error", "max_tokens"),
        (
            b'{"model": "fake-text", "max_tokens": 5, "messages": [], "stream": "yes"}',
            400,
            "invalid_request_error",
            "stream",
        ),
        (b'{"model": "x", "pad": "' + b"a" * 300_000 + b'"}', 413, "request_too_large", "limit"),
    ],
)
def test_bad_input_gets_the_anthropic_envelope(
    body: bytes, status: int, etype: str, fragment: str, fake: FakeClaudeAPI, gateway: RunningGateway
) -> None:
    resp = httpx.post(f"{gateway.url}/v1/messages", content=body, headers=AUTH)
    assert resp.status_code == status
    payload = resp.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == etype
    assert fragment in payload["error"]["message"]
    assert payload["request_id"] == resp.headers["request-id"]
    assert fake.requests == []  # nothing reached the provider


def test_body_over_limit_without_content_length(gateway: RunningGateway) -> None:
    def chunks() -> Any:
        yield b'{"model": "x", "pad": "'
        for _ in range(30):
            yield b"a" * 10_000
        yield b'"}'

    resp = httpx.post(f"{gateway.url}/v1/messages", content=chunks(), headers=AUTH)
    assert resp.status_code == 413
    assert resp.json()["error"]["type"] == "request_too_large"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"x-api-key": "wrong"}, 401),
        ({"authorization": "Bearer wrong"}, 401),
        ({"authorization": "Bearer gw-key-2"}, 200),
        ({"x-api-key": "gw-key-1"}, 200),
    ],
)
def test_inbound_keys(headers: dict[str, str], status: int, gateway: RunningGateway) -> None:
    resp = httpx.post(f"{gateway.url}/v1/messages", json={"model": "fake-text", **KW}, headers=headers)
    assert resp.status_code == status
    if status == 401:
        assert resp.json()["error"]["type"] == "authentication_error"
        assert "gw-key" not in resp.text


def test_unknown_model_and_route_get_not_found() -> None:
    config = """
auth: {open: true}
providers: {demo: {kind: mock}}
models: {only: {targets: [{provider: demo}]}}
"""
    with run_gateway(config) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.NotFoundError) as info:
            client.messages.create(model="claude-nope", **KW)
        assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
        resp = httpx.get(f"{gw.url}/v1/nothing-here")
        assert resp.status_code == 404 and resp.json()["type"] == "error"
        with pytest.raises(anthropic.NotFoundError):
            client.models.retrieve("claude-nope")


def test_unreachable_provider_is_a_502_before_the_stream() -> None:
    config = """
auth: {open: true}
providers: {dead: {kind: anthropic, api_key: k, base_url: "http://127.0.0.1:9", connect_timeout_s: 2}}
models: {"*": {targets: [{provider: dead}]}}
"""
    with run_gateway(config) as gw:
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "m", "stream": True, **KW})
        assert resp.status_code == 502
        assert resp.json()["error"]["type"] == "api_error"


def test_fallback_to_next_target_before_first_byte(fake: FakeClaudeAPI) -> None:
    config = f"""
auth: {{open: true}}
providers:
  dead: {{kind: anthropic, api_key: k, base_url: "http://127.0.0.1:9"}}
  claude: {{kind: anthropic, api_key: k, base_url: "{fake.base_url}"}}
models:
  m:
    targets:
      - {{provider: claude, model: fake-status-529}}
      - {{provider: dead}}
      - {{provider: claude, model: fake-text}}
"""
    with run_gateway(config) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
        with client.messages.stream(model="m", **KW) as stream:
            assert stream.get_final_message().content
        assert [r.json["model"] for r in fake.requests if r.json] == ["fake-status-529", "fake-text"]


def test_client_gone_during_the_request_body(gateway: RunningGateway, fake: FakeClaudeAPI) -> None:
    import socket

    before = gateway.sample("gateway_requests_total", alias="", provider="", model="", outcome="client_cancelled")
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: gw-key-1\r\ncontent-length: 1000\r\n\r\n{")
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while (
        gateway.sample("gateway_requests_total", alias="", provider="", model="", outcome="client_cancelled") == before
    ):
        assert time.monotonic() < deadline, "the abandoned request was not recorded"
        time.sleep(0.02)
    assert fake.requests == []


def test_other_methods_on_messages_get_405_in_the_envelope(gateway: RunningGateway) -> None:
    resp = httpx.get(f"{gateway.url}/v1/messages", headers=AUTH)
    assert resp.status_code == 405
    assert resp.headers["allow"] == "POST"
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert resp.json()["request_id"] == resp.headers["request-id"]

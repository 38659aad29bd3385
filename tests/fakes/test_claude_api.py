"""Self-test of the fake Claude API against the real ``anthropic`` SDK (no gateway involved)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from .claude_api import (
    DEFAULT_FIXTURE_DIR,
    REDACTED_THINKING_DATA,
    STATUS_SCENARIOS,
    STREAM_SCENARIOS,
    THINKING_SIGNATURE,
    FakeClaudeAPI,
    encode_event,
    final_message,
    get_scenario,
    sse_body,
)

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
COMPLETE = [n for n in STREAM_SCENARIOS if get_scenario(n).ending == "complete" and n != "fake-slow"]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeClaudeAPI]:
    with FakeClaudeAPI() as server:
        yield server


@pytest.fixture
def client(fake: FakeClaudeAPI) -> Iterator[anthropic.Anthropic]:
    fake.reset()
    with anthropic.Anthropic(base_url=fake.base_url, api_key="k", max_retries=0) as c:
        yield c


def _dump(message: Any) -> dict[str, Any]:
    # warnings=False: unknown block types are coerced into TextBlock, which makes pydantic's
    # serializer warn (an error under filterwarnings=error)
    return message.model_dump(warnings=False)  # type: ignore[no-any-return]


def _stream_final(client: anthropic.Anthropic, model: str) -> tuple[Any, list[str]]:
    with client.messages.stream(model=model, max_tokens=64, messages=MESSAGES) as stream:
        types: list[str] = [event.type for event in stream]
        return stream.get_final_message(), types


def _raw_post(
    fake: FakeClaudeAPI, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """POST with the stdlib client; returns (status, lower-cased headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    try:
        hdrs = {"content-type": "application/json", **(headers if headers is not None else {"x-api-key": "k"})}
        conn.request("POST", path, body=json.dumps(body), headers=hdrs)
        resp = conn.getresponse()
        resp_headers = {k.lower(): v for k, v in resp.getheaders()}
        try:
            data = resp.read()
        except http.client.IncompleteRead as exc:  # a cut stream
            data = exc.partial
        return resp.status, resp_headers, data
    finally:
        conn.close()


# -- streaming vs non-streaming ---------------------------------------------------------------


@pytest.mark.parametrize("model", COMPLETE)
def test_stream_accumulates_to_create(client: anthropic.Anthropic, model: str) -> None:
    streamed, types = _stream_final(client, model)
    created = client.messages.create(model=model, max_tokens=64, messages=MESSAGES)
    assert types[0] == "message_start"
    assert types[-1] == "message_stop"
    assert _dump(streamed) == _dump(created)
    assert created.id.startswith("msg_fake_")
    assert created.model == model
    assert created.stop_reason is not None
    raw = client.messages.with_raw_response.create(model=model, max_tokens=64, messages=MESSAGES)
    assert raw.http_response.json() == final_message(model)
    assert raw.http_response.headers["request-id"].startswith("req_fake_")
    assert raw.http_response.headers["anthropic-ratelimit-requests-limit"] == "4000"


@pytest.mark.parametrize("model", [*STREAM_SCENARIOS, "fake-text-d5"])
def test_raw_sse_bytes_and_headers(fake: FakeClaudeAPI, model: str) -> None:
    if model == "fake-slow":
        model = "fake-slow-d3"
    status, headers, body = _raw_post(fake, "/v1/messages", {"model": model, "max_tokens": 8, "stream": True})
    assert status == 200
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    assert headers["request-id"].startswith("req_fake_")
    assert body == sse_body(model)
    for frame in body.split(b"\n\n")[:-1]:
        event_line, data_line = frame.split(b"\n")
        name = event_line.removeprefix(b"event: ").decode()
        assert json.loads(data_line.removeprefix(b"data: "))["type"] == name
    if get_scenario(model).ending == "complete":
        assert body.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')


def test_one_chunk_per_frame(fake: FakeClaudeAPI) -> None:
    request = (
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: 43\r\n\r\n"
        b'{"model":"fake-text","stream":true,"x":"y"}'
    )
    with socket.create_connection(("127.0.0.1", fake.port), timeout=5) as sock:
        sock.sendall(request)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    chunks = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        chunks.append(rest[:size])
        rest = rest[size + 2 :]
    assert chunks == [encode_event(e) for e in get_scenario("fake-text").events]
    assert chunks[2] == b'event: ping\ndata: {"type": "ping"}\n\n'


def test_fixture_files_up_to_date() -> None:
    for name in STREAM_SCENARIOS:
        assert (DEFAULT_FIXTURE_DIR / f"{name}.sse").read_bytes() == sse_body(name), name


# -- scenario contents ------------------------------------------------------------------------


def test_text_usage_and_deltas(client: anthropic.Anthropic) -> None:
    message, types = _stream_final(client, "fake-text")
    assert types.count("text") == 8
    assert message.usage.cache_read_input_tokens == 1024
    assert message.usage.service_tier == "standard"
    message, types = _stream_final(client, "fake-text-d200")
    assert types.count("text") == 200
    assert message.content[0].type == "text"
    assert message.content[0].text.startswith("w0 w1 ")


def test_multibyte(client: anthropic.Anthropic) -> None:
    message, _ = _stream_final(client, "fake-text-multibyte")
    text = message.content[0].text
    for needle in ("Zürich", "こんにちは世界", "中文", "🌍🚀", "👨\u200d👩\u200d👧\u200d👦", "€½"):
        assert needle in text


def test_citations(client: anthropic.Anthropic) -> None:
    message, _ = _stream_final(client, "fake-citations")
    citations = [c for block in message.content if block.type == "text" for c in block.citations or []]
    assert [type(c).__name__ for c in citations] == [
        "CitationCharLocation",
        "CitationPageLocation",
        "CitationContentBlockLocation",
        "CitationsSearchResultLocation",
        "CitationsWebSearchResultLocation",
        "CitationCharLocation",
    ]
    assert citations[0].file_id is None
    deltas = [e for e in get_scenario("fake-citations").events if e.get("delta", {}).get("type") == "citations_delta"]
    assert all(set(e["delta"]) == {"type", "citation"} for e in deltas)


def test_tools(client: anthropic.Anthropic) -> None:
    message, _ = _stream_final(client, "fake-tools")
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
    tool_blocks = [b for b in message.content if b.type == "tool_use"]
    assert tool_blocks[0].input == {"location": "San Francisco, CA", "unit": "celsius", "days": [1, 2]}
    assert tool_blocks[1].input == {"timezone": "America/New_York", "verbose": False}
    assert all(isinstance(b.input, dict) for b in tool_blocks)
    assert all(b.caller is not None and b.caller.type == "direct" for b in tool_blocks)
    assert tool_blocks[0].id != tool_blocks[1].id
    first_fragments = [
        e["delta"]["partial_json"]
        for e in get_scenario("fake-tools").events
        if e.get("delta", {}).get("type") == "input_json_delta"
    ]
    assert first_fragments[0] == ""


def test_thinking(client: anthropic.Anthropic) -> None:
    message, _ = _stream_final(client, "fake-thinking")
    assert [b.type for b in message.content] == ["thinking", "redacted_thinking", "text"]
    thinking, redacted = message.content[0], message.content[1]
    assert thinking.type == "thinking"
    assert redacted.type == "redacted_thinking"
    assert thinking.signature == THINKING_SIGNATURE
    assert {"+", "/"} <= set(THINKING_SIGNATURE)
    assert THINKING_SIGNATURE.endswith("==")
    assert redacted.data == REDACTED_THINKING_DATA
    assert "12231" in thinking.thinking


def test_server_tools(client: anthropic.Anthropic) -> None:
    message, _ = _stream_final(client, "fake-server-tools")
    assert [b.type for b in message.content] == [
        "text",
        "server_tool_use",
        "web_search_tool_result",
        "text",
        "text",
        "text",
    ]
    assert message.content[1].type == "server_tool_use"
    assert message.content[1].input == {"query": "san francisco weather tomorrow"}
    result = message.content[2]
    assert result.type == "web_search_tool_result"
    assert isinstance(result.content, list)
    assert len(result.content) == 2
    cited = message.content[4]
    assert cited.type == "text"
    assert cited.citations is not None
    assert cited.citations[0].type == "web_search_result_location"
    assert message.usage.input_tokens == 10682  # overwritten by message_delta (2679 at start)
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_search_requests == 1


def test_unknown_event_and_block(client: anthropic.Anthropic) -> None:
    with client.messages.create(model="fake-unknown-event", max_tokens=8, messages=MESSAGES, stream=True) as s:
        types = [event.type for event in s]
    assert "future_event" in types  # SDK 2.14 hands unknown event names to the caller
    message, _ = _stream_final(client, "fake-unknown-event")
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello from the future"
    assert message.content[1].type == "future_block"
    assert len(message.content) == 2


# -- failures ---------------------------------------------------------------------------------


def test_error_midstream(client: anthropic.Anthropic) -> None:
    seen: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        client.messages.stream(model="fake-error-midstream", max_tokens=8, messages=MESSAGES) as stream,
    ):
        seen.extend(event.type for event in stream)
    exc = info.value
    assert type(exc) is anthropic.APIStatusError  # not OverloadedError: status is the stream's 200
    assert exc.status_code == 200
    assert exc.type == "overloaded_error"
    assert isinstance(exc.body, dict)
    assert exc.body["error"]["type"] == "overloaded_error"
    assert "content_block_delta" in seen
    assert "message_stop" not in seen
    with pytest.raises(anthropic.OverloadedError):
        client.messages.create(model="fake-error-midstream", max_tokens=8, messages=MESSAGES)


def test_cut_midstream(client: anthropic.Anthropic) -> None:
    seen: list[str] = []
    with (
        pytest.raises(Exception) as info,
        client.messages.stream(model="fake-cut-midstream", max_tokens=8, messages=MESSAGES) as stream,
    ):
        seen.extend(event.type for event in stream)
    assert "incomplete chunked read" in str(info.value)
    assert "content_block_delta" in seen
    assert "message_stop" not in seen
    with pytest.raises(anthropic.APIConnectionError):
        client.messages.create(model="fake-cut-midstream", max_tokens=8, messages=MESSAGES)


EXPECTED_CLASSES: dict[str, type[anthropic.APIStatusError]] = {
    "fake-status-400": anthropic.BadRequestError,
    "fake-status-401": anthropic.AuthenticationError,
    "fake-status-429": anthropic.RateLimitError,
    "fake-status-529": anthropic.OverloadedError,
    "fake-status-500": anthropic.InternalServerError,
    "fake-status-408": anthropic.RequestTimeoutError,
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", list(STATUS_SCENARIOS))
def test_status_scenarios(client: anthropic.Anthropic, model: str, stream: bool) -> None:
    status, error_type, message = STATUS_SCENARIOS[model]
    with pytest.raises(anthropic.APIStatusError) as info:
        if stream:
            with client.messages.stream(model=model, max_tokens=8, messages=MESSAGES) as s:
                s.get_final_message()
        else:
            client.messages.create(model=model, max_tokens=8, messages=MESSAGES)
    exc = info.value
    assert type(exc) is EXPECTED_CLASSES[model]
    assert exc.status_code == status
    assert exc.type == error_type
    assert exc.api_message == message
    assert exc.request_id is not None
    assert exc.request_id.startswith("req_fake_")
    assert isinstance(exc.body, dict)
    assert exc.body["request_id"] == exc.request_id
    headers = exc.response.headers
    if status == 429:
        assert headers["retry-after"] == "7"
        assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    if status == 529:
        assert headers["x-should-retry"] == "true"


def test_missing_auth(fake: FakeClaudeAPI) -> None:
    fake.reset()
    status, headers, body = _raw_post(fake, "/v1/messages", {"model": "fake-text", "max_tokens": 8}, headers={})
    assert status == 401
    payload = json.loads(body)
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "authentication_error"
    assert payload["request_id"] == headers["request-id"]
    assert len(fake.requests) == 1
    status, _, body = _raw_post(fake, "/v1/messages", {"model": "fake-text", "max_tokens": 8}, {"x-api-key": "k"})
    assert status == 200
    assert json.loads(body)["content"][0]["type"] == "text"
    beta_body = {"model": "fake-text", "max_tokens": 8, "stream": True}
    status, _, body = _raw_post(fake, "/v1/messages?beta=true", beta_body, {"authorization": "Bearer t"})
    assert status == 200
    assert body == sse_body("fake-text")
    assert fake.requests[-1].query == "beta=true"
    status, _, body = _raw_post(fake, "/v1/messages/count_tokens?beta=true", {"model": "m", "messages": []})
    assert status == 200
    assert json.loads(body) == {"input_tokens": len(fake.requests[-1].body) // 4 + 3}


def test_slow_disconnect(client: anthropic.Anthropic, fake: FakeClaudeAPI) -> None:
    started = time.monotonic()
    with client.messages.stream(model="fake-slow", max_tokens=8, messages=MESSAGES) as stream:
        for i, _event in enumerate(stream):
            if i >= 4:
                break
    assert fake.wait_for_disconnect(timeout=5)
    assert fake.disconnects == 1
    assert time.monotonic() - started < 3


def test_slow_non_stream_timeout(fake: FakeClaudeAPI) -> None:
    fake.reset()
    with (
        anthropic.Anthropic(base_url=fake.base_url, api_key="k", max_retries=0, timeout=0.3) as client,
        pytest.raises(anthropic.APITimeoutError),
    ):
        client.messages.create(model="fake-slow", max_tokens=8, messages=MESSAGES)
    assert fake.wait_for_disconnect(timeout=5)


# -- other endpoints and bookkeeping ----------------------------------------------------------


def test_count_tokens_models_and_recording(client: anthropic.Anthropic, fake: FakeClaudeAPI) -> None:
    counted = client.messages.count_tokens(model="fake-text", messages=MESSAGES)
    recorded = fake.requests[-1]
    assert recorded.path == "/v1/messages/count_tokens"
    assert counted.input_tokens == len(recorded.body) // 4 + 3
    beta = client.beta.messages.count_tokens(model="fake-text", messages=MESSAGES)
    # SDK 2.14 no longer puts ?beta=true on the wire (only an internal "qualifier")
    assert fake.requests[-1].headers["anthropic-beta"] == "token-counting-2024-11-01"
    assert beta.input_tokens == len(fake.requests[-1].body) // 4 + 3

    models = client.models.list()
    assert [m.id for m in models.data] == ["claude-fake-sonnet-1", "claude-fake-haiku-1"]
    assert client.models.retrieve("claude-fake-haiku-1").display_name == "Claude Fake Haiku 1"

    with client.beta.messages.stream(model="fake-tools", max_tokens=8, messages=MESSAGES) as stream:
        assert stream.get_final_message().stop_reason == "tool_use"
    recorded = fake.requests[-1]
    assert (recorded.method, recorded.path) == ("POST", "/v1/messages")
    assert recorded.json["stream"] is True
    assert recorded.json["model"] == "fake-tools"
    assert recorded.headers["authorization"] == "Bearer k"
    assert all(k == k.lower() for k in recorded.headers)

    fake.reset()
    assert fake.requests == []
    assert fake.disconnects == 0


def test_async_client(fake: FakeClaudeAPI) -> None:
    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k", max_retries=0) as client:
            async with client.messages.stream(model="fake-tools", max_tokens=8, messages=MESSAGES) as stream:
                streamed = await stream.get_final_message()
            created = await client.messages.create(model="fake-tools", max_tokens=8, messages=MESSAGES)
            return _dump(streamed), _dump(created)

    streamed, created = asyncio.run(run())
    assert streamed == created
    assert streamed["content"][1]["input"]["location"] == "San Francisco, CA"


def test_restart_and_deterministic_ids() -> None:
    ids = []
    for _ in range(2):
        with (
            FakeClaudeAPI() as server,
            anthropic.Anthropic(base_url=server.base_url, api_key="k", max_retries=0) as client,
        ):
            ids.append(client.messages.create(model="fake-tools", max_tokens=8, messages=MESSAGES).id)
    assert ids[0] == ids[1]

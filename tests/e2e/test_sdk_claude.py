"""End to end with the real ``anthropic`` SDK: through the gateway to the fake Claude API on 127.0.0.1,
compared with the same SDK talking to the fake directly."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import RunningGateway
from tests.fakes.claude_api import STREAM_SCENARIOS, FakeClaudeAPI, sse_body

COMPLETE = [s for s in STREAM_SCENARIOS if s not in ("fake-error-midstream", "fake-cut-midstream", "fake-slow")]
KW: dict[str, Any] = {"max_tokens": 1024, "messages": [{"role": "user", "content": "Hello"}]}


def direct(fake: FakeClaudeAPI) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fake.base_url, api_key="provider-key", max_retries=0)


def via(gw: RunningGateway, key: str = "gw-key-1") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


def final(client: anthropic.Anthropic, model: str) -> tuple[dict[str, Any], list[Any]]:
    with client.messages.stream(model=model, **KW) as stream:
        events = [event.model_dump(warnings=False) for event in stream]
        return stream.get_final_message().model_dump(warnings=False), events


@pytest.mark.parametrize("scenario", COMPLETE)
def test_stream_final_message_equals_direct(scenario: str, fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    want, want_events = final(direct(fake), scenario)
    got, got_events = final(via(gateway), scenario)
    assert got == want
    assert got_events == want_events


@pytest.mark.parametrize("scenario", COMPLETE)
def test_stream_bytes_are_forwarded_exactly(scenario: str, fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    body = {"model": scenario, "stream": True, **KW}
    resp = httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": "gw-key-1"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.content == sse_body(scenario)
    assert resp.headers["request-id"].startswith("req_fake_")  # the provider's own request id
    assert resp.headers["anthropic-ratelimit-requests-limit"]


@pytest.mark.parametrize("scenario", COMPLETE)
def test_non_streaming_equals_direct(scenario: str, fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    want = direct(fake).messages.create(model=scenario, **KW).model_dump(warnings=False)
    assert via(gateway).messages.create(model=scenario, **KW).model_dump(warnings=False) == want


def test_async_client_equals_direct(fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    async def run(base_url: str, key: str) -> dict[str, Any]:
        async with anthropic.AsyncAnthropic(base_url=base_url, api_key=key, max_retries=0) as client:
            async with client.messages.stream(model="fake-thinking", **KW) as stream:
                message = await stream.get_final_message()
            return message.model_dump(warnings=False)

    assert asyncio.run(run(gateway.url, "gw-key-2")) == asyncio.run(run(fake.base_url, "provider-key"))


def test_citations_one_per_delta_and_lists_equal(fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    got, events = final(via(gateway), "fake-citations")
    deltas = [e for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "citations_delta"]
    kinds = {d["delta"]["citation"]["type"] for d in deltas}
    assert kinds == {
        "char_location",
        "page_location",
        "content_block_location",
        "search_result_location",
        "web_search_result_location",
    }
    cited = [c for block in got["content"] if block["type"] == "text" for c in (block.get("citations") or [])]
    assert cited == [d["delta"]["citation"] for d in deltas]


def test_thinking_signature_and_redacted_pass_byte_exact(fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    got, _ = final(via(gateway), "fake-thinking")
    want, _ = final(direct(fake), "fake-thinking")
    thinking = next(b for b in got["content"] if b["type"] == "thinking")
    assert thinking["signature"] == next(b for b in want["content"] if b["type"] == "thinking")["signature"]
    assert any(b["type"] == "redacted_thinking" and b["data"] for b in got["content"])


def test_parallel_tool_use_inputs(gateway: RunningGateway) -> None:
    got, _ = final(via(gateway), "fake-tools")
    tools = [b for b in got["content"] if b["type"] == "tool_use"]
    assert len(tools) == 2 and all(isinstance(t["input"], dict) and t["input"] for t in tools)
    assert got["stop_reason"] == "tool_use"


def test_unknown_event_type_is_carried_and_counted(gateway: RunningGateway) -> None:
    before = gateway.sample("gateway_unknown_events_total", provider="claude", type="future_event")
    body = {"model": "fake-unknown-event", "stream": True, **KW}
    resp = httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": "gw-key-1"})
    assert b"event: future_event\n" in resp.content
    assert gateway.sample("gateway_unknown_events_total", provider="claude", type="future_event") == before + 1


# --- what reaches the provider -------------------------------------------------------------------------------


def test_provider_key_replaces_client_key_and_version_is_forwarded(
    fake: FakeClaudeAPI, gateway: RunningGateway
) -> None:
    client = via(gateway)
    client.messages.create(model="sonnet", **KW)
    sent = fake.requests[-1]
    assert sent.headers["x-api-key"] == "provider-key"
    assert "authorization" not in sent.headers  # the SDK sent its gateway key as Bearer; not forwarded
    assert sent.headers["anthropic-version"] == client.default_headers["anthropic-version"]
    assert sent.json is not None and sent.json["model"] == "fake-text"  # alias rewritten to the target model


def test_default_version_when_client_sends_none(fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    httpx.post(f"{gateway.url}/v1/messages", json={"model": "fake-text", **KW}, headers={"x-api-key": "gw-key-1"})
    assert fake.requests[-1].headers["anthropic-version"] == "2023-06-01"


def test_beta_path_and_header_are_forwarded(fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    client = via(gateway)
    with client.beta.messages.stream(model="fake-text", betas=["interleaved-thinking-2025-05-14"], **KW) as stream:
        text = stream.get_final_text()
    assert text
    assert fake.requests[-1].headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    # SDK 2.14 marks beta calls internally; older SDKs (and other clients) send ?beta=true, which is kept.
    resp = httpx.post(
        f"{gateway.url}/v1/messages?beta=true",
        json={"model": "fake-text", **KW},
        headers={"x-api-key": "gw-key-1", "anthropic-beta": "a-1,b-2"},
    )
    assert resp.status_code == 200
    assert (fake.requests[-1].query, fake.requests[-1].headers["anthropic-beta"]) == ("beta=true", "a-1,b-2")


def test_unchanged_body_is_forwarded_byte_for_byte(fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    raw = b'{"model": "fake-text",  "max_tokens": 5, "messages": [{"role": "user", "content": "h\\u00e9"}]}'
    httpx.post(f"{gateway.url}/v1/messages", content=raw, headers={"x-api-key": "gw-key-1"})
    assert fake.requests[-1].body == raw


def test_count_tokens_and_models(fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    client = via(gateway)
    count = client.messages.count_tokens(model="sonnet", messages=KW["messages"])
    assert count.input_tokens > 0
    assert fake.requests[-1].path == "/v1/messages/count_tokens"
    models = client.models.list()
    assert [m.id for m in models.data] == ["sonnet", "mock-model"]
    assert client.models.retrieve("sonnet").id == "sonnet"


def test_forward_client_key_when_configured(fake: FakeClaudeAPI) -> None:
    from tests.conftest import claude_config, run_gateway

    config = claude_config(fake.base_url, forward_client_key="true").replace(
        "auth: {keys: [gw-key-1, gw-key-2]}", "auth: {open: true}"
    )
    with run_gateway(config) as gw:
        anthropic.Anthropic(base_url=gw.url, api_key="user-own-key", max_retries=0).messages.create(
            model="fake-text", **KW
        )
    sent = fake.requests[-1]
    assert sent.headers["authorization"] == "Bearer user-own-key"
    assert "x-api-key" not in sent.headers


def test_health_metrics_and_inflight_balance(gateway: RunningGateway) -> None:
    via(gateway).messages.create(model="fake-text", **KW)
    with via(gateway).messages.stream(model="fake-text", **KW) as stream:
        stream.get_final_message()
    assert httpx.get(f"{gateway.url}/healthz").json() == {"status": "ok"}
    text = httpx.get(f"{gateway.url}/metrics").text
    assert 'gateway_requests_total{alias="*",model="",outcome="completed",provider="claude"}' in text
    assert "gateway_tokens_total{" in text
    assert gateway.sample("gateway_inflight_requests") == 0

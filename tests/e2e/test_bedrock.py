"""End to end with the real ``anthropic`` SDK: through the gateway to a fake Bedrock runtime that verifies
every SigV4 signature, compared with the SDK's own ``AnthropicBedrock`` client talking to the same fake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from adapters.bedrock import BEDROCK_ERRORS, STREAM_EXCEPTIONS
from tests.conftest import RunningGateway, run_gateway
from tests.fakes.bedrock import METRICS_KEY, FakeBedrock

KW: dict[str, Any] = {"max_tokens": 1024, "messages": [{"role": "user", "content": "Hello"}]}
AUTH = {"x-api-key": "gw-key"}
ARN = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/us.anthropic.fake-citations-v1:0"
CONVERSE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "converse"


def config(url: str) -> str:
    keys = "access_key_id: AKIDFAKEBEDROCK, secret_access_key: fake-secret"
    return f"""
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 100000}}}}
auth: {{keys: [gw-key]}}
providers:
  bedrock: {{kind: bedrock, region: us-east-1, base_url: "{url}", {keys}}}
  bedrock-bearer: {{kind: bedrock, region: us-east-1, base_url: "{url}", api_key: bedrock-api-key}}
  bedrock-wrong: {{kind: bedrock, region: us-east-1, base_url: "{url}", access_key_id: AKIDFAKEBEDROCK,
                  secret_access_key: not-the-secret}}
  converse: {{kind: bedrock, api: converse, region: us-east-1, base_url: "{url}", {keys}}}
  mantle: {{kind: bedrock_mantle, region: us-east-1, base_url: "{url}/anthropic", {keys}}}
  mantle-bearer: {{kind: bedrock_mantle, region: us-east-1, base_url: "{url}/anthropic", api_key: bedrock-api-key}}
  claude-aws: {{kind: claude_aws, region: us-east-1, base_url: "{url}", workspace_id: wrk_01test, {keys}}}
models:
  arn-citations: {{targets: [{{provider: bedrock, model: "{ARN}"}}]}}
  bearer-tools: {{targets: [{{provider: bedrock-bearer, model: global.anthropic.fake-tools}}]}}
  wrong-secret: {{targets: [{{provider: bedrock-wrong, model: us.anthropic.fake-text-v1:0}}]}}
  mantle-text: {{targets: [{{provider: mantle, model: fake-text}}]}}
  mantle-bearer-thinking: {{targets: [{{provider: mantle-bearer, model: fake-thinking}}]}}
  aws-citations: {{targets: [{{provider: claude-aws, model: fake-citations}}]}}
  "converse-*": {{targets: [{{provider: converse}}]}}
  "*": {{targets: [{{provider: bedrock}}]}}
"""


@pytest.fixture(scope="module")
def bedrock() -> Iterator[FakeBedrock]:
    with FakeBedrock(converse_dir=CONVERSE_DIR) as fake:
        yield fake


@pytest.fixture
def fake(bedrock: FakeBedrock) -> FakeBedrock:
    bedrock.reset()
    bedrock.split_writes = None
    return bedrock


@pytest.fixture(scope="module")
def gw(bedrock: FakeBedrock) -> Iterator[RunningGateway]:
    with run_gateway(config(bedrock.base_url)) as running:
        yield running


def direct(fake: FakeBedrock) -> anthropic.AnthropicBedrock:
    return anthropic.AnthropicBedrock(
        aws_access_key="AKIDFAKEBEDROCK",
        aws_secret_key="fake-secret",
        aws_region="us-east-1",
        base_url=fake.base_url,
        max_retries=0,
    )


# SDK 2.14 defaults Bedrock's body `anthropic_version` to its own API version (docs/wire-formats.md §7.1), which
# Bedrock rejects; the direct client is given Bedrock's value, as its users must do.
BEDROCK_BODY = {"extra_body": {"anthropic_version": "bedrock-2023-05-31"}}


def via(gw: RunningGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="gw-key", max_retries=0)


def streamed(
    client: anthropic.Anthropic | anthropic.AnthropicBedrock, model: str, **kw: Any
) -> tuple[dict[str, Any], list[Any]]:
    with client.messages.stream(model=model, **{**KW, **kw}) as stream:
        events = [event.model_dump(warnings=False) for event in stream]
        return stream.get_final_message().model_dump(warnings=False), events


def without_metrics(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != METRICS_KEY} for e in events]


def raw_stream(gw: RunningGateway, model: str, **headers: str) -> httpx.Response:
    body = {"model": model, "stream": True, **KW}
    return httpx.post(f"{gw.url}/v1/messages", json=body, headers={**AUTH, **headers}, timeout=10)


def event_names(resp: httpx.Response) -> list[str]:
    return [line[7:] for line in resp.text.split("\n") if line.startswith("event: ")]


# --- the same answer as AnthropicBedrock, through the gateway ---------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        "anthropic.fake-text-v1:0",
        "us.anthropic.fake-citations-v1:0",
        "eu.anthropic.fake-tools-v1:0",
        "global.anthropic.fake-thinking",
        "apac.anthropic.fake-text-multibyte-v1:0",
        "anthropic.fake-server-tools-v1:0",
    ],
)
def test_stream_equals_anthropic_bedrock(model: str, fake: FakeBedrock, gw: RunningGateway) -> None:
    want, want_events = streamed(direct(fake), model, **BEDROCK_BODY)
    got, got_events = streamed(via(gw), model)
    assert got == want
    assert got_events == without_metrics(want_events)
    assert want["id"].startswith("msg_bdrk_")
    signed = [r for r in fake.requests if r.auth == "sigv4"]
    assert len(signed) == 2 and all(r.operation == "invoke-with-response-stream" for r in signed)


@pytest.mark.parametrize("model", ["anthropic.fake-text-v1:0", "us.anthropic.fake-tools-v1:0", "fake-thinking"])
def test_json_equals_anthropic_bedrock(model: str, fake: FakeBedrock, gw: RunningGateway) -> None:
    want = direct(fake).messages.create(model=model, **KW, **BEDROCK_BODY).model_dump(warnings=False)
    assert via(gw).messages.create(model=model, **KW).model_dump(warnings=False) == want
    assert fake.requests[-1].operation == "invoke"


def test_async_client_through_the_gateway(fake: FakeBedrock, gw: RunningGateway) -> None:
    import asyncio

    async def run() -> dict[str, Any]:
        client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="gw-key", max_retries=0)
        async with client, client.messages.stream(model="us.anthropic.fake-tools-v1:0", **KW) as stream:
            return (await stream.get_final_message()).model_dump(warnings=False)

    want, _ = streamed(direct(fake), "us.anthropic.fake-tools-v1:0", **BEDROCK_BODY)
    assert asyncio.run(run()) == want


def test_body_rewritten_for_invoke_model(fake: FakeBedrock, gw: RunningGateway) -> None:
    via(gw).beta.messages.create(
        model="us.anthropic.fake-text-v1:0",
        betas=["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"],
        stop_sequences=["END"],
        **KW,
    )
    request = fake.requests[-1]
    body = request.json
    assert "model" not in body and "stream" not in body
    assert body["anthropic_version"] == "bedrock-2023-05-31"
    assert body["anthropic_beta"] == ["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"]
    assert body["stop_sequences"] == ["END"] and body["messages"] == KW["messages"] and body["max_tokens"] == 1024
    assert request.auth == "sigv4" and request.signing_name == "bedrock"
    assert "anthropic-version" not in request.headers and "x-api-key" not in request.headers


def test_arn_model_id_is_percent_encoded_and_signed(fake: FakeBedrock, gw: RunningGateway) -> None:
    got, _ = streamed(via(gw), "arn-citations")
    want, _ = streamed(direct(fake), ARN, **BEDROCK_BODY)
    assert got == want
    request = fake.requests[0]
    assert request.model_id == ARN
    assert "application-inference-profile%2Fus.anthropic" in request.raw_path
    assert request.auth == "sigv4" and request.auth_error is None


def test_bedrock_api_key_as_bearer(fake: FakeBedrock, gw: RunningGateway) -> None:
    got, _ = streamed(via(gw), "bearer-tools")
    assert [b["type"] for b in got["content"]] == ["text", "tool_use", "tool_use"]
    request = fake.requests[-1]
    assert request.auth == "bearer" and request.headers["authorization"] == "Bearer bedrock-api-key"


def test_rejected_signature_is_a_clear_error(fake: FakeBedrock, gw: RunningGateway) -> None:
    with pytest.raises(anthropic.PermissionDeniedError) as info:
        via(gw).messages.create(model="wrong-secret", **KW)
    assert info.value.status_code == 403
    assert "not-the-secret" not in str(info.value.body)
    assert fake.requests[-1].auth_error == "InvalidSignatureException"


def test_invocation_metrics_stripped_and_no_bedrock_framing_leaks(fake: FakeBedrock, gw: RunningGateway) -> None:
    resp = raw_stream(gw, "anthropic.fake-text-v1:0")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    assert "amazon-bedrock" not in resp.text and "invocationMetrics" not in resp.text
    assert 'data: {"type":"message_stop"}\n\n' in resp.text
    assert not any(h.startswith("x-amzn") for h in resp.headers)
    assert gw.sample("gateway_usage_mismatch_total", provider="bedrock") == 0


def test_usage_mismatch_is_counted_not_fixed(fake: FakeBedrock, gw: RunningGateway) -> None:
    before = gw.sample("gateway_usage_mismatch_total", provider="bedrock")
    want, _ = streamed(direct(fake), "us.anthropic.fake-metrics-mismatch", **BEDROCK_BODY)
    got, _ = streamed(via(gw), "us.anthropic.fake-metrics-mismatch")
    assert got["usage"] == want["usage"]  # the stream's own usage reaches the client unchanged
    assert gw.sample("gateway_usage_mismatch_total", provider="bedrock") == before + 1


def test_frames_split_across_reads(fake: FakeBedrock, gw: RunningGateway) -> None:
    want, want_events = streamed(direct(fake), "us.anthropic.fake-text-d40", **BEDROCK_BODY)
    fake.split_writes = 7
    got, got_events = streamed(via(gw), "us.anthropic.fake-text-d40")
    assert got == want and got_events == without_metrics(want_events)


def test_split_scenario(fake: FakeBedrock, gw: RunningGateway) -> None:
    resp = raw_stream(gw, "us.anthropic.fake-split")
    assert event_names(resp)[-1] == "message_stop"
    assert event_names(resp).count("content_block_delta") > 3


# --- failures: never a message_stop ------------------------------------------------------------------------


@pytest.mark.parametrize("exception", sorted(STREAM_EXCEPTIONS))
def test_exception_frame_mid_stream_ends_in_error(exception: str, fake: FakeBedrock, gw: RunningGateway) -> None:
    model = f"us.anthropic.fake-exc-{exception}"
    resp = raw_stream(gw, model)
    assert resp.status_code == 200
    names = event_names(resp)
    assert names[0] == "message_start" and names[-1] == "error"
    assert "message_stop" not in names and "message_delta" not in names
    with pytest.raises(anthropic.APIStatusError) as info, via(gw).messages.stream(model=model, **KW) as stream:
        for _ in stream:
            pass
    assert info.value.body["error"]["type"] == STREAM_EXCEPTIONS[exception]  # type: ignore[index]


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        ("fake-error-unmodeled", "InternalFailure"),
        ("fake-bad-crc", "CRC"),
        ("fake-cut-frame", ""),
        ("fake-error-chunk", "Overloaded"),
    ],
)
def test_damaged_streams_end_in_error(scenario: str, message: str, fake: FakeBedrock, gw: RunningGateway) -> None:
    resp = raw_stream(gw, f"us.anthropic.{scenario}")
    names = event_names(resp)
    assert names[0] == "message_start" and names[-1] == "error", names
    assert "message_stop" not in names
    assert message in resp.text.rsplit("event: error", 1)[1]


@pytest.mark.parametrize("name", sorted(BEDROCK_ERRORS))
@pytest.mark.parametrize("stream", [True, False])
def test_pre_stream_errors_map_to_anthropic_status(
    name: str, stream: bool, fake: FakeBedrock, gw: RunningGateway
) -> None:
    if name == "ModelStreamErrorException":
        pytest.skip("only ever a stream exception frame")
    status, error_type = BEDROCK_ERRORS[name]
    body = {"model": f"us.anthropic.fake-status-{name}", "stream": stream, **KW}
    resp = httpx.post(f"{gw.url}/v1/messages", json=body, headers=AUTH)
    assert resp.status_code == status
    envelope = resp.json()
    assert envelope["type"] == "error" and envelope["error"]["type"] == error_type
    assert envelope["error"]["message"]
    assert resp.headers["request-id"].startswith("req_")


def test_sdk_retries_a_throttled_request_and_sees_rate_limit(fake: FakeBedrock, gw: RunningGateway) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key="gw-key", max_retries=1)
    with pytest.raises(anthropic.RateLimitError):
        client.with_options(timeout=10).messages.create(model="us.anthropic.fake-status-ThrottlingException", **KW)
    assert len(fake.requests) == 2  # 429 is retryable for the SDK


def test_client_disconnect_closes_the_bedrock_stream(fake: FakeBedrock, gw: RunningGateway) -> None:
    with via(gw).messages.stream(model="us.anthropic.fake-slow", **KW) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                break
    assert fake.wait_for_disconnect(timeout=5)


# --- count_tokens ------------------------------------------------------------------------------------------


def test_count_tokens_through_bedrock(fake: FakeBedrock, gw: RunningGateway) -> None:
    result = via(gw).messages.count_tokens(model="us.anthropic.fake-text-v1:0", messages=KW["messages"])
    request = fake.requests[-1]
    assert request.operation == "count-tokens" and request.auth == "sigv4"
    inner = request.inner_json
    assert inner["anthropic_version"] == "bedrock-2023-05-31" and "model" not in inner
    assert inner["messages"] == KW["messages"]
    assert result.input_tokens > 0


def test_a_count_bedrock_cannot_make_is_501_not_supported(fake: FakeBedrock, gw: RunningGateway) -> None:
    """A model Bedrock cannot count for, and an application inference profile (never sent): ``501 not_supported``
    with ``x-should-retry: false``, as Claude Code's gateway contract answers it (the client counts on its own)."""
    body = {"model": "us.anthropic.fake-nocount", "messages": KW["messages"]}
    headers = {"x-api-key": "gw-key", "anthropic-version": "2023-06-01"}
    refused = httpx.post(f"{gw.url}/v1/messages/count_tokens", json=body, headers=headers)
    assert refused.status_code == 501 and refused.headers["x-should-retry"] == "false"
    assert refused.json()["error"]["type"] == "not_supported"
    before = len(fake.requests)
    profile = httpx.post(f"{gw.url}/v1/messages/count_tokens", json={**body, "model": "arn-citations"}, headers=headers)
    assert profile.status_code == 501 and "application inference profile" in profile.json()["error"]["message"]
    assert len(fake.requests) == before  # nothing sent


def test_a_count_carries_max_tokens_above_the_thinking_budget_and_no_empty_tools(
    fake: FakeBedrock, gw: RunningGateway
) -> None:
    thinking = {"type": "enabled", "budget_tokens": 4096}
    for extra, want in (({"max_tokens": 1024}, 4097), ({}, 4097), ({"max_tokens": 8000}, 8000)):
        body = {"model": "us.anthropic.fake-text-v1:0", "messages": KW["messages"], "thinking": thinking, "tools": []}
        resp = httpx.post(f"{gw.url}/v1/messages/count_tokens", json={**body, **extra}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        result = resp.json()
        inner = fake.requests[-1].inner_json
        assert result["input_tokens"] > 0 and inner["max_tokens"] == want and "tools" not in inner


# --- the first-party-shaped AWS surfaces (docs/wire-formats.md §7) -----------------------------------------


def test_bedrock_messages_endpoint_with_sigv4(fake: FakeBedrock, gw: RunningGateway) -> None:
    got, _ = streamed(via(gw), "mantle-text")
    assert got["content"][0]["type"] == "text"
    request = fake.requests[-1]
    assert request.path == "/anthropic/v1/messages" and request.signing_name == "bedrock-mantle"
    assert request.json["model"] == "fake-text" and request.json["stream"] is True


def test_bedrock_messages_endpoint_with_api_key(fake: FakeBedrock, gw: RunningGateway) -> None:
    got, _ = streamed(via(gw), "mantle-bearer-thinking")
    assert [b["type"] for b in got["content"]][:1] == ["thinking"]
    assert fake.requests[-1].auth == "bearer"


def test_claude_platform_on_aws(fake: FakeBedrock, gw: RunningGateway) -> None:
    got, _ = streamed(via(gw), "aws-citations")
    assert any(b.get("citations") for b in got["content"])
    request = fake.requests[-1]
    assert request.path == "/v1/messages" and request.signing_name == "aws-external-anthropic"
    assert request.headers["anthropic-workspace-id"] == "wrk_01test"


# --- bearer token from the environment ---------------------------------------------------------------------


def test_bearer_token_from_environment(fake: FakeBedrock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", "bedrock-api-key")
    yaml = f"""
auth: {{open: true}}
providers: {{b: {{kind: bedrock, region: us-east-1, base_url: "{fake.base_url}"}}}}
models: {{"*": {{targets: [{{provider: b}}]}}}}
"""
    with run_gateway(yaml) as running:
        resp = httpx.post(f"{running.url}/v1/messages", json={"model": "fake-text", **KW})
    assert resp.status_code == 200
    assert fake.requests[-1].auth == "bearer"


# --- api: converse ------------------------------------------------------------------------------------------


def converse_fixture(name: str) -> list[dict[str, Any]]:
    import json

    return json.loads((CONVERSE_DIR / f"{name}.json").read_text())


def test_converse_text(fake: FakeBedrock, gw: RunningGateway) -> None:
    got, events = streamed(via(gw), "converse-text")
    deltas = [e for e in converse_fixture("text") if e.get("event") == "contentBlockDelta"]
    assert got["content"][0]["text"] == "".join(d["payload"]["delta"]["text"] for d in deltas)
    metadata = next(e for e in converse_fixture("text") if e.get("event") == "metadata")["payload"]["usage"]
    assert got["usage"]["input_tokens"] == metadata["inputTokens"]
    assert got["usage"]["output_tokens"] == metadata["outputTokens"]
    assert got["stop_reason"] == "end_turn" and got["model"] == "converse-text"
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    request = fake.requests[-1]
    assert request.operation == "converse-stream" and request.auth == "sigv4"
    assert request.json["messages"] == [{"role": "user", "content": [{"text": "Hello"}]}]
    assert request.json["inferenceConfig"]["maxTokens"] == 1024


def test_converse_tool_use(fake: FakeBedrock, gw: RunningGateway) -> None:
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}]
    got, _ = streamed(via(gw), "converse-tool_use", tools=tools, tool_choice={"type": "any"})
    uses = [b for b in got["content"] if b["type"] == "tool_use"]
    assert uses and isinstance(uses[0]["input"], dict) and uses[0]["input"]
    assert got["stop_reason"] == "tool_use"
    config = fake.requests[-1].json["toolConfig"]
    assert config["tools"][0]["toolSpec"]["name"] == "get_weather" and config["toolChoice"] == {"any": {}}


def test_converse_reasoning_keeps_the_signature(fake: FakeBedrock, gw: RunningGateway) -> None:
    got, _ = streamed(via(gw), "converse-reasoning", thinking={"type": "enabled", "budget_tokens": 2048})
    thinking = got["content"][0]
    signature = next(
        e["payload"]["delta"]["reasoningContent"]["signature"]
        for e in converse_fixture("reasoning")
        if "signature" in e.get("payload", {}).get("delta", {}).get("reasoningContent", {})
    )
    assert thinking["type"] == "thinking" and thinking["signature"] == signature
    assert got["content"][1]["type"] == "text"
    extra = fake.requests[-1].json["additionalModelRequestFields"]
    assert extra["thinking"] == {"type": "enabled", "budget_tokens": 2048}


def test_converse_citations_one_per_delta(fake: FakeBedrock, gw: RunningGateway) -> None:
    resp = raw_stream(gw, "converse-citations")
    assert event_names(resp)[-1] == "message_stop"
    got, events = streamed(via(gw), "converse-citations")
    citation_deltas = [
        e for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "citations_delta"
    ]
    sources = [e for e in converse_fixture("citations") if "citation" in e.get("payload", {}).get("delta", {})]
    assert len(citation_deltas) == len(sources)
    cited = [c for b in got["content"] if b["type"] == "text" for c in (b.get("citations") or [])]
    assert [c["type"] for c in cited] == ["char_location", "char_location", "page_location"]
    assert cited[2]["cited_text"] == "Revenue grew 4% in Q3."


def test_converse_cache_usage(fake: FakeBedrock, gw: RunningGateway) -> None:
    got, _ = streamed(via(gw), "converse-metadata_cache")
    usage = next(e for e in converse_fixture("metadata_cache") if e.get("event") == "metadata")["payload"]["usage"]
    assert got["usage"]["cache_read_input_tokens"] == usage.get("cacheReadInputTokens", 0)
    assert got["usage"]["cache_creation_input_tokens"] == usage.get("cacheWriteInputTokens", 0)


def test_converse_exception_mid_stream(fake: FakeBedrock, gw: RunningGateway) -> None:
    resp = raw_stream(gw, "converse-exception")
    names = event_names(resp)
    assert names[-1] == "error" and "message_stop" not in names


def test_converse_non_streaming(fake: FakeBedrock, gw: RunningGateway) -> None:
    got = via(gw).messages.create(model="converse-reasoning", **KW).model_dump(warnings=False)
    streamed_got, _ = streamed(via(gw), "converse-reasoning")
    assert fake.requests[-2].operation == "converse"
    assert [b["type"] for b in got["content"]] == [b["type"] for b in streamed_got["content"]]
    assert got["content"][1]["text"] == streamed_got["content"][1]["text"]
    assert got["usage"]["output_tokens"] == streamed_got["usage"]["output_tokens"]


def test_converse_rejects_what_it_cannot_express(fake: FakeBedrock, gw: RunningGateway) -> None:
    tools = [{"name": "t", "input_schema": {"type": "object"}}]
    with pytest.raises(anthropic.BadRequestError) as info:
        via(gw).messages.create(model="converse-text", tools=tools, tool_choice={"type": "none"}, **KW)
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "tool_choice" in info.value.body["error"]["message"]  # type: ignore[index]
    assert fake.requests == []  # rejected before anything was sent


def test_converse_count_tokens(fake: FakeBedrock, gw: RunningGateway) -> None:
    result = via(gw).messages.count_tokens(model="converse-text", messages=KW["messages"])
    assert result.input_tokens > 0
    request = fake.requests[-1]
    assert request.operation == "count-tokens" and "converse" in request.json["input"]


# --- the provider's request id, for an AWS support case ------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "body"),
    [
        ("us.anthropic.fake-text-v1:0", {"stream": True}),
        ("us.anthropic.fake-text-v1:0", {}),
        ("converse-text", {"stream": True}),
        ("converse-text", {}),
        ("us.anthropic.fake-status-ThrottlingException", {}),
    ],
)
def test_bedrocks_request_id_is_kept(
    model: str, body: dict[str, Any], fake: FakeBedrock, gw: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """``x-amzn-RequestId`` used to be dropped: ``upstream_request_id`` was empty for every Bedrock request."""
    import json
    import logging
    import time
    import uuid

    caplog.set_level(logging.INFO, logger="gateway.access")
    resp = httpx.post(f"{gw.url}/v1/messages", json={"model": model, **KW, **body}, headers=AUTH, timeout=10)
    rid = resp.headers["request-id"]
    deadline = time.monotonic() + 5
    lines: list[dict[str, Any]] = []
    while not lines and time.monotonic() < deadline:
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.access"]
        lines = [line for line in lines if rid in (line["request_id"], line["upstream_request_id"])]
        time.sleep(0.02)
    (line,) = lines
    uuid.UUID(line["upstream_request_id"])  # AWS's id, as the fake sends it (a UUID)
    assert not any(h.startswith("x-amzn") for h in resp.headers)  # kept in the line, not sent to the client

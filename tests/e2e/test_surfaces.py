"""The Bedrock- and Vertex-shaped routes on the wire (``surfaces/``): event-stream frames a Bedrock client
decodes — a Bedrock target's own frames byte for byte, any other target's events encoded with both CRCs and
the invocation metrics added from the stream's usage —, Bedrock's error shapes before and during a stream, the
body made canonical (``anthropic_beta`` merged into the header, ``anthropic_version`` out), model ids mapped
onto aliases, and the Vertex routes answering as the Messages route does."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from botocore.eventstream import EventStreamBuffer

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.bedrock import FakeBedrock
from tests.fakes.claude_api import FakeClaudeAPI, final_message

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
BEDROCK_BODY = {**KW, "anthropic_version": "bedrock-2023-05-31"}
AUTH = {"authorization": "Bearer sk-dev"}


@pytest.fixture(scope="module")
def bedrock() -> Iterator[FakeBedrock]:
    with FakeBedrock() as fake:
        yield fake


@pytest.fixture(scope="module")
def gw(fake_claude: FakeClaudeAPI, bedrock: FakeBedrock) -> Iterator[RunningGateway]:
    config = f"""
resilience: {{retry: {{max_attempts: 1}}}}
auth: {{keys: [sk-dev]}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake_claude.base_url}"}}
  bedrock: {{kind: bedrock, region: us-east-1, base_url: "{bedrock.base_url}", api_key: bedrock-api-key}}
models:
  sonnet:
    display_name: Claude Sonnet (fake)
    description: The fake's text answer
    bedrock_ids: ["arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123"]
    vertex_ids: [my-tuned-model]
    targets: [{{provider: claude, model: fake-text}}]
  "bedrock-*": {{targets: [{{provider: bedrock, model: us.anthropic.fake-text-v1:0}}]}}
  "fake-*": {{targets: [{{provider: claude}}]}}
"""
    with run_gateway(config) as running:
        yield running


def frames(body: bytes) -> list[Any]:
    buffer = EventStreamBuffer()  # botocore's own decoder: both CRCs checked
    buffer.add_data(body)
    return list(buffer)


def chunk_events(body: bytes) -> list[dict[str, Any]]:
    out = []
    for message in frames(body):
        assert message.headers[":message-type"] == "event" and message.headers[":event-type"] == "chunk"
        out.append(json.loads(base64.b64decode(json.loads(message.payload)["bytes"])))
    return out


def sse_events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ")]


def test_a_stream_from_any_target_is_chunk_frames_with_the_invocation_metrics(
    gw: RunningGateway, fake_claude: FakeClaudeAPI
) -> None:
    resp = httpx.post(
        f"{gw.url}/model/us.anthropic.fake-tools-v1:0/invoke-with-response-stream", json=BEDROCK_BODY, headers=AUTH
    )
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/vnd.amazon.eventstream"
    events = chunk_events(resp.content)
    direct = httpx.post(
        f"{fake_claude.base_url}/v1/messages",
        json={"model": "fake-tools", "stream": True, **KW},
        headers={"x-api-key": "p"},
    )
    expected = sse_events(direct.content)
    metrics = events[-1].pop("amazon-bedrock-invocationMetrics")
    assert [e["type"] for e in events] == [e["type"] for e in expected]
    assert events[1:-1] == expected[1:-1]  # every event but the ids of the first, exactly
    start = events[0]["message"]["usage"]
    delta = next(e for e in events if e["type"] == "message_delta")["usage"]
    assert metrics["inputTokenCount"] == start["input_tokens"]
    assert metrics["outputTokenCount"] == delta["output_tokens"]
    assert metrics["cacheReadInputTokenCount"] == start["cache_read_input_tokens"]
    assert set(metrics) >= {"invocationLatency", "firstByteLatency"}


def test_a_bedrock_targets_own_frames_go_out_byte_for_byte(gw: RunningGateway, bedrock: FakeBedrock) -> None:
    resp = httpx.post(f"{gw.url}/model/bedrock-text/invoke-with-response-stream", json=BEDROCK_BODY, headers=AUTH)
    assert resp.status_code == 200
    payloads = [json.loads(m.payload) for m in frames(resp.content)]
    assert all("p" in p for p in payloads)  # Bedrock's padding: only its own frames have it, never the gateway's
    last = json.loads(base64.b64decode(payloads[-1]["bytes"]))
    assert "amazon-bedrock-invocationMetrics" in last  # Bedrock's own metrics, as it sent them


def test_a_bedrock_targets_frames_go_out_whole_when_they_straddle_reads(
    gw: RunningGateway, bedrock: FakeBedrock
) -> None:
    """The fake writes its frames in pieces of 1-7 bytes: every read ends inside a frame, so each batch's own
    bytes are the front of the read (``Batch.wire`` slices them); the client still gets whole frames, each
    Bedrock's own (its padding), in order, with nothing lost or repeated."""
    whole = httpx.post(f"{gw.url}/model/bedrock-text/invoke-with-response-stream", json=BEDROCK_BODY, headers=AUTH)
    bedrock.split_writes = 7
    try:
        split = httpx.post(f"{gw.url}/model/bedrock-text/invoke-with-response-stream", json=BEDROCK_BODY, headers=AUTH)
    finally:
        bedrock.split_writes = None
    assert split.status_code == 200
    payloads = [json.loads(m.payload) for m in frames(split.content)]
    assert payloads and all("p" in p for p in payloads)
    kinds = [json.loads(base64.b64decode(p["bytes"]))["type"] for p in payloads]
    assert kinds == [e["type"] for e in chunk_events(whole.content)]


def test_a_failure_mid_stream_is_the_exception_frame_bedrock_sends(gw: RunningGateway) -> None:
    resp = httpx.post(
        f"{gw.url}/model/anthropic.fake-error-midstream-v1:0/invoke-with-response-stream",
        json=BEDROCK_BODY,
        headers=AUTH,
    )
    messages = frames(resp.content)
    last = messages[-1]
    assert last.headers[":message-type"] == "exception"
    assert last.headers[":exception-type"] == "serviceUnavailableException"  # the fake's overloaded_error
    assert json.loads(last.payload)["message"]
    assert all(m.headers[":message-type"] == "event" for m in messages[:-1])
    kinds = [json.loads(base64.b64decode(json.loads(m.payload)["bytes"]))["type"] for m in messages[:-1]]
    assert "message_stop" not in kinds


def test_invoke_answers_the_message_with_bedrocks_headers(gw: RunningGateway) -> None:
    resp = httpx.post(f"{gw.url}/model/us.anthropic.fake-text/invoke", json=BEDROCK_BODY, headers=AUTH)
    assert resp.status_code == 200
    message = resp.json()
    expected = final_message("fake-text")
    assert message["content"] == expected["content"]
    assert resp.headers["x-amzn-bedrock-input-token-count"] == str(message["usage"]["input_tokens"])
    assert resp.headers["x-amzn-bedrock-output-token-count"] == str(message["usage"]["output_tokens"])
    assert resp.headers["x-amzn-requestid"] == resp.headers["request-id"]


def test_the_body_is_made_canonical_and_the_betas_merged(gw: RunningGateway, fake_claude: FakeClaudeAPI) -> None:
    before = len(fake_claude.requests)
    body = {**BEDROCK_BODY, "anthropic_beta": ["context-management-2025-06-27", "b-both"]}
    headers = {**AUTH, "anthropic-beta": "b-both,claude-code-20250219"}
    assert httpx.post(f"{gw.url}/model/fake-text/invoke", json=body, headers=headers).status_code == 200
    sent = fake_claude.requests[before]
    assert sent.headers["anthropic-beta"] == "b-both,claude-code-20250219,context-management-2025-06-27"
    assert sent.json["model"] == "fake-text" and "stream" not in sent.json
    assert "anthropic_version" not in sent.json and "anthropic_beta" not in sent.json
    assert sent.json["messages"] == KW["messages"]


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        ("us.anthropic.fake-citations-v1:0", "fake-citations"),
        ("us.anthropic.fake-citations-v1%3A0", "fake-citations"),  # the colon escaped
        ("arn:aws:bedrock:us-east-1:123456789012:application-inference-profile%2Fabc123", "fake-text"),  # bedrock_ids
        ("arn:aws:bedrock:us-east-1:1:inference-profile%2Fglobal.anthropic.fake-thinking-v1:0", "fake-thinking"),
    ],
)
def test_bedrock_model_ids_map_onto_aliases(
    gw: RunningGateway, fake_claude: FakeClaudeAPI, model_id: str, expected: str
) -> None:
    before = len(fake_claude.requests)
    resp = httpx.post(f"{gw.url}/model/{model_id}/invoke", json=BEDROCK_BODY, headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert fake_claude.requests[before].json["model"] == expected


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "name"),
    [
        ("/model/nothing-like-it/invoke", BEDROCK_BODY, AUTH, 404, "ResourceNotFoundException"),
        ("/model/fake-text/invoke", {"anthropic_version": "bedrock-2023-05-31"}, AUTH, 400, "ValidationException"),
        (
            "/model/fake-text/invoke",
            BEDROCK_BODY,
            {"authorization": "Bearer wrong"},
            401,  # the gateway's key: see surfaces/bedrock.py
            "UnrecognizedClientException",
        ),
        ("/model/fake-status-529/invoke", BEDROCK_BODY, AUTH, 503, "ServiceUnavailableException"),
        ("/model/fake-status-429/invoke-with-response-stream", BEDROCK_BODY, AUTH, 429, "ThrottlingException"),
    ],
)
def test_errors_before_the_answer_are_bedrocks_shape(
    gw: RunningGateway, path: str, body: Any, headers: dict[str, str], status: int, name: str
) -> None:
    resp = httpx.post(f"{gw.url}{path}", json=body, headers=headers)
    assert resp.status_code == status, resp.text
    assert resp.headers["x-amzn-errortype"].split(":")[0] == name
    assert set(resp.json()) == {"message"} and resp.json()["message"]
    assert resp.headers["x-amzn-requestid"] == resp.headers["request-id"]


def test_count_tokens_in_bedrocks_shape(gw: RunningGateway) -> None:
    inner = json.dumps({"messages": KW["messages"], "max_tokens": 10})
    for wrapped in (inner, base64.b64encode(inner.encode()).decode()):  # JSON text, or botocore's base64 blob
        resp = httpx.post(
            f"{gw.url}/model/us.anthropic.fake-text/count-tokens",
            json={"input": {"invokeModel": {"body": wrapped}}},
            headers=AUTH,
        )
        assert resp.status_code == 200 and resp.json()["inputTokens"] > 0


def test_inference_profiles_list_the_aliases(gw: RunningGateway) -> None:
    resp = httpx.get(f"{gw.url}/inference-profiles", params={"type": "SYSTEM_DEFINED"}, headers=AUTH)
    assert resp.status_code == 200
    (profile,) = resp.json()["inferenceProfileSummaries"]
    assert (profile["inferenceProfileId"], profile["inferenceProfileName"]) == ("sonnet", "Claude Sonnet (fake)")
    assert httpx.get(f"{gw.url}/inference-profiles", params={"type": "APPLICATION"}, headers=AUTH).json() == {
        "inferenceProfileSummaries": []
    }
    anonymous = httpx.get(f"{gw.url}/inference-profiles", params={"type": "SYSTEM_DEFINED"})  # the AWS SDK's call
    assert anonymous.status_code == 200 and anonymous.json() == {"inferenceProfileSummaries": []}
    assert httpx.get(f"{gw.url}/inference-profiles", headers={"authorization": "Bearer wrong"}).status_code == 401


VERTEX = "/v1/projects/p/locations/us-east5/publishers/anthropic/models"
VERTEX_BODY = {**KW, "anthropic_version": "vertex-2023-10-16"}


def test_vertex_streams_and_answers_as_the_messages_route(gw: RunningGateway, fake_claude: FakeClaudeAPI) -> None:
    before = len(fake_claude.requests)
    stream = httpx.post(
        f"{gw.url}{VERTEX}/fake-text@20250101:streamRawPredict", json={**VERTEX_BODY, "stream": True}, headers=AUTH
    )
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    messages = httpx.post(f"{gw.url}/v1/messages", json={"model": "fake-text", "stream": True, **KW}, headers=AUTH)
    assert [e["type"] for e in sse_events(stream.content)] == [e["type"] for e in sse_events(messages.content)]
    sent = fake_claude.requests[before].json
    # the first-party name of a Vertex `@version` id, which the `fake-*` glob serves
    assert sent["model"] == "fake-text-20250101" and sent["stream"] is True and "anthropic_version" not in sent
    plain = httpx.post(f"{gw.url}{VERTEX}/my-tuned-model:rawPredict", json=VERTEX_BODY, headers=AUTH)  # vertex_ids
    assert plain.status_code == 200 and plain.json()["content"] == final_message("fake-text")["content"]
    count = httpx.post(
        f"{gw.url}{VERTEX}/count-tokens:rawPredict", json={"model": "fake-text@20250101", **KW}, headers=AUTH
    )
    assert count.status_code == 200 and count.json()["input_tokens"] > 0
    missing = httpx.post(f"{gw.url}{VERTEX}/nothing-like-it:rawPredict", json=VERTEX_BODY, headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"  # the envelope


def test_the_models_list_carries_what_claude_codes_discovery_reads(gw: RunningGateway) -> None:
    listed = httpx.get(f"{gw.url}/v1/models", params={"limit": 1000}, headers=AUTH).json()["data"]
    assert listed == [
        {
            "type": "model",
            "id": "sonnet",
            "display_name": "Claude Sonnet (fake)",
            "description": "The fake's text answer",
            "created_at": "2025-01-01T00:00:00Z",
        }
    ]


def test_a_surfaces_token_count_spends_nothing(fake_claude: FakeClaudeAPI, tmp_path: Any) -> None:
    """Bedrock's ``/count-tokens`` and Vertex's ``count-tokens:rawPredict`` are token counts as Messages'
    ``/count_tokens`` is: no ledger row, nothing spent (they had rows, by the path's spelling)."""
    config = f"""
auth: {{keys: [sk-dev]}}
store: {{url: "sqlite:///{tmp_path}/ledger.db", flush_interval_s: 0.05}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake_claude.base_url}"}}
models:
  "fake-*": {{targets: [{{provider: claude}}]}}
"""
    inner = json.dumps({"messages": KW["messages"], "max_tokens": 10})
    with run_gateway(config) as gw:
        bedrock = httpx.post(
            f"{gw.url}/model/fake-text/count-tokens", json={"input": {"invokeModel": {"body": inner}}}, headers=AUTH
        )
        assert bedrock.status_code == 200 and bedrock.json()["inputTokens"] > 0
        vertex = httpx.post(
            f"{gw.url}{VERTEX}/count-tokens:rawPredict", json={"model": "fake-text", **KW}, headers=AUTH
        )
        assert vertex.status_code == 200 and vertex.json()["input_tokens"] > 0
        first = httpx.post(f"{gw.url}/v1/messages/count_tokens", json={"model": "fake-text", **KW}, headers=AUTH)
        assert first.status_code == 200
        message = httpx.post(f"{gw.url}/v1/messages", json={"model": "fake-text", **KW}, headers=AUTH)
        assert message.status_code == 200
    with sqlite3.connect(tmp_path / "ledger.db") as db:  # the gateway has stopped: every row is flushed
        rows = db.execute("SELECT stream, input_tokens, output_tokens FROM requests").fetchall()
    usage = message.json()["usage"]
    assert rows == [(0, usage["input_tokens"], usage["output_tokens"])]  # the message, and only it

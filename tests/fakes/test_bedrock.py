"""Self-test of the fake Bedrock runtime against real clients: ``AnthropicBedrock`` (and the mantle and
Claude-Platform-on-AWS clients) from the anthropic SDK, and botocore's ``bedrock-runtime`` client."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import anthropic
import botocore.eventstream
import botocore.exceptions
import pytest
from anthropic import AnthropicAWS, AnthropicBedrock
from anthropic.lib.bedrock import AnthropicBedrockMantle
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from adapters._eventstream import EventStreamDecoder, EventStreamError

from .bedrock import (
    BEDROCK_NAMESPACE,
    BETA_FAMILIES,
    CORAL_NAMESPACE,
    INVALID_BETA_MESSAGE,
    INVOKE_FIELDS,
    METRICS_KEY,
    STATUS_SCENARIOS,
    STREAM_EXCEPTION_STATUS,
    STREAM_EXCEPTIONS,
    FakeBedrock,
    bdrk_ids,
    beta_family,
    converse_name,
    final_bedrock_message,
    scenario_name,
    stream_body,
    stream_plan,
)
from .claude_api import accumulate, final_message, get_scenario, sse_body

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
EXTRA: dict[str, Any] = {"anthropic_version": "bedrock-2023-05-31"}  # SDK 2.14 defaults to 2026-10-21
ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.{}-v1:0"
PAD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

CONVERSE_TEXT: list[dict[str, Any]] = [
    {"event": "messageStart", "payload": {"role": "assistant"}},
    {"event": "contentBlockDelta", "payload": {"contentBlockIndex": 0, "delta": {"text": "Hello"}}},
    {"event": "contentBlockDelta", "payload": {"contentBlockIndex": 0, "delta": {"text": " there"}}},
    {"event": "contentBlockStop", "payload": {"contentBlockIndex": 0}},
    {
        "event": "contentBlockStart",
        "payload": {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "get_time"}}},
    },
    {"event": "contentBlockDelta", "payload": {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"tz": '}}}},
    {"event": "contentBlockDelta", "payload": {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '"UTC"}'}}}},
    {"event": "contentBlockStop", "payload": {"contentBlockIndex": 1}},
    {"event": "messageStop", "payload": {"stopReason": "tool_use"}},
    {
        "event": "metadata",
        "payload": {"usage": {"inputTokens": 11, "outputTokens": 7, "totalTokens": 18}, "metrics": {"latencyMs": 42}},
    },
]
CONVERSE_THROTTLED: list[dict[str, Any]] = [
    {"event": "messageStart", "payload": {"role": "assistant"}},
    {"exception": "throttlingException", "payload": {"message": "Too many requests"}},
]


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeBedrock]:
    converse_dir = tmp_path_factory.mktemp("converse")
    (converse_dir / "nova-text.json").write_text(json.dumps(CONVERSE_TEXT))
    (converse_dir / "throttled.json").write_text(json.dumps(CONVERSE_THROTTLED))
    with FakeBedrock(converse_dir=converse_dir) as server:
        yield server


@pytest.fixture
def client(fake: FakeBedrock) -> Iterator[AnthropicBedrock]:
    fake.reset()
    fake.split_writes = None
    with AnthropicBedrock(
        aws_access_key=fake.credentials.access_key,
        aws_secret_key=fake.credentials.secret_key,
        aws_region=fake.region,
        base_url=fake.base_url,
        max_retries=0,
    ) as c:
        yield c


@pytest.fixture(scope="module")
def _boto_client(fake: FakeBedrock) -> Any:
    return fake.botocore_client()


@pytest.fixture
def boto(fake: FakeBedrock, _boto_client: Any) -> Any:
    fake.reset()
    return _boto_client


def _dump(message: Any) -> dict[str, Any]:
    return message.model_dump(warnings=False)  # type: ignore[no-any-return]


def _expected(message: dict[str, Any]) -> dict[str, Any]:
    """What the SDK's model of the ``Message`` dict dumps to (absent optional fields become None)."""
    return _dump(anthropic.types.Message.model_validate(message))


def _stream(client: Any, model: str, **kwargs: Any) -> tuple[Any, list[str]]:
    with client.messages.stream(model=model, max_tokens=64, messages=MESSAGES, **kwargs) as stream:
        types = [event.type for event in stream]
        return stream.get_final_message(), types


def _invoke_body(**extra: Any) -> bytes:
    return json.dumps({**EXTRA, "max_tokens": 16, "messages": MESSAGES, **extra}).encode()


def _signed_post(
    fake: FakeBedrock,
    path: str,
    body: bytes,
    *,
    service: str = "bedrock",
    credentials: Credentials | None = None,
    region: str | None = None,
    headers: dict[str, str] | None = None,
    when: datetime | None = None,
    send_path: str | None = None,
    send_body: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """Sign with botocore exactly like a client would, POST with the stdlib, return (status, headers, body)."""
    request = AWSRequest(
        method="POST",
        url=f"{fake.base_url}{path}",
        data=body,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    clock: AbstractContextManager[Any] = (
        mock.patch("botocore.auth.get_current_datetime", return_value=when) if when else nullcontext()
    )
    with clock:
        SigV4Auth(credentials or fake.credentials, service, region or fake.region).add_auth(request)
    return _post(fake, send_path or path, send_body if send_body is not None else body, dict(request.prepare().headers))


def _post(fake: FakeBedrock, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        resp_headers = {k.lower(): v for k, v in resp.getheaders()}
        try:
            data = resp.read()
        except http.client.IncompleteRead as exc:
            data = exc.partial
        return resp.status, resp_headers, data
    finally:
        conn.close()


def _raw_chunks(fake: FakeBedrock, path: str, body: bytes) -> tuple[bytes, list[bytes]]:
    """POST with a Bearer key over a bare socket; returns (response head, HTTP chunks as written)."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{fake.port}\r\nAuthorization: Bearer bedrock-api-key\r\n"
        f"Connection: close\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", fake.port), timeout=5) as sock:
        sock.sendall(request)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    chunks = []
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        chunks.append(rest[:size])
        rest = rest[size + 2 :]
    return head, chunks


def _boto_events(response: Any) -> list[dict[str, Any]]:
    return [json.loads(event["chunk"]["bytes"]) for event in response["body"]]


# -- model ids -> scenarios -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        ("fake-tools", "fake-tools"),
        ("anthropic.fake-tools-v1:0", "fake-tools"),
        ("us.anthropic.fake-citations-v1:0", "fake-citations"),
        ("global.anthropic.fake-thinking", "fake-thinking"),
        ("us-gov.anthropic.fake-text-d200-v1:0", "fake-text-d200"),
        ("apac.anthropic.fake-exc-throttlingException-v1:0", "fake-exc-throttlingException"),
        ("eu.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"),
        ("jp.anthropic.claude-sonnet-4-6", "claude-sonnet-4-6"),
        ("anthropic.fake-text:0", "fake-text"),
        (ARN.format("fake-split"), "fake-split"),
        ("arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3", "a1b2c3"),
    ],
)
def test_scenario_name(model_id: str, expected: str) -> None:
    assert scenario_name(model_id) == expected


def test_converse_name() -> None:
    assert converse_name("us.amazon.nova-text") == "nova-text"
    assert converse_name("meta.llama3-70b-instruct-v1:0") == "llama3-70b-instruct"
    assert converse_name("anthropic.converse-tools-v1:0") == "tools"
    assert converse_name("arn:aws:bedrock:us-east-1:1:inference-profile/eu.mistral.converse-x") == "x"


def test_unknown_model_is_fake_text_with_its_name() -> None:
    message = final_bedrock_message("us.anthropic.claude-sonnet-4-5-20250929-v1:0")
    assert message["model"] == "claude-sonnet-4-5-20250929"
    assert message["content"][0]["text"] == final_message("fake-text")["content"][0]["text"]


# -- AnthropicBedrock (SigV4 and Bearer) ------------------------------------------------------


@pytest.mark.parametrize("name", ["fake-text", "fake-citations", "fake-tools", "fake-thinking"])
def test_sdk_stream_matches_final_message(client: AnthropicBedrock, fake: FakeBedrock, name: str) -> None:
    model_id = f"us.anthropic.{name}-v1:0"
    streamed, types = _stream(client, model_id, extra_body=EXTRA)
    assert types[0] == "message_start"
    assert types[-1] == "message_stop"
    recorded = fake.requests[-1]
    assert (recorded.operation, recorded.auth, recorded.auth_error) == ("invoke-with-response-stream", "sigv4", None)
    assert recorded.signing_name == "bedrock"
    assert recorded.model_id == model_id
    assert recorded.scenario == name
    assert recorded.json["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in recorded.json
    assert "stream" not in recorded.json

    expected = bdrk_ids(final_message(name))
    raw = client.messages.with_raw_response.create(model=model_id, max_tokens=64, messages=MESSAGES, extra_body=EXTRA)
    assert raw.http_response.json() == expected
    assert _dump(streamed) == _dump(raw.parse()) == _expected(expected)
    assert streamed.id == expected["id"]
    assert streamed.id.startswith("msg_bdrk_")
    assert streamed.model == name
    for block in streamed.content:
        if block.type == "tool_use":
            assert block.id.startswith("toolu_bdrk_")
    headers = raw.http_response.headers
    assert headers["x-amzn-bedrock-input-token-count"] == str(expected["usage"]["input_tokens"])
    assert headers["x-amzn-bedrock-output-token-count"] == str(expected["usage"]["output_tokens"])
    assert int(headers["x-amzn-bedrock-invocation-latency"]) > 0
    assert len(headers["x-amzn-requestid"]) == 36
    assert fake.requests[-1].operation == "invoke"


def test_sdk_arn_with_percent_encoded_slash(client: AnthropicBedrock, fake: FakeBedrock) -> None:
    model_id = ARN.format("fake-thinking")
    streamed, _ = _stream(client, model_id, extra_body=EXTRA)
    assert _dump(streamed) == _expected(bdrk_ids(final_message("fake-thinking")))
    recorded = fake.requests[-1]
    assert recorded.auth_error is None
    assert "inference-profile%2Fus.anthropic" in recorded.raw_path  # SDK: '/' -> %2F, ':' literal
    assert recorded.raw_path.startswith("/model/arn:aws:bedrock:")
    assert recorded.model_id == model_id


def test_sdk_bearer(fake: FakeBedrock) -> None:
    fake.reset()
    with AnthropicBedrock(
        api_key="bedrock-api-key", aws_region="us-east-1", base_url=fake.base_url, max_retries=0
    ) as c:
        streamed, _ = _stream(c, "fake-tools", extra_body=EXTRA)
        assert streamed.stop_reason == "tool_use"
        assert fake.requests[-1].auth == "bearer"
        assert fake.requests[-1].headers["authorization"] == "Bearer bedrock-api-key"
        created = c.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES, extra_body=EXTRA)
        assert created.id == bdrk_ids(final_message("fake-text"))["id"]
    with (
        AnthropicBedrock(api_key="wrong", aws_region="us-east-1", base_url=fake.base_url, max_retries=0) as c,
        pytest.raises(anthropic.PermissionDeniedError) as info,
    ):
        c.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES, extra_body=EXTRA)
    assert info.value.response.headers["x-amzn-errortype"] == f"UnrecognizedClientException:{CORAL_NAMESPACE}"
    assert fake.requests[-1].auth_error == "UnrecognizedClientException"


def test_sdk_default_anthropic_version_is_rejected(client: AnthropicBedrock) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES)
    assert "anthropic_version" in str(info.value)
    assert info.value.response.headers["x-amzn-errortype"] == f"ValidationException:{BEDROCK_NAMESPACE}"


def test_sdk_wrong_secret(fake: FakeBedrock) -> None:
    with (
        AnthropicBedrock(
            aws_access_key=fake.credentials.access_key,
            aws_secret_key="not-the-secret",
            aws_region="us-east-1",
            base_url=fake.base_url,
            max_retries=0,
        ) as c,
        pytest.raises(anthropic.PermissionDeniedError) as info,
    ):
        _stream(c, "fake-text", extra_body=EXTRA)
    assert info.value.status_code == 403
    assert info.value.response.headers["x-amzn-errortype"] == f"InvalidSignatureException:{CORAL_NAMESPACE}"
    assert isinstance(info.value.body, dict)
    assert info.value.body["message"].startswith("The request signature we calculated does not match")


# -- request validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (_invoke_body(stream=True), "extraneous key [stream] is not permitted"),
        (_invoke_body(model="fake-text"), "extraneous key [model] is not permitted"),
        (json.dumps({"max_tokens": 8, "messages": MESSAGES}).encode(), "required key [anthropic_version] not found"),
        (_invoke_body(anthropic_version="2023-06-01"), "#/anthropic_version: 2023-06-01"),
        (_invoke_body(anthropic_beta="a,b"), "#/anthropic_beta: expected type: JSONArray"),
        (_invoke_body(anthropic_beta=["ok", 3]), "#/anthropic_beta/1: expected type: String"),
        (json.dumps({**EXTRA, "messages": MESSAGES}).encode(), "required key [max_tokens] not found"),
        (json.dumps({**EXTRA, "max_tokens": 8}).encode(), "required key [messages] not found"),
        (b"{not json", "Malformed input request"),
        (b"[1]", "expected type: JSONObject"),
    ],
)
@pytest.mark.parametrize("operation", ["invoke", "invoke-with-response-stream"])
def test_body_validation(fake: FakeBedrock, body: bytes, needle: str, operation: str) -> None:
    status, headers, data = _signed_post(fake, f"/model/fake-text/{operation}", body)
    assert status == 400
    assert headers["x-amzn-errortype"] == f"ValidationException:{BEDROCK_NAMESPACE}"
    assert needle in json.loads(data)["message"]


def test_valid_beta_list_is_accepted(fake: FakeBedrock) -> None:
    status, headers, data = _signed_post(
        fake, "/model/fake-text/invoke", _invoke_body(anthropic_beta=["context-1m-2025-08-07"])
    )
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert json.loads(data) == bdrk_ids(final_message("fake-text"))


# -- what Bedrock accepts (issue 32): refusals in Bedrock's shape, Claude Code's Bedrock mode accepted ----------

#: Claude Code 2.1.332 in its own Bedrock mode (../shared/claude-code-traffic.md, Bedrock-mode column).
CC_BEDROCK_HEADER_BETAS = "claude-code-20250219,effort-2025-11-24,thinking-token-count-2026-05-13"
CC_TOOLS: list[dict[str, Any]] = [
    {"name": "Read", "description": "read a file", "input_schema": {"type": "object"}, "defer_loading": True},
    {"name": "Bash", "description": "run a command", "input_schema": {"type": "object"}},
]
CC_BEDROCK_BODY: dict[str, Any] = {
    **EXTRA,
    "messages": MESSAGES,
    "system": [{"type": "text", "text": "You are Claude Code."}],
    "tools": CC_TOOLS,
    "metadata": {"user_id": "user_abc"},
    "max_tokens": 32000,
    "thinking": {"type": "adaptive"},
    "output_config": {"effort": "high"},
    "anthropic_beta": [
        "interleaved-thinking-2025-05-14",
        "tool-search-tool-2025-10-19",
        "thinking-token-count-2026-05-13",
    ],
}
#: What Claude Code sends only the first party (Messages mode), and betas no provider knows.
FIRST_PARTY_ONLY_BETAS = [
    "context-management-2025-06-27",
    "per-turn-control-2026-07-01",
    "mid-conversation-tool-changes-2026-07-01",
    "advanced-tool-use-2025-11-20",
    "request-tags-2026-08-21",
    "extended-cache-ttl-2025-04-11",
    "evil-beta-2099-01-01",
]


def test_beta_family() -> None:
    assert beta_family("effort-2025-11-24") == beta_family("effort-2026-02-01") == "effort"
    assert beta_family("claude-code-20250219") == "claude-code"
    assert beta_family("context-1m-2025-08-07") == "context-1m"
    assert beta_family("output-128k-2025-02-19") == "output-128k"
    assert beta_family("no-date") == "no-date"


@pytest.mark.parametrize("operation", ["invoke", "invoke-with-response-stream"])
def test_claude_codes_bedrock_mode_request_is_accepted(fake: FakeBedrock, operation: str) -> None:
    fake.reset()
    headers = {"anthropic-beta": CC_BEDROCK_HEADER_BETAS}
    status, _, data = _signed_post(
        fake, f"/model/us.anthropic.fake-text-v1:0/{operation}", json.dumps(CC_BEDROCK_BODY).encode(), headers=headers
    )
    assert status == 200, data
    assert fake.requests[-1].refusal is None and fake.requests[-1].refused == ()
    assert fake.refusals == []


def test_every_documented_field_and_beta_family_is_accepted(fake: FakeBedrock) -> None:
    body: dict[str, Any] = {
        **CC_BEDROCK_BODY,
        "stop_sequences": ["END"],
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 5,
        "tool_choice": {"type": "auto"},
        "output_format": {"type": "json_schema", "schema": {"type": "object"}},
        "anthropic_beta": [f"{family}-2025-01-01" for family in sorted(BETA_FAMILIES)],
    }
    assert set(body) == INVOKE_FIELDS
    status, _, data = _signed_post(fake, "/model/fake-text/invoke", json.dumps(body).encode())
    assert status == 200, data


@pytest.mark.parametrize("beta", FIRST_PARTY_ONLY_BETAS)
@pytest.mark.parametrize("operation", ["invoke", "invoke-with-response-stream"])
def test_an_unknown_beta_is_an_invalid_beta_flag(fake: FakeBedrock, beta: str, operation: str) -> None:
    fake.reset()
    body = {**CC_BEDROCK_BODY, "anthropic_beta": ["interleaved-thinking-2025-05-14", beta]}
    status, headers, data = _signed_post(fake, f"/model/fake-text/{operation}", json.dumps(body).encode())
    assert status == 400
    assert headers["x-amzn-errortype"] == f"ValidationException:{BEDROCK_NAMESPACE}"
    assert json.loads(data) == {"message": INVALID_BETA_MESSAGE}
    assert (fake.requests[-1].refusal, fake.requests[-1].refused) == (INVALID_BETA_MESSAGE, (f"beta:{beta}",))
    assert fake.refusals == [fake.requests[-1]]


def test_web_search_is_a_vertex_beta_not_a_bedrock_one(fake: FakeBedrock) -> None:
    body = {**CC_BEDROCK_BODY, "anthropic_beta": ["web-search-2025-03-05"]}
    status, _, data = _signed_post(fake, "/model/fake-text/invoke", json.dumps(body).encode())
    assert (status, json.loads(data)) == (400, {"message": INVALID_BETA_MESSAGE})


@pytest.mark.parametrize("key", ["model", "stream", "context_management", "tags", "safeguards", "container"])
def test_an_unknown_top_level_key_is_extraneous(fake: FakeBedrock, key: str) -> None:
    fake.reset()
    body = {**CC_BEDROCK_BODY, key: {"edits": []} if key == "context_management" else True}
    status, headers, data = _signed_post(fake, "/model/fake-text/invoke", json.dumps(body).encode())
    assert status == 400
    assert headers["x-amzn-errortype"] == f"ValidationException:{BEDROCK_NAMESPACE}"
    message = json.loads(data)["message"]
    assert message == (
        f"Malformed input request: #: extraneous key [{key}] is not permitted, please reformat your input and try "
        "again."
    )
    assert (fake.requests[-1].refusal, fake.requests[-1].refused) == (message, (f"field:{key}",))


def test_eager_input_streaming_in_a_tool_is_extraneous(fake: FakeBedrock) -> None:
    fake.reset()
    tools = [*CC_TOOLS, {"name": "Edit", "input_schema": {"type": "object"}, "eager_input_streaming": True}]
    body = {**CC_BEDROCK_BODY, "tools": tools, "tags": ["a"]}
    status, _, data = _signed_post(fake, "/model/fake-text/invoke-with-response-stream", json.dumps(body).encode())
    assert status == 400
    message = json.loads(data)["message"]
    assert "#: extraneous key [tags] is not permitted" in message
    assert "#/tools/2: extraneous key [eager_input_streaming] is not permitted" in message
    assert fake.requests[-1].refused == ("field:tags", "tool_field:eager_input_streaming")


def test_invoke_reads_betas_from_the_body_only(fake: FakeBedrock) -> None:
    """The ``anthropic-beta`` header is not InvokeModel's: Claude Code sends it there, Bedrock does not read it."""
    headers = {"anthropic-beta": "context-management-2025-06-27"}
    status, _, data = _signed_post(fake, "/model/fake-text/invoke", _invoke_body(), headers=headers)
    assert status == 200, data


def test_count_tokens_checks_the_inner_invoke_body(boto: Any, fake: FakeBedrock) -> None:
    counting = {key: v for key, v in CC_BEDROCK_BODY.items() if key != "anthropic_beta"}
    counting["anthropic_beta"] = ["claude-code-20250219", "interleaved-thinking-2025-05-14"]
    body = json.dumps(counting).encode()
    assert boto.count_tokens(modelId="fake-text", input={"invokeModel": {"body": body}})["inputTokens"] > 3
    for inner, refused in (
        ({**counting, "anthropic_beta": ["context-management-2025-06-27"]}, "beta:context-management-2025-06-27"),
        ({**counting, "context_management": {"edits": []}}, "field:context_management"),
    ):
        with pytest.raises(botocore.exceptions.ClientError) as info:
            boto.count_tokens(modelId="fake-text", input={"invokeModel": {"body": json.dumps(inner).encode()}})
        assert info.value.response["Error"]["Code"] == "ValidationException"
        assert fake.requests[-1].operation == "count-tokens"
        assert fake.requests[-1].refused == (refused,)
        assert info.value.response["Error"]["Message"] == fake.requests[-1].refusal


def test_converse_betas_follow_the_same_rule(boto: Any, fake: FakeBedrock) -> None:
    request: dict[str, Any] = {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}
    good = {"anthropic_beta": ["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"]}
    assert boto.converse(modelId="us.amazon.nova-text", additionalModelRequestFields=good, **request)
    bad = {"anthropic_beta": ["interleaved-thinking-2025-05-14", "advanced-tool-use-2025-11-20"]}
    for call in (boto.converse, boto.converse_stream):
        with pytest.raises(botocore.exceptions.ClientError) as info:
            call(modelId="us.amazon.nova-text", additionalModelRequestFields=bad, **request)
        assert info.value.response["Error"]["Code"] == "ValidationException"
        assert info.value.response["Error"]["Message"] == INVALID_BETA_MESSAGE
        assert fake.requests[-1].refused == ("beta:advanced-tool-use-2025-11-20",)
    converse_count = {**request, "additionalModelRequestFields": bad}
    with pytest.raises(botocore.exceptions.ClientError) as info:
        boto.count_tokens(modelId="fake-text", input={"converse": converse_count})
    assert info.value.response["Error"]["Message"] == INVALID_BETA_MESSAGE


def _mantle_post(fake: FakeBedrock, body: dict[str, Any], betas: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": "Bearer bedrock-api-key", "Content-Type": "application/json"}
    if betas is not None:
        headers["anthropic-beta"] = betas
    status, _, data = _post(fake, "/anthropic/v1/messages", json.dumps(body).encode(), headers)
    return status, json.loads(data) if data.startswith(b"{") else {}


MANTLE_BODY: dict[str, Any] = {
    **{k: v for k, v in CC_BEDROCK_BODY.items() if k not in ("anthropic_version", "anthropic_beta")},
    "model": "fake-text",
    "stream": True,
}


def test_mantle_accepts_claude_codes_cloud_request(fake: FakeBedrock) -> None:
    fake.reset()
    betas = "claude-code-20250219,interleaved-thinking-2025-05-14,tool-search-tool-2025-10-19,effort-2025-11-24"
    assert _mantle_post(fake, MANTLE_BODY, betas)[0] == 200
    assert _mantle_post(fake, {**MANTLE_BODY, "stream": False}, betas)[0] == 200
    assert fake.refusals == []


@pytest.mark.parametrize(
    ("change", "betas", "message", "refused"),
    [
        (
            {},
            "claude-code-20250219,context-management-2025-06-27",
            "Unexpected value(s) `context-management-2025-06-27` for the `anthropic-beta` header. Please consult our "
            "documentation at docs.anthropic.com or try again without the header.",
            ("beta:context-management-2025-06-27",),
        ),
        (
            {"context_management": {"edits": []}},
            None,
            "context_management: Extra inputs are not permitted",
            ("field:context_management",),
        ),
        ({"tags": ["a"]}, None, "tags: Extra inputs are not permitted", ("field:tags",)),
        (
            {"tools": [{**CC_TOOLS[1], "eager_input_streaming": True}]},
            None,
            "tools.0.eager_input_streaming: Extra inputs are not permitted",
            ("tool_field:eager_input_streaming",),
        ),
    ],
)
def test_mantle_refusals_are_in_the_anthropic_envelope(
    fake: FakeBedrock, change: dict[str, Any], betas: str | None, message: str, refused: tuple[str, ...]
) -> None:
    fake.reset()
    status, error = _mantle_post(fake, {**MANTLE_BODY, **change}, betas)
    assert status == 400
    assert error["type"] == "error"
    assert error["error"] == {"type": "invalid_request_error", "message": message}
    assert (fake.requests[-1].refusal, fake.requests[-1].refused) == (message, refused)


def test_claude_platform_on_aws_refuses_nothing(fake: FakeBedrock) -> None:
    """The first party hosted on AWS: every beta and field passes (the protocol's rule)."""
    body = {**MANTLE_BODY, "stream": False, "context_management": {"edits": []}, "tags": ["a"]}
    headers = {
        "x-api-key": "bedrock-api-key",
        "anthropic-workspace-id": "w",
        "anthropic-beta": "context-management-2025-06-27,evil-beta-2099-01-01",
    }
    status, _, data = _post(fake, "/v1/messages", json.dumps(body).encode(), headers)
    assert status == 200, data


def test_strict_false_keeps_only_the_schema_checks(tmp_path: Path) -> None:
    with FakeBedrock(strict=False) as lenient:
        body = {**CC_BEDROCK_BODY, "anthropic_beta": ["evil-beta-2099-01-01"], "context_management": {}}
        assert _signed_post(lenient, "/model/fake-text/invoke", json.dumps(body).encode())[0] == 200
        status, _, data = _signed_post(lenient, "/model/fake-text/invoke", _invoke_body(model="fake-text"))
        assert status == 400 and "extraneous key [model]" in json.loads(data)["message"]
        assert _mantle_post(lenient, {**MANTLE_BODY, "tags": []}, "evil-beta-2099-01-01")[0] == 200
        assert lenient.refusals == [lenient.requests[1]]  # the schema refusal is recorded too


# -- botocore client --------------------------------------------------------------------------


def test_botocore_stream_with_arn(boto: Any, fake: FakeBedrock) -> None:
    model_id = ARN.format("fake-tools")
    response = boto.invoke_model_with_response_stream(modelId=model_id, body=_invoke_body())
    assert response["contentType"] == "application/json"
    headers = response["ResponseMetadata"]["HTTPHeaders"]
    assert headers["content-type"] == "application/vnd.amazon.eventstream"
    events = _boto_events(response)
    assert accumulate(events) == bdrk_ids(final_message("fake-tools"))
    assert events[-1][METRICS_KEY]["inputTokenCount"] == 412
    assert events[-1][METRICS_KEY]["outputTokenCount"] == 156
    recorded = fake.requests[-1]
    assert recorded.auth == "sigv4"
    assert recorded.auth_error is None
    # botocore percent-encodes the label (':' too) and signs the path encoded once more
    assert "arn%3Aaws%3Abedrock%3Aus-east-1" in recorded.raw_path
    assert "inference-profile%2Fus.anthropic.fake-tools-v1%3A0" in recorded.raw_path
    assert recorded.model_id == model_id

    response = boto.invoke_model(modelId=model_id, body=_invoke_body())
    assert json.loads(response["body"].read()) == bdrk_ids(final_message("fake-tools"))
    headers = response["ResponseMetadata"]["HTTPHeaders"]
    assert headers["x-amzn-bedrock-output-token-count"] == "156"


def test_botocore_count_tokens(boto: Any, fake: FakeBedrock) -> None:
    body = _invoke_body(system="be brief")
    counted = boto.count_tokens(modelId=ARN.format("fake-text"), input={"invokeModel": {"body": body}})
    assert counted["inputTokens"] == len(body) // 4 + 3
    recorded = fake.requests[-1]
    assert recorded.operation == "count-tokens"
    assert recorded.inner_json == json.loads(body)
    assert base64.b64decode(recorded.json["input"]["invokeModel"]["body"]) == body
    with pytest.raises(botocore.exceptions.ClientError) as info:
        boto.count_tokens(modelId="anthropic.fake-nocount-v1:0", input={"invokeModel": {"body": body}})
    assert info.value.response["Error"]["Code"] == "ValidationException"
    assert info.value.response["Error"]["Message"] == "The provided model doesn't support counting tokens."
    with pytest.raises(botocore.exceptions.ClientError) as info:
        boto.count_tokens(modelId="fake-text", input={"invokeModel": {"body": _invoke_body(stream=True)}})
    assert "extraneous key [stream]" in info.value.response["Error"]["Message"]


# -- signatures -------------------------------------------------------------------------------


def _sig_case(name: str, fake: FakeBedrock) -> tuple[int, dict[str, str], bytes]:
    path, body = "/model/fake-text/invoke", _invoke_body()
    creds = fake.credentials
    if name == "wrong-secret":
        return _signed_post(fake, path, body, credentials=Credentials(creds.access_key, "nope"))
    if name == "unknown-key":
        return _signed_post(fake, path, body, credentials=Credentials("AKIDUNKNOWN", creds.secret_key))
    if name == "wrong-region":
        return _signed_post(fake, path, body, region="eu-west-1")
    if name == "wrong-service":
        return _signed_post(fake, path, body, service="bedrock-runtime")
    if name == "expired":
        return _signed_post(fake, path, body, when=datetime.now(UTC) - timedelta(minutes=10))
    if name == "tampered-body":
        return _signed_post(fake, path, body, send_body=body.replace(b"16", b"17"))
    if name == "tampered-path":
        return _signed_post(fake, path, body, send_path="/model/fake-tools/invoke")
    if name == "decoded-arn-path":  # signing the ARN's '/' literally is not what was sent
        arn = ARN.format("fake-text").replace(":", "%3A")
        return _signed_post(fake, f"/model/{arn}/invoke", body, send_path=f"/model/{arn.replace('/', '%2F')}/invoke")
    if name == "bad-content-sha":
        return _signed_post(fake, path, body, headers={"X-Amz-Content-SHA256": "0" * 64})
    if name == "unexpected-token":
        return _signed_post(fake, path, body, credentials=Credentials(creds.access_key, creds.secret_key, "tok"))
    assert name == "missing"
    return _post(fake, path, body, {"Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("wrong-secret", "InvalidSignatureException"),
        ("unknown-key", "UnrecognizedClientException"),
        ("wrong-region", "InvalidSignatureException"),
        ("wrong-service", "InvalidSignatureException"),
        ("expired", "InvalidSignatureException"),
        ("tampered-body", "InvalidSignatureException"),
        ("tampered-path", "InvalidSignatureException"),
        ("decoded-arn-path", "InvalidSignatureException"),
        ("bad-content-sha", "InvalidSignatureException"),
        ("unexpected-token", "UnrecognizedClientException"),
        ("missing", "UnrecognizedClientException"),
    ],
)
def test_signature_failures(fake: FakeBedrock, case: str, error: str) -> None:
    fake.reset()
    status, headers, data = _sig_case(case, fake)
    assert status == 403, data
    assert headers["x-amzn-errortype"] == f"{error}:{CORAL_NAMESPACE}"
    assert set(json.loads(data)) == {"message"}
    assert fake.requests[-1].auth_error == error


def test_signed_arn_path_and_fresh_clock_verify(fake: FakeBedrock) -> None:
    arn = ARN.format("fake-text").replace(":", "%3A").replace("/", "%2F")
    status, _, data = _signed_post(fake, f"/model/{arn}/invoke", _invoke_body())
    assert status == 200, data
    when = datetime.now(UTC) - timedelta(minutes=4)
    status, _, data = _signed_post(fake, "/model/fake-text/invoke", _invoke_body(), when=when)
    assert status == 200, data


def test_session_token() -> None:
    with FakeBedrock(session_token="session-tok", region="eu-west-1") as fake:
        kwargs: dict[str, Any] = {
            "aws_access_key": fake.credentials.access_key,
            "aws_secret_key": fake.credentials.secret_key,
            "aws_region": "eu-west-1",
            "base_url": fake.base_url,
            "max_retries": 0,
        }
        with AnthropicBedrock(aws_session_token="session-tok", **kwargs) as c:
            message = c.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES, extra_body=EXTRA)
            assert message.stop_reason == "end_turn"
        assert fake.requests[-1].headers["x-amz-security-token"] == "session-tok"
        for token in (None, "other-tok"):
            with (
                AnthropicBedrock(aws_session_token=token, **kwargs) as c,
                pytest.raises(anthropic.PermissionDeniedError),
            ):
                c.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES, extra_body=EXTRA)
            assert fake.requests[-1].auth_error == "UnrecognizedClientException"
        events = _boto_events(
            fake.botocore_client().invoke_model_with_response_stream(modelId="fake-text", body=_invoke_body())
        )
        assert events[-1]["type"] == "message_stop"


# -- wire format ------------------------------------------------------------------------------


def test_raw_frames(fake: FakeBedrock) -> None:
    head, chunks = _raw_chunks(fake, "/model/us.anthropic.fake-text-v1:0/invoke-with-response-stream", _invoke_body())
    head_lower = head.lower()
    assert b"content-type: application/vnd.amazon.eventstream" in head_lower
    assert b"x-amzn-bedrock-content-type: application/json" in head_lower
    assert b"x-amzn-requestid: " in head_lower
    assert b"transfer-encoding: chunked" in head_lower
    assert b"".join(chunks) == stream_body("fake-text")
    decoder = EventStreamDecoder()
    events, pads = [], []
    for chunk in chunks:  # one frame per write
        (message,) = decoder.feed(chunk)
        assert message.headers == {
            ":event-type": "chunk",
            ":content-type": "application/json",
            ":message-type": "event",
        }
        payload = json.loads(message.payload)
        assert set(payload) == {"bytes", "p"}
        assert PAD.startswith(payload["p"])
        pads.append(len(payload["p"]))
        raw_event = base64.b64decode(payload["bytes"])
        event = json.loads(raw_event)
        assert raw_event == json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()  # compact
        events.append(event)
    assert len(set(pads)) > 3
    expected = bdrk_ids(get_scenario("fake-text").events)
    assert events[:-1] == expected[:-1]
    assert events[-1] == {
        "type": "message_stop",
        METRICS_KEY: {
            "inputTokenCount": 21,
            "outputTokenCount": final_message("fake-text")["usage"]["output_tokens"],
            "invocationLatency": events[-1][METRICS_KEY]["invocationLatency"],
            "firstByteLatency": events[-1][METRICS_KEY]["firstByteLatency"],
        },
    }
    assert events == stream_plan("fake-text").events


# -- Bedrock-only stream scenarios ------------------------------------------------------------


@pytest.mark.parametrize("exception", list(STREAM_EXCEPTIONS))
def test_stream_exceptions(boto: Any, fake: FakeBedrock, exception: str) -> None:
    model_id = f"us.anthropic.fake-exc-{exception}-v1:0"
    response = boto.invoke_model_with_response_stream(modelId=model_id, body=_invoke_body())
    seen: list[dict[str, Any]] = []
    with pytest.raises(botocore.exceptions.EventStreamError) as info:
        for event in response["body"]:
            seen.append(json.loads(event["chunk"]["bytes"]))
    assert info.value.response["Error"]["Code"] == exception
    assert info.value.response["Error"]["Message"] == STREAM_EXCEPTIONS[exception]["message"]
    assert [e["type"] for e in seen] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
    ]
    (*_, last) = EventStreamDecoder().feed(stream_body(model_id))
    assert last.headers == {
        ":exception-type": exception,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    assert json.loads(last.payload) == STREAM_EXCEPTIONS[exception]
    with pytest.raises(botocore.exceptions.ClientError) as err:
        boto.invoke_model(modelId=model_id, body=_invoke_body())
    name = STREAM_EXCEPTION_STATUS[exception]
    assert err.value.response["Error"]["Code"] == name
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == STATUS_SCENARIOS[f"fake-status-{name}"][0]


def test_model_stream_error_payload() -> None:
    (*_, last) = EventStreamDecoder().feed(stream_body("fake-exc-modelStreamErrorException"))
    payload = json.loads(last.payload)
    assert set(payload) == {"message", "originalStatusCode", "originalMessage"}


def test_sdk_sees_exception_frame_as_error(client: AnthropicBedrock) -> None:
    with pytest.raises(anthropic.APIStatusError) as info:
        _stream(client, "fake-exc-throttlingException", extra_body=EXTRA)
    assert str(info.value.type) == "throttlingException"  # the SDK passes the exception name through


def test_unmodeled_error(boto: Any) -> None:
    response = boto.invoke_model_with_response_stream(modelId="fake-error-unmodeled", body=_invoke_body())
    with pytest.raises(botocore.exceptions.EventStreamError) as info:
        list(response["body"])
    assert info.value.response["Error"]["Code"] == "InternalFailure"
    (*_, last) = EventStreamDecoder().feed(stream_body("fake-error-unmodeled"))
    assert last.headers[":message-type"] == "error"
    assert last.payload == b""


def test_bad_crc(boto: Any, client: AnthropicBedrock) -> None:
    response = boto.invoke_model_with_response_stream(modelId="us.anthropic.fake-bad-crc-v1:0", body=_invoke_body())
    seen = []
    with pytest.raises(botocore.eventstream.ChecksumMismatch):
        for event in response["body"]:
            seen.append(event)
    assert len(seen) == 5
    decoder = EventStreamDecoder()
    plan = stream_plan("fake-bad-crc")
    for frame in plan.frames[:5]:
        decoder.feed(frame.data)
    with pytest.raises(EventStreamError, match="message CRC"):
        decoder.feed(plan.frames[5].data)
    assert EventStreamDecoder().feed(plan.frames[6].data)  # later frames are valid again
    with pytest.raises(botocore.eventstream.ChecksumMismatch):
        _stream(client, "fake-bad-crc", extra_body=EXTRA)


def test_split_writes(fake: FakeBedrock, client: AnthropicBedrock, boto: Any) -> None:
    _, chunks = _raw_chunks(fake, "/model/fake-split/invoke-with-response-stream", _invoke_body())
    assert all(1 <= len(c) <= 7 for c in chunks)
    assert len(chunks) > 200
    assert b"".join(chunks) == stream_body("fake-split")
    streamed, _ = _stream(client, "fake-split", extra_body=EXTRA)
    assert _dump(streamed)["content"] == _expected(final_message("fake-text"))["content"]
    events = _boto_events(boto.invoke_model_with_response_stream(modelId="fake-split", body=_invoke_body()))
    assert accumulate(events) == final_bedrock_message("fake-split")
    fake.split_writes = 7  # the knob works for any scenario
    try:
        _, chunks = _raw_chunks(fake, "/model/fake-citations/invoke-with-response-stream", _invoke_body())
        assert max(len(c) for c in chunks) <= 7
        streamed, _ = _stream(client, "fake-citations", extra_body=EXTRA)
        assert _dump(streamed)["content"][9]["citations"][0]["type"] == "web_search_result_location"
    finally:
        fake.split_writes = None


def test_cut_frame(boto: Any, client: AnthropicBedrock) -> None:
    response = boto.invoke_model_with_response_stream(modelId="fake-cut-frame", body=_invoke_body())
    seen = []
    with pytest.raises(Exception, match=r"ended prematurely|IncompleteRead|incomplete"):
        for event in response["body"]:
            seen.append(event)
    assert len(seen) == 4
    with pytest.raises(Exception, match="incomplete chunked read"):
        _stream(client, "fake-cut-frame", extra_body=EXTRA)
    decoder = EventStreamDecoder()
    assert len(decoder.feed(stream_body("fake-cut-frame"))) == 4
    with pytest.raises(EventStreamError):
        decoder.close()


def test_metrics_mismatch(boto: Any) -> None:
    events = _boto_events(boto.invoke_model_with_response_stream(modelId="fake-metrics-mismatch", body=_invoke_body()))
    canonical = accumulate(events)
    assert canonical is not None
    assert events[-1][METRICS_KEY]["outputTokenCount"] == canonical["usage"]["output_tokens"] + 5
    assert events[-1][METRICS_KEY]["inputTokenCount"] == canonical["usage"]["input_tokens"]
    response = boto.invoke_model(modelId="fake-metrics-mismatch", body=_invoke_body())
    output_tokens = canonical["usage"]["output_tokens"] + 5
    assert response["ResponseMetadata"]["HTTPHeaders"]["x-amzn-bedrock-output-token-count"] == str(output_tokens)


def test_error_chunk(boto: Any, client: AnthropicBedrock) -> None:
    events = _boto_events(boto.invoke_model_with_response_stream(modelId="fake-error-chunk", body=_invoke_body()))
    assert events[-1] == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert len(events) == 5
    with pytest.raises(anthropic.APIStatusError) as info:
        _stream(client, "fake-error-chunk", extra_body=EXTRA)
    assert info.value.type == "overloaded_error"


def test_slow_disconnect(client: AnthropicBedrock, fake: FakeBedrock) -> None:
    started = time.monotonic()
    with client.messages.stream(model="fake-slow", max_tokens=8, messages=MESSAGES, extra_body=EXTRA) as stream:
        for i, _event in enumerate(stream):
            if i >= 4:
                break
    assert fake.wait_for_disconnect(timeout=5)
    assert fake.disconnects == 1
    assert time.monotonic() - started < 3
    _, types = _stream(client, "fake-slow-d3", extra_body=EXTRA)
    assert types.count("text") == 3


# -- status scenarios -------------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["invoke", "invoke-with-response-stream"])
@pytest.mark.parametrize("scenario", list(STATUS_SCENARIOS))
def test_status_scenarios(fake: FakeBedrock, boto: Any, scenario: str, operation: str) -> None:
    status, name, message = STATUS_SCENARIOS[scenario]
    got, headers, data = _signed_post(fake, f"/model/us.anthropic.{scenario}-v1:0/{operation}", _invoke_body())
    assert got == status
    assert headers["x-amzn-errortype"] == f"{name}:{BEDROCK_NAMESPACE}"
    assert json.loads(data) == {"message": message}
    assert len(headers["x-amzn-requestid"]) == 36
    call = boto.invoke_model if operation == "invoke" else boto.invoke_model_with_response_stream
    with pytest.raises(botocore.exceptions.ClientError) as info:
        call(modelId=scenario, body=_invoke_body())
    assert info.value.response["Error"]["Code"] == name
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == status


def test_sdk_status_classes(client: AnthropicBedrock) -> None:
    cases = {
        "fake-status-ThrottlingException": anthropic.RateLimitError,
        "fake-status-AccessDeniedException": anthropic.PermissionDeniedError,
        "fake-status-ServiceUnavailableException": anthropic.ServiceUnavailableError,
        "fake-status-ModelTimeoutException": anthropic.APIStatusError,
    }
    for model, cls in cases.items():
        with pytest.raises(cls) as info:
            _stream(client, model, extra_body=EXTRA)
        assert info.value.status_code == STATUS_SCENARIOS[model][0]


# -- Converse ---------------------------------------------------------------------------------


def test_converse_stream(boto: Any, fake: FakeBedrock) -> None:
    request: dict[str, Any] = {
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "inferenceConfig": {"maxTokens": 32},
    }
    response = boto.converse_stream(modelId="us.amazon.nova-text", **request)
    events = list(response["stream"])
    assert [next(iter(e)) for e in events] == [entry["event"] for entry in CONVERSE_TEXT]
    assert events[1]["contentBlockDelta"]["delta"]["text"] == "Hello"
    assert events[-1]["metadata"]["usage"]["totalTokens"] == 18
    recorded = fake.requests[-1]
    assert recorded.operation == "converse-stream"
    assert recorded.json == request

    converse = boto.converse(modelId="us.amazon.nova-text", **request)
    assert converse["output"]["message"]["content"] == [
        {"text": "Hello there"},
        {"toolUse": {"toolUseId": "tooluse_1", "name": "get_time", "input": {"tz": "UTC"}}},
    ]
    assert converse["stopReason"] == "tool_use"
    assert converse["usage"]["inputTokens"] == 11
    assert converse["metrics"]["latencyMs"] == 42


def test_converse_failures(boto: Any) -> None:
    response = boto.converse_stream(modelId="amazon.converse-throttled", messages=[])
    with pytest.raises(botocore.exceptions.EventStreamError) as info:
        list(response["stream"])
    assert info.value.response["Error"]["Code"] == "throttlingException"
    with pytest.raises(botocore.exceptions.ClientError) as err:
        boto.converse(modelId="amazon.converse-throttled", messages=[])
    assert err.value.response["Error"]["Code"] == "ThrottlingException"
    with pytest.raises(botocore.exceptions.ClientError) as err:
        boto.converse(modelId="amazon.no-such-fixture", messages=[])
    assert err.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(botocore.exceptions.ClientError) as err:
        boto.converse(modelId="fake-status-ThrottlingException", messages=[])
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429


# -- first-party AWS surfaces -----------------------------------------------------------------


def test_mantle(fake: FakeBedrock) -> None:
    fake.reset()
    mantle_url = f"{fake.base_url}/anthropic"
    with AnthropicBedrockMantle(
        aws_access_key=fake.credentials.access_key,
        aws_secret_key=fake.credentials.secret_key,
        aws_region="us-east-1",
        base_url=mantle_url,
        max_retries=0,
    ) as c:
        streamed, _ = _stream(c, "fake-tools")
        raw = c.messages.with_raw_response.create(model="fake-tools", max_tokens=64, messages=MESSAGES)
        assert raw.http_response.json() == final_message("fake-tools")  # first-party ids, model kept
        assert _dump(streamed) == _dump(raw.parse())
        assert c.messages.count_tokens(model="fake-text", messages=MESSAGES).input_tokens > 3
    recorded = fake.requests[0]
    assert (recorded.surface, recorded.auth, recorded.signing_name) == ("bedrock-mantle", "sigv4", "bedrock-mantle")
    assert recorded.raw_path == "/anthropic/v1/messages"
    assert recorded.json["model"] == "fake-tools"
    with AnthropicBedrockMantle(api_key="bedrock-api-key", base_url=mantle_url, max_retries=0) as c:
        assert c.messages.create(model="fake-thinking", max_tokens=8, messages=MESSAGES).content[0].type == "thinking"
        with pytest.raises(anthropic.RateLimitError):
            c.messages.create(model="fake-status-429", max_tokens=8, messages=MESSAGES)
    assert fake.requests[-1].auth == "bearer"
    body = json.dumps({"model": "fake-citations", "max_tokens": 8, "stream": True, "messages": MESSAGES}).encode()
    status, headers, data = _post(
        fake,
        "/anthropic/v1/messages",
        body,
        {"Authorization": "Bearer bedrock-api-key", "Content-Type": "application/json"},
    )
    assert (status, data) == (200, sse_body("fake-citations"))
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    status, headers, _ = _signed_post(fake, "/anthropic/v1/messages", body, service="bedrock")
    assert status == 403
    assert headers["x-amzn-errortype"].startswith("InvalidSignatureException:")


def test_claude_platform_on_aws(fake: FakeBedrock) -> None:
    fake.reset()
    with AnthropicAWS(
        aws_access_key=fake.credentials.access_key,
        aws_secret_key=fake.credentials.secret_key,
        aws_region="us-east-1",
        workspace_id="wrkspc_fake",
        base_url=fake.base_url,
        max_retries=0,
    ) as c:
        streamed, _ = _stream(c, "fake-thinking")
        assert _dump(streamed) == _expected(final_message("fake-thinking"))
    recorded = fake.requests[-1]
    assert (recorded.surface, recorded.auth, recorded.signing_name) == (
        "aws-external-anthropic",
        "sigv4",
        "aws-external-anthropic",
    )
    assert recorded.headers["anthropic-workspace-id"] == "wrkspc_fake"
    with AnthropicAWS(
        api_key="bedrock-api-key", workspace_id="wrkspc_fake", base_url=fake.base_url, max_retries=0
    ) as c:
        assert c.messages.create(model="fake-text", max_tokens=8, messages=MESSAGES).id.startswith("msg_fake_")
    assert fake.requests[-1].auth in ("bearer", "api-key")
    body = json.dumps({"model": "fake-text", "max_tokens": 8, "messages": MESSAGES}).encode()
    status, _, data = _post(fake, "/v1/messages", body, {"x-api-key": "bedrock-api-key"})
    assert status == 400
    assert json.loads(data)["error"]["type"] == "invalid_request_error"
    assert "anthropic-workspace-id" in json.loads(data)["error"]["message"]
    status, _, data = _post(fake, "/v1/messages", body, {"x-api-key": "bedrock-api-key", "anthropic-workspace-id": "w"})
    assert status == 200
    assert json.loads(data) == final_message("fake-text")
    assert fake.requests[-1].auth == "api-key"
    status, headers, _ = _signed_post(
        fake, "/v1/messages", body, service="bedrock-mantle", headers={"anthropic-workspace-id": "w"}
    )
    assert status == 403
    assert headers["x-amzn-errortype"] == f"InvalidSignatureException:{CORAL_NAMESPACE}"
    status, _, _ = _signed_post(
        fake, "/v1/messages", body, service="aws-external-anthropic", headers={"anthropic-workspace-id": "w"}
    )
    assert status == 200


# -- bookkeeping ------------------------------------------------------------------------------


def test_unknown_route_and_reset(fake: FakeBedrock) -> None:
    fake.reset()
    status, headers, _ = _signed_post(fake, "/model/fake-text/unknown-op", _invoke_body())
    assert status == 404
    assert headers["x-amzn-errortype"].startswith("UnknownOperationException:")
    assert len(fake.requests) == 1
    assert fake.requests[0].operation is None
    fake.reset()
    assert fake.requests == []
    assert fake.disconnects == 0


def test_converse_dir_is_optional(tmp_path: Path) -> None:
    with FakeBedrock() as fake:
        with pytest.raises(botocore.exceptions.ClientError) as err:
            fake.botocore_client().converse(modelId="amazon.nova-text", messages=[])
        assert err.value.response["Error"]["Code"] == "ValidationException"

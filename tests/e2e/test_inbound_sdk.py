"""The Bedrock- and Vertex-shaped inbound routes (``surfaces/``) with the SDK's own cloud clients: ``AnthropicBedrock``
(a bearer ``api_key``) and ``AnthropicVertex`` (an ``access_token``) pointed at the gateway give, over every target
kind (Claude API, Bedrock, Vertex, Foundry, mock), the same final messages and the same error classes as the same
client pointed at its provider's fake directly — streamed and not.

What legitimately differs per provider is normalised away: each provider spells the ids of one answer its own
way (``msg_fake_`` / ``msg_bdrk_`` / ``msg_vrtx_``, the same for tool ids), and the mock's message id comes
from the request id. Everything else (content, citations, signatures, tool inputs, usage, stop reason, the
model the provider echoes) must be equal.

Each gateway alias is ``<kind>-<case>``: ``claude-fake-tools`` is the Claude API fake's ``fake-tools``,
``bedrock-status-429`` the Bedrock fake's 429 (``fake-status-ThrottlingException``). The clients name them as
their clouds do: ``us.anthropic.claude-fake-tools-v1:0``, ``claude-fake-tools@20250101``
(``surfaces.base.cloud_model_names``).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from botocore.eventstream import EventStreamBuffer

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.bedrock import FakeBedrock
from tests.fakes.claude_api import STREAM_SCENARIOS, FakeClaudeAPI
from tests.fakes.foundry import FakeFoundry
from tests.fakes.vertex import FakeVertex

KEY = "gw-inbound-key"
KW: dict[str, Any] = {"max_tokens": 1024, "messages": [{"role": "user", "content": "Hello"}]}
# Each cloud's own body version (SDK 2.15 defaults `anthropic_version` to the first-party API version, which
# Bedrock and Vertex reject): the call is written once, as for the cloud, and only base_url changes.
BEDROCK_BODY: dict[str, Any] = {"extra_body": {"anthropic_version": "bedrock-2023-05-31"}}
VERTEX_BODY: dict[str, Any] = {"extra_body": {"anthropic_version": "vertex-2023-10-16"}}

PROVIDER_KINDS = ("claude", "bedrock", "vertex", "foundry")
COMPLETE = [s for s in STREAM_SCENARIOS if s not in ("fake-error-midstream", "fake-cut-midstream", "fake-slow")]
# (target kind, scenario): every complete scenario on every provider; the mock answers whatever it is asked
CASES = [(kind, s) for kind in PROVIDER_KINDS for s in COMPLETE] + [("mock", "fake-text")]

# an error case -> the scenario each provider's fake answers it with (Bedrock's are named by exception)
ERRORS: dict[str, dict[str, str]] = {
    "status-400": {
        "claude": "fake-status-400",
        "bedrock": "fake-status-ValidationException",
        "vertex": "fake-status-400",
        "foundry": "fake-status-400",
    },
    "status-429": {
        "claude": "fake-status-429",
        "bedrock": "fake-status-ThrottlingException",
        "vertex": "fake-status-429",
        "foundry": "fake-status-429",
    },
    "status-500": {
        "claude": "fake-status-500",
        "bedrock": "fake-status-InternalServerException",
        "vertex": "fake-status-500",
        "foundry": "fake-status-500",
    },
    "status-529": {
        "claude": "fake-status-529",
        "bedrock": "fake-status-ServiceUnavailableException",  # Bedrock's overloaded
        "vertex": "fake-status-529",
        "foundry": "fake-status-529",
    },
}
MIDSTREAM = ("fake-error-midstream", "fake-cut-midstream")

ARN_PROFILE = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abcdef123456"
VERTEX_ID = "claude-opus-4-5@20251101"


def aliases() -> dict[str, dict[str, Any]]:
    """alias -> its route, in config order."""
    routes: dict[str, dict[str, Any]] = {}
    for kind in PROVIDER_KINDS:
        for scenario in (*COMPLETE, *MIDSTREAM):
            routes[f"{kind}-{scenario}"] = {"targets": [{"provider": kind, "model": scenario}]}
        for case, names in ERRORS.items():
            routes[f"{kind}-{case}"] = {"targets": [{"provider": kind, "model": names[kind]}]}
    routes["mock-fake-text"] = {"targets": [{"provider": "mock"}]}
    # explicit cloud ids, before the default rule
    routes["mapped-tools"] = {
        "targets": [{"provider": "claude", "model": "fake-tools"}],
        "bedrock_ids": [ARN_PROFILE],
        "vertex_ids": [VERTEX_ID],
    }
    return routes


def config(
    claude: FakeClaudeAPI, bedrock: FakeBedrock, vertex: FakeVertex, credentials: Path, foundry: FakeFoundry
) -> str:
    sigv4 = "access_key_id: AKIDFAKEBEDROCK, secret_access_key: fake-secret"
    return f"""
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 100000}}}}
auth: {{keys: [{KEY}]}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{claude.base_url}"}}
  bedrock: {{kind: bedrock, region: us-east-1, base_url: "{bedrock.base_url}", {sigv4}}}
  vertex: {{kind: vertex, region: us-east5, project: {vertex.project}, credentials_file: "{credentials}",
           base_url: "{vertex.base_url}"}}
  foundry: {{kind: foundry, base_url: "{foundry.base_url}", api_key: foundry-key}}
  mock: {{kind: mock}}
models: {json.dumps(aliases())}
"""


# --- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bedrock() -> Iterator[FakeBedrock]:
    with FakeBedrock() as fake:
        yield fake


@pytest.fixture(scope="module")
def vertex() -> Iterator[FakeVertex]:
    with FakeVertex() as fake:
        yield fake


@pytest.fixture(scope="module")
def foundry() -> Iterator[FakeFoundry]:
    with FakeFoundry() as fake:
        yield fake


@pytest.fixture(scope="module")
def gw(
    fake_claude: FakeClaudeAPI,
    bedrock: FakeBedrock,
    vertex: FakeVertex,
    foundry: FakeFoundry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningGateway]:
    credentials = vertex.make_service_account(tmp_path_factory.mktemp("gcp"))
    with run_gateway(config(fake_claude, bedrock, vertex, credentials, foundry)) as running:
        yield running


# --- clients -------------------------------------------------------------------------------------------------


def bedrock_via(gw: RunningGateway, key: str = KEY) -> anthropic.AnthropicBedrock:
    return anthropic.AnthropicBedrock(api_key=key, base_url=gw.url, aws_region="us-east-1", max_retries=0)


def bedrock_direct(fake: FakeBedrock, key: str = "bedrock-api-key") -> anthropic.AnthropicBedrock:
    return anthropic.AnthropicBedrock(api_key=key, base_url=fake.base_url, aws_region="us-east-1", max_retries=0)


def vertex_via(gw: RunningGateway, key: str = KEY) -> anthropic.AnthropicVertex:
    return anthropic.AnthropicVertex(
        access_token=key, base_url=f"{gw.url}/v1", region="us-east5", project_id="p", max_retries=0
    )


def vertex_direct(fake: FakeVertex, token: str | None = None) -> anthropic.AnthropicVertex:
    return anthropic.AnthropicVertex(
        access_token=token or fake.issue_token(),
        base_url=fake.base_url,
        region="us-east5",
        project_id=fake.project,
        max_retries=0,
    )


def first_party_via(gw: RunningGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=KEY, max_retries=0)


def bedrock_id(name: str) -> str:
    return f"us.anthropic.{name}-v1:0"


def vertex_id(name: str) -> str:
    return f"{name}@20250101"


# --- what is compared ----------------------------------------------------------------------------------------

_PROVIDER_ID = re.compile(r"^(msg|toolu|srvtoolu)_(?:fake|bdrk|vrtx)_")
_MOCK_ID = re.compile(r"^msg_mock_.*$")


def normalised(obj: Any) -> Any:
    """``obj`` with every provider's ids in one spelling (``msg_bdrk_…`` → ``msg_fake_…``), and the mock's
    message id (which is its request id) without its request part."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("id", "tool_use_id") and isinstance(v, str):
                v = _MOCK_ID.sub("msg_mock_", _PROVIDER_ID.sub(r"\1_fake_", v))
            out[k] = normalised(v)
        return out
    if isinstance(obj, list):
        return [normalised(v) for v in obj]
    return obj


def final(client: Any, model: str, *, stream: bool, **kw: Any) -> dict[str, Any]:
    """The final message of one call: ``messages.stream(...).get_final_message()`` or ``messages.create``."""
    if stream:
        return streamed(client, model, **kw)[0]
    dumped: dict[str, Any] = normalised(client.messages.create(model=model, **KW, **kw).model_dump(warnings=False))
    return dumped


def streamed(client: Any, model: str, **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A stream's final message and the events the SDK yielded on the way, without what is each provider's
    own: Vertex's ``vertex_event`` (the SDK yields it; the gateway drops it) and Bedrock's invocation metrics
    (latencies measured by whoever sends the stream)."""
    events: list[dict[str, Any]] = []
    with client.messages.stream(model=model, **KW, **kw) as s:
        for event in s:
            if event.type != "vertex_event":
                dumped = event.model_dump(warnings=False)
                dumped.pop("amazon-bedrock-invocationMetrics", None)
                events.append(normalised(dumped))
        message: dict[str, Any] = normalised(s.get_final_message().model_dump(warnings=False))
    return message, events


def raised(client: Any, model: str, *, stream: bool, **kw: Any) -> Exception:
    """What one call raises (it must raise, not return a message)."""
    try:
        final(client, model, stream=stream, **kw)
    except Exception as exc:
        return exc
    pytest.fail(f"{model}: a message came back instead of an error")


def streamed_until_error(client: Any, model: str, **kw: Any) -> tuple[list[dict[str, Any]], Exception]:
    """The events a stream yields before it raises, and what it raises."""
    events: list[dict[str, Any]] = []
    try:
        with client.messages.stream(model=model, **KW, **kw) as s:
            for event in s:
                if event.type != "vertex_event":  # the SDK yields Vertex's extra frame; the gateway drops it
                    events.append(normalised(event.model_dump(warnings=False)))
            s.get_final_message()
    except Exception as exc:
        return events, exc
    pytest.fail(f"{model}: the stream ended without an error")


def amzn_error_type(exc: Exception) -> str:
    assert isinstance(exc, anthropic.APIStatusError), repr(exc)
    return exc.response.headers.get("x-amzn-errortype", "").split(":", 1)[0]


def error_type(exc: Exception) -> Any:
    assert isinstance(exc, anthropic.APIStatusError), repr(exc)
    body = exc.body
    return body.get("error", {}).get("type") if isinstance(body, dict) else None


def reference_client(
    client_kind: str, scenario: str, gw: RunningGateway, fakes: dict[str, Any]
) -> tuple[Any, str, dict[str, Any]]:
    """The same client class on its own provider's fake, with the model id and body it sends there (for the mock,
    which has no fake: the first-party client on the gateway's own /v1/messages)."""
    if scenario == "mock":
        return first_party_via(gw), "mock-fake-text", {}
    if client_kind == "bedrock":
        return bedrock_direct(fakes["bedrock"]), bedrock_id(scenario), BEDROCK_BODY
    return vertex_direct(fakes["vertex"]), scenario, VERTEX_BODY


def reference(client_kind: str, scenario: str, stream: bool, gw: RunningGateway, fakes: dict[str, Any]) -> Any:
    """The final message of ``reference_client``."""
    client, model, body = reference_client(client_kind, scenario, gw, fakes)
    return final(client, model, stream=stream, **body)


@pytest.fixture(scope="module")
def fakes(fake_claude: FakeClaudeAPI, bedrock: FakeBedrock, vertex: FakeVertex) -> dict[str, Any]:
    return {"claude": fake_claude, "bedrock": bedrock, "vertex": vertex}


# --- the same final messages ---------------------------------------------------------------------------------


def via_client(client_kind: str, kind: str, scenario: str, gw: RunningGateway) -> tuple[Any, str, dict[str, Any]]:
    if client_kind == "bedrock":
        return bedrock_via(gw), bedrock_id(f"{kind}-{scenario}"), BEDROCK_BODY
    return vertex_via(gw), vertex_id(f"{kind}-{scenario}"), VERTEX_BODY


@pytest.mark.parametrize(("kind", "scenario"), CASES)
@pytest.mark.parametrize("client_kind", ["bedrock", "vertex"], ids=["AnthropicBedrock", "AnthropicVertex"])
def test_same_final_message_created(
    client_kind: str, kind: str, scenario: str, gw: RunningGateway, fakes: dict[str, Any]
) -> None:
    want = reference(client_kind, "mock" if kind == "mock" else scenario, False, gw, fakes)
    client, model, body = via_client(client_kind, kind, scenario, gw)
    assert final(client, model, stream=False, **body) == want


@pytest.mark.parametrize(("kind", "scenario"), CASES)
@pytest.mark.parametrize("client_kind", ["bedrock", "vertex"], ids=["AnthropicBedrock", "AnthropicVertex"])
def test_same_final_message_streamed(
    client_kind: str, kind: str, scenario: str, gw: RunningGateway, fakes: dict[str, Any]
) -> None:
    client, model, body = reference_client(client_kind, "mock" if kind == "mock" else scenario, gw, fakes)
    want, want_events = streamed(client, model, **body)
    client, model, body = via_client(client_kind, kind, scenario, gw)
    got, got_events = streamed(client, model, **body)
    assert got == want
    assert got_events == want_events


@pytest.mark.parametrize("scenario", ["fake-text", "fake-tools"])
def test_the_provider_fakes_agree_with_the_claude_api(scenario: str, gw: RunningGateway, fakes: dict[str, Any]) -> None:
    """The references themselves: the Bedrock and Vertex fakes answer what the Claude API fake answers."""
    claude = final(
        anthropic.Anthropic(base_url=fakes["claude"].base_url, api_key="k", max_retries=0), scenario, stream=True
    )
    assert reference("bedrock", scenario, True, gw, fakes) == claude
    assert reference("vertex", scenario, True, gw, fakes) == claude


@pytest.mark.parametrize(
    "model",
    [
        "claude-fake-tools",
        "anthropic.claude-fake-tools-v1:0",
        "us.anthropic.claude-fake-tools-v1:0",
        "eu.anthropic.claude-fake-tools-v1:0",
        "global.anthropic.claude-fake-tools",
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-fake-tools-v1:0",
        ARN_PROFILE,  # bedrock_ids
    ],
)
def test_bedrock_model_id_forms(model: str, gw: RunningGateway, fakes: dict[str, Any]) -> None:
    want = reference("bedrock", "fake-tools", True, gw, fakes)
    assert final(bedrock_via(gw), model, stream=True, **BEDROCK_BODY) == want


@pytest.mark.parametrize("model", ["claude-fake-tools", "claude-fake-tools@20250101", VERTEX_ID])
def test_vertex_model_id_forms(model: str, gw: RunningGateway, fakes: dict[str, Any]) -> None:
    want = reference("vertex", "fake-tools", True, gw, fakes)
    assert final(vertex_via(gw), model, stream=True, **VERTEX_BODY) == want


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_sdk_default_body_version_is_accepted(stream: bool, gw: RunningGateway, fakes: dict[str, Any]) -> None:
    """Without the cloud's ``anthropic_version`` (the SDK then sends its own default) the gateway still answers:
    each target's adapter sets its own."""
    for kind in ("claude", "bedrock", "vertex"):
        got = final(bedrock_via(gw), bedrock_id(f"{kind}-fake-thinking"), stream=stream)
        assert got == reference("bedrock", "fake-thinking", stream, gw, fakes), kind
        got = final(vertex_via(gw), vertex_id(f"{kind}-fake-thinking"), stream=stream)
        assert got == reference("vertex", "fake-thinking", stream, gw, fakes), kind


def test_betas_reach_the_provider(gw: RunningGateway, fake_claude: FakeClaudeAPI) -> None:
    betas = ["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"]
    bedrock_via(gw).beta.messages.create(model=bedrock_id("claude-fake-text"), betas=betas, **KW, **BEDROCK_BODY)
    sent = fake_claude.requests[-1]
    assert sent.headers["anthropic-beta"] == ",".join(betas)
    assert sent.json["model"] == "fake-text" and "anthropic_version" not in sent.json
    assert "anthropic_beta" not in sent.json and "stream" not in sent.json
    vertex_via(gw).beta.messages.create(model=vertex_id("claude-fake-text"), betas=betas, **KW, **VERTEX_BODY)
    sent = fake_claude.requests[-1]
    assert sent.headers["anthropic-beta"] == ",".join(betas)
    assert sent.json["model"] == "fake-text" and "anthropic_version" not in sent.json


@pytest.mark.parametrize("kind", [*PROVIDER_KINDS, "mock"])
def test_invoke_answer_headers_and_stream_metrics(kind: str, gw: RunningGateway, bedrock: FakeBedrock) -> None:
    """What InvokeModel says besides the message: the token counts in ``x-amzn-bedrock-*`` headers, and in the
    ``message_stop`` chunk's ``amazon-bedrock-invocationMetrics`` — the same counts as Bedrock's for the same
    usage (the mock's: its own usage)."""
    scenario = "fake-text" if kind == "mock" else "fake-citations"
    direct = bedrock_direct(bedrock).messages.with_raw_response.create(model=bedrock_id(scenario), **KW, **BEDROCK_BODY)
    via = bedrock_via(gw).messages.with_raw_response.create(
        model=bedrock_id(f"{kind}-{scenario}"), **KW, **BEDROCK_BODY
    )
    usage = via.parse().usage
    counts = ("x-amzn-bedrock-input-token-count", "x-amzn-bedrock-output-token-count")
    if kind != "mock":
        assert [via.headers[h] for h in counts] == [direct.headers[h] for h in counts]
    assert [via.headers[h] for h in counts] == [str(usage.input_tokens), str(usage.output_tokens)]
    assert int(via.headers["x-amzn-bedrock-invocation-latency"]) >= 0
    assert via.headers["x-amzn-requestid"]

    def metrics(base_url: str, model: str, key: str) -> dict[str, Any]:
        url = f"{base_url}/model/{model}/invoke-with-response-stream"
        body = {**KW, "anthropic_version": "bedrock-2023-05-31"}
        resp = httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"})
        events = [json.loads(base64.b64decode(json.loads(p)["bytes"])) for h, p in frames(resp)]
        assert [e["type"] for e in events].count("message_stop") == 1 and events[-1]["type"] == "message_stop"
        start, delta = events[0]["message"]["usage"], next(e for e in events if e["type"] == "message_delta")
        got: dict[str, Any] = events[-1]["amazon-bedrock-invocationMetrics"]
        output = delta["usage"]["output_tokens"]
        input_tokens = delta["usage"].get("input_tokens") or start["input_tokens"]
        assert (got["inputTokenCount"], got["outputTokenCount"]) == (input_tokens, output)
        return got

    got = metrics(gw.url, bedrock_id(f"{kind}-{scenario}"), KEY)
    want = metrics(bedrock.base_url, bedrock_id(scenario), "bedrock-api-key")
    assert set(want) <= set(got)
    assert isinstance(got["invocationLatency"], int) and isinstance(got["firstByteLatency"], int)
    if kind != "mock":
        assert (got["inputTokenCount"], got["outputTokenCount"]) == (want["inputTokenCount"], want["outputTokenCount"])


def test_async_clients(gw: RunningGateway, fakes: dict[str, Any]) -> None:
    import asyncio

    async def run(client: Any, model: str, **kw: Any) -> dict[str, Any]:
        async with client, client.messages.stream(model=model, **KW, **kw) as s:
            message: dict[str, Any] = normalised((await s.get_final_message()).model_dump(warnings=False))
            return message

    bedrock = anthropic.AsyncAnthropicBedrock(api_key=KEY, base_url=gw.url, aws_region="us-east-1", max_retries=0)
    got = asyncio.run(run(bedrock, bedrock_id("vertex-fake-thinking"), **BEDROCK_BODY))
    assert got == reference("bedrock", "fake-thinking", True, gw, fakes)
    vertex = anthropic.AsyncAnthropicVertex(
        access_token=KEY, base_url=f"{gw.url}/v1", region="us-east5", project_id="p", max_retries=0
    )
    got = asyncio.run(run(vertex, vertex_id("bedrock-fake-server-tools"), **VERTEX_BODY))
    assert got == reference("vertex", "fake-server-tools", True, gw, fakes)


# --- the same error classes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("case", list(ERRORS))
@pytest.mark.parametrize("kind", PROVIDER_KINDS)
def test_anthropic_bedrock_same_error(
    kind: str, case: str, stream: bool, gw: RunningGateway, bedrock: FakeBedrock
) -> None:
    want = raised(bedrock_direct(bedrock), bedrock_id(ERRORS[case]["bedrock"]), stream=stream, **BEDROCK_BODY)
    got = raised(bedrock_via(gw), bedrock_id(f"{kind}-{case}"), stream=stream, **BEDROCK_BODY)
    assert (type(got), getattr(got, "status_code", None)) == (type(want), getattr(want, "status_code", None))
    assert amzn_error_type(got) == amzn_error_type(want)
    assert isinstance(got, anthropic.APIStatusError) and isinstance(want, anthropic.APIStatusError)
    assert set(got.body) == set(want.body) == {"message"}  # type: ignore[arg-type]
    assert got.body["message"]  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("case", list(ERRORS))
@pytest.mark.parametrize("kind", PROVIDER_KINDS)
def test_anthropic_vertex_same_error(
    kind: str, case: str, stream: bool, gw: RunningGateway, vertex: FakeVertex
) -> None:
    want = raised(vertex_direct(vertex), ERRORS[case]["vertex"], stream=stream, **VERTEX_BODY)
    got = raised(vertex_via(gw), vertex_id(f"{kind}-{case}"), stream=stream, **VERTEX_BODY)
    assert (type(got), getattr(got, "status_code", None)) == (type(want), getattr(want, "status_code", None))
    assert error_type(got) == error_type(want)


@pytest.mark.parametrize("kind", PROVIDER_KINDS)
def test_overloaded_json_answer_same_error(
    kind: str, gw: RunningGateway, bedrock: FakeBedrock, vertex: FakeVertex
) -> None:
    """``fake-error-midstream`` not streamed: every provider answers it overloaded, before any body."""
    want = raised(bedrock_direct(bedrock), bedrock_id("fake-error-midstream"), stream=False, **BEDROCK_BODY)
    got = raised(bedrock_via(gw), bedrock_id(f"{kind}-fake-error-midstream"), stream=False, **BEDROCK_BODY)
    assert (type(got), amzn_error_type(got)) == (type(want), amzn_error_type(want))
    want = raised(vertex_direct(vertex), "fake-error-midstream", stream=False, **VERTEX_BODY)
    got = raised(vertex_via(gw), vertex_id(f"{kind}-fake-error-midstream"), stream=False, **VERTEX_BODY)
    assert (type(got), error_type(got)) == (type(want), error_type(want))


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_wrong_key_same_error_anthropic_bedrock(stream: bool, gw: RunningGateway, bedrock: FakeBedrock) -> None:
    """A wrong client key is Bedrock's ``UnrecognizedClientException`` in Bedrock's shape — with the status 401,
    where Bedrock answers a bad AWS credential 403: the gateway's key is no AWS credential, and the real CLI's
    Bedrock mode retries a 403 for minutes (it takes it for expired credentials) while it fails at once on a
    401 with ``x-should-retry: false`` (tests/e2e/test_claude_code.py). So the SDK raises ``AuthenticationError``
    here where it raises ``PermissionDeniedError`` against Bedrock: the one deliberate difference."""
    want = raised(bedrock_direct(bedrock, key="not-a-key"), bedrock_id("fake-text"), stream=stream, **BEDROCK_BODY)
    got = raised(bedrock_via(gw, key="not-a-key"), bedrock_id("claude-fake-text"), stream=stream, **BEDROCK_BODY)
    assert isinstance(want, anthropic.PermissionDeniedError) and want.status_code == 403
    assert isinstance(got, anthropic.APIStatusError) and set(got.body) == set(want.body) == {"message"}  # type: ignore[arg-type]
    assert amzn_error_type(got) == amzn_error_type(want) == "UnrecognizedClientException"
    assert isinstance(got, anthropic.AuthenticationError) and got.status_code == 401
    assert got.response.headers["x-should-retry"] == "false"


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_wrong_key_same_error_anthropic_vertex(stream: bool, gw: RunningGateway, vertex: FakeVertex) -> None:
    want = raised(vertex_direct(vertex, token="not-a-token"), "fake-text", stream=stream, **VERTEX_BODY)
    got = raised(vertex_via(gw, key="not-a-token"), vertex_id("claude-fake-text"), stream=stream, **VERTEX_BODY)
    assert isinstance(want, anthropic.AuthenticationError) and want.status_code == 401
    assert (type(got), got.status_code) == (type(want), want.status_code)  # type: ignore[attr-defined]


def test_unknown_model_is_not_found(gw: RunningGateway) -> None:
    got = raised(bedrock_via(gw), bedrock_id("no-such-model"), stream=False, **BEDROCK_BODY)
    assert isinstance(got, anthropic.NotFoundError) and amzn_error_type(got) == "ResourceNotFoundException"
    got = raised(vertex_via(gw), vertex_id("no-such-model"), stream=True, **VERTEX_BODY)
    assert isinstance(got, anthropic.NotFoundError) and error_type(got) == "not_found_error"


# --- failures inside a stream --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDER_KINDS)
def test_anthropic_bedrock_error_mid_stream(kind: str, gw: RunningGateway, bedrock: FakeBedrock) -> None:
    """The SDK raises instead of returning the half-written message: the class it raises against Bedrock for
    the same scenario (SDK 2.15 turns an exception frame into an SSE ``error``, an ``APIStatusError``, not the
    ``ValueError`` of older SDKs), with the exception Bedrock's stream sends when it is overloaded
    (``serviceUnavailableException``)."""
    want_events, want = streamed_until_error(
        bedrock_direct(bedrock), bedrock_id("fake-error-midstream"), **BEDROCK_BODY
    )
    _, frame = streamed_until_error(
        bedrock_direct(bedrock), bedrock_id("fake-exc-serviceUnavailableException"), **BEDROCK_BODY
    )
    got_events, got = streamed_until_error(bedrock_via(gw), bedrock_id(f"{kind}-fake-error-midstream"), **BEDROCK_BODY)
    assert type(got) is type(want) is type(frame)
    # a Bedrock target's own frames go through as they came (its fake ends this scenario with an error chunk);
    # any other target's error event becomes the exception frame
    expected = error_type(want) if kind == "bedrock" else error_type(frame)
    assert error_type(got) == expected
    assert got_events == want_events


@pytest.mark.parametrize("kind", PROVIDER_KINDS)
def test_anthropic_vertex_error_mid_stream(kind: str, gw: RunningGateway, vertex: FakeVertex) -> None:
    want_events, want = streamed_until_error(vertex_direct(vertex), "fake-error-midstream", **VERTEX_BODY)
    got_events, got = streamed_until_error(vertex_via(gw), vertex_id(f"{kind}-fake-error-midstream"), **VERTEX_BODY)
    assert type(got) is type(want) is anthropic.APIStatusError  # the SSE error event, not a status class
    assert error_type(got) == error_type(want) == "overloaded_error"
    assert got_events == want_events


@pytest.mark.parametrize("kind", PROVIDER_KINDS)
def test_cut_stream_ends_in_an_error(kind: str, gw: RunningGateway, bedrock: FakeBedrock) -> None:
    """A provider that drops the connection mid-stream: the gateway ends the stream with an error (as it does on
    /v1/messages); to AnthropicBedrock that is the internal-failure exception frame Bedrock sends."""
    _, frame = streamed_until_error(
        bedrock_direct(bedrock), bedrock_id("fake-exc-internalServerException"), **BEDROCK_BODY
    )
    _, got = streamed_until_error(bedrock_via(gw), bedrock_id(f"{kind}-fake-cut-midstream"), **BEDROCK_BODY)
    assert (
        (type(got), error_type(got))
        == (type(frame), error_type(frame))
        == (
            anthropic.APIStatusError,
            "internalServerException",
        )
    )
    _, got = streamed_until_error(vertex_via(gw), vertex_id(f"{kind}-fake-cut-midstream"), **VERTEX_BODY)
    assert (type(got), error_type(got)) == (anthropic.APIStatusError, "api_error")


def frames(resp: httpx.Response) -> list[tuple[dict[str, Any], bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(resp.content)
    return [(dict(m.headers), m.payload) for m in buffer]


def test_mid_stream_error_is_an_exception_frame(gw: RunningGateway, bedrock: FakeBedrock) -> None:
    url = f"{gw.url}/model/{bedrock_id('claude-fake-error-midstream')}/invoke-with-response-stream"
    resp = httpx.post(
        url, json={**KW, "anthropic_version": "bedrock-2023-05-31"}, headers={"authorization": f"Bearer {KEY}"}
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/vnd.amazon.eventstream"
    got = frames(resp)
    *chunks, (last, payload) = got
    assert all(h[":message-type"] == "event" and h[":event-type"] == "chunk" for h, _ in chunks)
    types = [json.loads(base64.b64decode(json.loads(p)["bytes"]))["type"] for _, p in chunks]
    assert types == ["message_start", "content_block_start", "content_block_delta", "content_block_delta"]
    assert last[":message-type"] == "exception" and last[":exception-type"] == "serviceUnavailableException"
    assert json.loads(payload) == {"message": "Overloaded"}


# --- count tokens and inference profiles ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", [*PROVIDER_KINDS, "mock"])
def test_anthropic_vertex_count_tokens(kind: str, gw: RunningGateway, vertex: FakeVertex) -> None:
    got = vertex_via(gw).messages.count_tokens(model=vertex_id(f"{kind}-fake-text"), messages=KW["messages"])
    assert isinstance(got.input_tokens, int) and got.input_tokens > 0
    if kind == "vertex":
        want = vertex_direct(vertex).messages.count_tokens(model="fake-text", messages=KW["messages"])
        assert got == want
    if kind in ("vertex", "foundry", "mock"):  # fakes that count the content only: whichever route asks
        first_party = first_party_via(gw).messages.count_tokens(model=f"{kind}-fake-text", messages=KW["messages"])
        assert got == first_party


def count_tokens_body(inner: dict[str, Any], *, as_base64: bool) -> dict[str, Any]:
    text = json.dumps(inner)
    body = base64.b64encode(text.encode()).decode() if as_base64 else text
    return {"input": {"invokeModel": {"body": body}}}


@pytest.mark.parametrize("kind", [*PROVIDER_KINDS, "mock"])
def test_bedrock_count_tokens(kind: str, gw: RunningGateway, bedrock: FakeBedrock) -> None:
    inner = {"anthropic_version": "bedrock-2023-05-31", **KW}
    want = httpx.post(
        f"{bedrock.base_url}/model/{bedrock_id('fake-text')}/count-tokens",
        json=count_tokens_body(inner, as_base64=True),
        headers={"authorization": "Bearer bedrock-api-key"},
    )
    assert want.status_code == 200, want.text
    url = f"{gw.url}/model/{bedrock_id(f'{kind}-fake-text')}/count-tokens"
    auth = {"authorization": f"Bearer {KEY}"}
    as_text = httpx.post(url, json=count_tokens_body(inner, as_base64=False), headers=auth)
    assert as_text.status_code == 200, as_text.text
    assert as_text.headers["content-type"].startswith("application/json")
    assert set(as_text.json()) == set(want.json()) == {"inputTokens"}
    assert isinstance(as_text.json()["inputTokens"], int) and as_text.json()["inputTokens"] > 0
    as_blob = httpx.post(url, json=count_tokens_body(inner, as_base64=True), headers=auth)  # botocore's blob
    assert as_blob.status_code == 200 and as_blob.json() == as_text.json()


@pytest.mark.parametrize("kind", ["claude", "vertex", "foundry"])
def test_bedrock_count_tokens_sends_a_count_tokens_body(
    kind: str, gw: RunningGateway, fakes: dict[str, Any], foundry: FakeFoundry
) -> None:
    """A CountTokens request wraps an InvokeModel body, which must carry ``max_tokens``; the Messages API's
    count_tokens takes no ``max_tokens`` (docs/wire-formats.md §1.7: messages, model, system, tools, tool_choice,
    thinking, cache_control, output_config; the Claude API answers "max_tokens: Extra inputs are not
    permitted"). So a first-party-shaped target is asked without it — as AnthropicVertex's own count_tokens
    asks (the same gateway, the same alias)."""
    fake = {**fakes, "foundry": foundry}[kind]
    inner = {"anthropic_version": "bedrock-2023-05-31", **KW, "system": "Be brief."}
    url = f"{gw.url}/model/{bedrock_id(f'{kind}-fake-text')}/count-tokens"
    resp = httpx.post(url, json=count_tokens_body(inner, as_base64=False), headers={"authorization": f"Bearer {KEY}"})
    assert resp.status_code == 200, resp.text
    sent = fake.requests[-1].json
    assert sent["messages"] == KW["messages"] and sent["system"] == "Be brief." and sent["model"] == "fake-text"
    assert "max_tokens" not in sent, f"{kind}: count_tokens body {sent}"
    vertex_via(gw).messages.count_tokens(
        model=vertex_id(f"{kind}-fake-text"), messages=KW["messages"], system="Be brief."
    )
    assert set(fake.requests[-1].json) == set(sent)


def test_inference_profiles_list_the_aliases(gw: RunningGateway) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    resp = httpx.get(f"{gw.url}/inference-profiles", params={"type": "SYSTEM_DEFINED"}, headers=auth)
    assert resp.status_code == 200
    profiles = resp.json()["inferenceProfileSummaries"]
    assert [p["inferenceProfileId"] for p in profiles] == list(aliases())
    for p in profiles:
        assert p["type"] == "SYSTEM_DEFINED" and p["status"] == "ACTIVE"
        assert p["inferenceProfileArn"].endswith(f":inference-profile/{p['inferenceProfileId']}")
    resp = httpx.get(f"{gw.url}/inference-profiles", params={"type": "APPLICATION"}, headers=auth)
    assert resp.status_code == 200 and resp.json()["inferenceProfileSummaries"] == []
    resp = httpx.get(
        f"{gw.url}/inference-profiles", params={"type": "SYSTEM_DEFINED"}, headers={"authorization": "Bearer nope"}
    )
    assert resp.status_code in (401, 403)
    # a listed profile id is a model id AnthropicBedrock can use as it is
    message = bedrock_via(gw).messages.create(model=profiles[0]["inferenceProfileId"], **KW, **BEDROCK_BODY)
    assert message.content

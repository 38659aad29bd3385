"""Claude Code's Messages-mode request (``ANTHROPIC_BASE_URL``, the commonest set-up: first-party betas, the
``context_management`` field, a tool flag) through the gateway to every kind of target (issue 32, items 1-2):
each provider is sent what it accepts — the first party and Foundry everything unchanged; Bedrock (InvokeModel,
Converse, Mantle) and Vertex the betas Claude Code sends them in their own modes (``advanced-tool-use`` as
``tool-search-tool``), without ``context_management``, ``tags`` or ``eager_input_streaming`` — and every drop is
counted (``gateway_dropped_features_total``) and named on the access line (``dropped``); an operator's override
changes it; ``safeguards`` on a cloud is a 400 naming it."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import RunningGateway, access_lines, run_gateway
from tests.fakes.bedrock import FakeBedrock
from tests.fakes.claude_api import THINKING_SIGNATURE, FakeClaudeAPI
from tests.fakes.foundry import FakeFoundry
from tests.fakes.vertex import FakeVertex

CONVERSE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "converse"
MESSAGES_MODE_BETAS = [
    "claude-code-20250219",
    "interleaved-thinking-2025-05-14",
    "context-management-2025-06-27",
    "per-turn-control-2026-07-01",
    "mid-conversation-tool-changes-2026-07-01",
    "advanced-tool-use-2025-11-20",
    "effort-2025-11-24",
    "thinking-token-count-2026-05-13",
]
CLOUD_BETAS = [
    "claude-code-20250219",
    "interleaved-thinking-2025-05-14",
    "tool-search-tool-2025-10-19",
    "effort-2025-11-24",
    "thinking-token-count-2026-05-13",
]
DROPPED = [
    "beta:context-management-2025-06-27",
    "beta:per-turn-control-2026-07-01",
    "beta:mid-conversation-tool-changes-2026-07-01",
    "field:context_management",
    "field:tags",
    "tool_field:eager_input_streaming",
]
TOOLS = [
    {"name": "Read", "description": "read a file", "input_schema": {"type": "object"}, "defer_loading": True},
    {"name": "Bash", "description": "run", "input_schema": {"type": "object"}, "eager_input_streaming": True},
]
BODY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "hi"}],
    "system": [{"type": "text", "text": "You are Claude Code."}],
    "tools": TOOLS,
    "metadata": {"user_id": "user_abc"},
    "max_tokens": 1024,
    "stream": True,
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    "tags": ["team-a"],
}
HEADERS = {"x-api-key": "gw-key", "anthropic-beta": ",".join(MESSAGES_MODE_BETAS), "anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def bedrock() -> Iterator[FakeBedrock]:
    with FakeBedrock(converse_dir=CONVERSE_DIR) as fake:
        yield fake


@pytest.fixture(scope="module")
def vertex() -> Iterator[FakeVertex]:
    with FakeVertex() as fake:
        yield fake


@pytest.fixture(scope="module")
def foundry() -> Iterator[FakeFoundry]:
    with FakeFoundry() as fake:
        yield fake


def config(claude: FakeClaudeAPI, bedrock: FakeBedrock, vertex: FakeVertex, foundry: FakeFoundry, creds: Path) -> str:
    aws = "access_key_id: AKIDFAKEBEDROCK, secret_access_key: fake-secret"
    return f"""
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 100000}}}}
auth: {{keys: [gw-key]}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{claude.base_url}"}}
  claude-narrow: {{kind: anthropic, api_key: provider-key, base_url: "{claude.base_url}",
                  betas: {{drop: [per-turn-control]}}, drop_fields: [tags]}}
  invoke: {{kind: bedrock, region: us-east-1, base_url: "{bedrock.base_url}", {aws}}}
  converse: {{kind: bedrock, api: converse, region: us-east-1, base_url: "{bedrock.base_url}", {aws}}}
  mantle: {{kind: bedrock_mantle, region: us-east-1, base_url: "{bedrock.base_url}/anthropic", {aws}}}
  vertex: {{kind: vertex, region: us-east5, project: {vertex.project}, credentials_file: "{creds}",
           base_url: "{vertex.base_url}"}}
  vertex-wide: {{kind: vertex, region: us-east5, project: {vertex.project}, credentials_file: "{creds}",
                base_url: "{vertex.base_url}", betas: {{allow: [context-management]}}, drop_fields: [metadata]}}
  foundry: {{kind: foundry, base_url: "{foundry.base_url}", api_key: foundry-key}}
models:
  to-claude: {{targets: [{{provider: claude, model: fake-text}}]}}
  to-claude-narrow: {{targets: [{{provider: claude-narrow, model: fake-text}}]}}
  to-invoke: {{targets: [{{provider: invoke, model: us.anthropic.fake-text-v1:0}}]}}
  to-converse: {{targets: [{{provider: converse, model: anthropic.text}}]}}
  to-mantle: {{targets: [{{provider: mantle, model: fake-text}}]}}
  to-vertex: {{targets: [{{provider: vertex, model: fake-text}}]}}
  to-vertex-wide: {{targets: [{{provider: vertex-wide, model: fake-text}}]}}
  to-foundry: {{targets: [{{provider: foundry, model: fake-text}}]}}
  think-invoke: {{targets: [{{provider: invoke, model: us.anthropic.fake-thinking-v1:0}}]}}
  think-claude: {{targets: [{{provider: claude, model: fake-thinking}}]}}
"""


@pytest.fixture(scope="module")
def gw(
    fake_claude: FakeClaudeAPI,
    bedrock: FakeBedrock,
    vertex: FakeVertex,
    foundry: FakeFoundry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningGateway]:
    creds = vertex.make_service_account(tmp_path_factory.mktemp("gcp"))
    with run_gateway(config(fake_claude, bedrock, vertex, foundry, creds)) as running:
        yield running


def send(gw: RunningGateway, alias: str, caplog: pytest.LogCaptureFixture, **extra: Any) -> tuple[httpx.Response, Any]:
    caplog.set_level(logging.INFO, logger="gateway.access")
    resp = httpx.post(f"{gw.url}/v1/messages", json={"model": alias, **BODY, **extra}, headers=HEADERS, timeout=30)
    (line,) = access_lines(caplog, resp.headers["request-id"])
    return resp, line


def dropped_total(gw: RunningGateway, provider: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in gw.metrics.registry.collect():
        for s in metric.samples:
            if s.name == "gateway_dropped_features_total" and s.labels["provider"] == provider:
                out[s.labels["feature"]] = s.value
    return out


def assert_cloud_body(body: dict[str, Any]) -> None:
    assert "context_management" not in body and "tags" not in body
    assert body["tools"][0] == TOOLS[0]  # defer_loading kept: Claude Code sends it to the clouds itself
    assert body["tools"][1] == {k: v for k, v in TOOLS[1].items() if k != "eager_input_streaming"}
    assert body["metadata"] == BODY["metadata"] and body["system"] == BODY["system"]


@pytest.mark.parametrize(("alias", "provider"), [("to-claude", "claude"), ("to-foundry", "foundry")])
def test_the_first_party_and_foundry_are_sent_everything_unchanged(
    gw: RunningGateway,
    fake_claude: FakeClaudeAPI,
    foundry: FakeFoundry,
    caplog: pytest.LogCaptureFixture,
    alias: str,
    provider: str,
) -> None:
    fake: Any = fake_claude if provider == "claude" else foundry
    before = len(fake.requests)
    resp, line = send(gw, alias, caplog)
    assert resp.status_code == 200 and resp.text.rstrip().endswith('"type":"message_stop"}'), resp.text[-300:]
    sent = fake.requests[before]
    assert sent.headers["anthropic-beta"] == HEADERS["anthropic-beta"]
    assert {k: v for k, v in sent.json.items() if k != "model"} == BODY
    assert line["dropped"] == [] and dropped_total(gw, provider) == {}


def test_bedrock_invoke_gets_its_betas_in_the_body_and_none_of_the_rest(
    gw: RunningGateway, bedrock: FakeBedrock, caplog: pytest.LogCaptureFixture
) -> None:
    before = len(bedrock.requests)
    resp, line = send(gw, "to-invoke", caplog)
    assert resp.status_code == 200, resp.text
    body = bedrock.requests[before].json
    assert body["anthropic_beta"] == CLOUD_BETAS and "model" not in body and "stream" not in body
    assert_cloud_body(body)
    assert line["dropped"] == DROPPED
    counted = dropped_total(gw, "invoke")
    assert counted["beta:context-management"] >= 1 and counted["tool_field:eager_input_streaming"] >= 1


def test_bedrock_converse_gets_the_cloud_betas_in_its_additional_fields(
    gw: RunningGateway, bedrock: FakeBedrock, caplog: pytest.LogCaptureFixture
) -> None:
    before = len(bedrock.requests)
    resp, line = send(gw, "to-converse", caplog)
    assert resp.status_code == 200, resp.text
    body = bedrock.requests[before].json
    assert body["additionalModelRequestFields"]["anthropic_beta"] == CLOUD_BETAS
    assert "context_management" not in json.dumps(body) and "eager_input_streaming" not in json.dumps(body)
    assert line["dropped"] == [*DROPPED[:-1], "tool_field:defer_loading", DROPPED[-1]]  # toolSpec has no such flag


@pytest.mark.parametrize("alias", ["to-mantle", "to-vertex"])
def test_mantle_and_vertex_get_the_cloud_betas_in_the_header(
    gw: RunningGateway,
    bedrock: FakeBedrock,
    vertex: FakeVertex,
    caplog: pytest.LogCaptureFixture,
    alias: str,
) -> None:
    fake: Any = bedrock if alias == "to-mantle" else vertex
    before = len(fake.requests)
    resp, line = send(gw, alias, caplog)
    assert resp.status_code == 200, resp.text
    sent = fake.requests[before]
    assert sent.headers["anthropic-beta"] == ",".join(CLOUD_BETAS)
    assert_cloud_body(sent.json)
    assert line["dropped"] == DROPPED


def test_an_operators_override_widens_or_narrows_a_profile(
    gw: RunningGateway,
    fake_claude: FakeClaudeAPI,
    vertex: FakeVertex,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = len(vertex.requests)
    resp, line = send(gw, "to-vertex-wide", caplog)
    # the operator allowed a beta Vertex does not take: it is sent, and the strict fake refuses it as Vertex does
    assert resp.status_code == 400 and "context-management-2025-06-27" in resp.json()["error"]["message"], resp.text
    sent = vertex.requests[before]
    assert "context-management-2025-06-27" in sent.headers["anthropic-beta"] and "metadata" not in sent.json
    assert "field:metadata" in line["dropped"] and "beta:context-management-2025-06-27" not in line["dropped"]
    before = len(fake_claude.requests)
    resp, line = send(gw, "to-claude-narrow", caplog)
    assert resp.status_code == 200, resp.text
    sent = fake_claude.requests[before]
    assert "per-turn-control" not in sent.headers["anthropic-beta"] and "tags" not in sent.json
    assert "context_management" in sent.json  # the first party keeps what it is not told to drop
    assert line["dropped"] == ["beta:per-turn-control-2026-07-01", "field:tags"]


@pytest.mark.parametrize("alias", ["to-invoke", "to-vertex", "to-mantle"])
def test_safeguards_on_a_cloud_is_a_400_naming_it(
    gw: RunningGateway, bedrock: FakeBedrock, vertex: FakeVertex, caplog: pytest.LogCaptureFixture, alias: str
) -> None:
    resp, _ = send(gw, alias, caplog, safeguards={"type": "auto"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith("safeguards: ")


def test_safeguards_reaches_the_first_party(
    gw: RunningGateway, fake_claude: FakeClaudeAPI, caplog: pytest.LogCaptureFixture
) -> None:
    before = len(fake_claude.requests)
    resp, _ = send(gw, "to-claude", caplog, safeguards={"type": "auto"})
    assert resp.status_code == 200 and fake_claude.requests[before].json["safeguards"] == {"type": "auto"}


# --- item 5: thinking signatures and cache control reach a same-format target byte for byte -------------------

CONVERSATION = [
    {
        "role": "user",
        "content": [{"type": "text", "text": "list the files", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should call ls.", "signature": THINKING_SIGNATURE},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3" + "Zz9/" * 30},
            {"type": "tool_use", "id": "toolu_01A", "name": "Bash", "input": {"command": "ls"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01A",
                "content": "a.txt\nb.txt",
                "cache_control": {"type": "ephemeral"},
            }
        ],
    },
]


@pytest.mark.parametrize("alias", ["to-claude", "to-invoke", "to-mantle", "to-vertex", "to-foundry"])
def test_thinking_signatures_and_cache_control_reach_the_target_byte_for_byte(
    gw: RunningGateway,
    fake_claude: FakeClaudeAPI,
    bedrock: FakeBedrock,
    vertex: FakeVertex,
    foundry: FakeFoundry,
    alias: str,
) -> None:
    fake: Any = {"to-claude": fake_claude, "to-foundry": foundry, "to-vertex": vertex}.get(alias, bedrock)
    messages = json.dumps(CONVERSATION, indent=1).encode()  # the client's own spelling: kept, not re-encoded
    body = b'{"model": "%s", "max_tokens": 1024, "stream": true, "messages": %s, ' % (alias.encode(), messages)
    body += b'"thinking": {"type": "enabled", "budget_tokens": 512}}'
    before = len(fake.requests)
    resp = httpx.post(
        f"{gw.url}/v1/messages",
        content=body,
        headers={**HEADERS, "content-type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    assert messages in fake.requests[before].body  # signatures, redacted data, cache_control ttl: as sent


def test_a_thinking_turn_from_bedrock_replayed_to_the_claude_api_keeps_its_signature(
    gw: RunningGateway, fake_claude: FakeClaudeAPI
) -> None:
    """A conversation moves between targets (a fallback, a reroute): the thinking block Bedrock answered goes back,
    next turn, to the Claude API, whose check of the signature (the fake's, as the API's) passes; a changed one is
    refused, and the client reads the API's message."""
    ask = {"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    first_turn = [{"role": "user", "content": "think, then answer"}]
    headers = {"x-api-key": "gw-key"}
    answer = httpx.post(
        f"{gw.url}/v1/messages", json={"model": "think-invoke", "messages": first_turn, **ask}, headers=headers
    )
    assert answer.status_code == 200, answer.text
    content = answer.json()["content"]
    assert content[0]["type"] == "thinking" and content[0]["signature"] == THINKING_SIGNATURE
    replay = [*first_turn, {"role": "assistant", "content": content}, {"role": "user", "content": "and then?"}]
    before = len(fake_claude.requests)
    resp = httpx.post(
        f"{gw.url}/v1/messages", json={"model": "think-claude", "messages": replay, **ask}, headers=headers
    )
    assert resp.status_code == 200, resp.text
    assert fake_claude.requests[before].json["messages"][1]["content"][0]["signature"] == THINKING_SIGNATURE
    tampered = [dict(block) for block in content]
    tampered[0]["signature"] = THINKING_SIGNATURE[:-4] + "AAAA"
    replay[1] = {"role": "assistant", "content": tampered}
    for alias in ("think-claude", "think-invoke"):
        refused = httpx.post(f"{gw.url}/v1/messages", json={"model": alias, "messages": replay, **ask}, headers=headers)
        assert refused.status_code == 400 and "Invalid `signature`" in refused.json()["error"]["message"], refused.text

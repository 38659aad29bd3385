"""Provider profiles (``adapters/profiles.py``, issue 32): what each upstream kind is sent of Claude Code's Messages-
mode request — betas matched by family, mapped, dropped; body and tool fields dropped; ``safeguards`` refused, not
dropped; the first party and Foundry unchanged; an operator's override; bounded metric labels."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapters.profiles import PROFILES, beta_family, filter_request, metric_feature, profile_for
from gateway.wire.errors import InvalidRequest
from gateway.wire.request import ProxyRequest

# Claude Code 2.1.332 in Messages mode (ANTHROPIC_BASE_URL), as captured: its anthropic-beta header
MESSAGES_MODE_BETAS = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,per-turn-control-2026-07-01,"
    "mid-conversation-tool-changes-2026-07-01,advanced-tool-use-2025-11-20,effort-2025-11-24,"
    "thinking-token-count-2026-05-13"
)
TOOLS = [
    {"name": "Read", "description": "read a file", "input_schema": {"type": "object"}, "defer_loading": True},
    {"name": "Bash", "description": "run", "input_schema": {"type": "object"}, "eager_input_streaming": True},
]
BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-6",
    "messages": [{"role": "user", "content": "hi"}],
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc"}],
    "tools": TOOLS,
    "metadata": {"user_id": "u"},
    "max_tokens": 32000,
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "stream": True,
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    "output_config": {"effort": "high"},
    "tags": ["team-a"],
}


def request(body: dict[str, Any] | None = None, betas: str | None = MESSAGES_MODE_BETAS) -> ProxyRequest:
    return ProxyRequest(
        body=json.dumps(body or BODY).encode(),
        model="claude-sonnet-4-6",
        stream=True,
        request_id="r",
        anthropic_beta=betas,
    )


def test_a_beta_is_its_family_whatever_its_date() -> None:
    assert beta_family("effort-2025-11-24") == beta_family("effort-2026-03-01") == "effort"
    assert beta_family("claude-code-20250219") == beta_family("claude-code-20260101") == "claude-code"
    bedrock = PROFILES["bedrock"]
    kept, dropped = bedrock.apply_betas("effort-2026-03-01,thinking-token-count-2027-01-01")
    assert kept == ["effort-2026-03-01", "thinking-token-count-2027-01-01"] and dropped == ()


@pytest.mark.parametrize("kind", ["bedrock", "bedrock_converse", "bedrock_mantle", "vertex"])
def test_the_clouds_get_what_claude_code_sends_them_and_the_rest_is_named(kind: str) -> None:
    kept = filter_request(PROFILES[kind], request())
    assert kept.betas == [
        "claude-code-20250219",
        "interleaved-thinking-2025-05-14",
        "tool-search-tool-2025-10-19",  # advanced-tool-use, as the CLI names it for the clouds
        "effort-2025-11-24",
        "thinking-token-count-2026-05-13",
    ]
    assert kept.header == ",".join(kept.betas)
    assert set(kept.drop) == {"context_management", "tags"}
    converse = kind == "bedrock_converse"  # its toolSpec cannot say defer_loading
    assert ("defer_loading" in kept.set["tools"][0]) is not converse
    assert "eager_input_streaming" not in kept.set["tools"][1]
    assert kept.dropped == (
        "beta:context-management-2025-06-27",
        "beta:per-turn-control-2026-07-01",
        "beta:mid-conversation-tool-changes-2026-07-01",
        *(f"field:{name}" for name in kept.drop),
        *(["tool_field:defer_loading"] if converse else []),
        "tool_field:eager_input_streaming",
    )


def test_a_mapped_beta_is_sent_once() -> None:
    kept, _ = PROFILES["vertex"].apply_betas("tool-search-tool-2025-10-19, advanced-tool-use-2025-11-20")
    assert kept == ["tool-search-tool-2025-10-19"]


@pytest.mark.parametrize("kind", ["anthropic", "foundry", "claude_aws"])
def test_the_first_party_and_foundry_get_everything_unchanged(kind: str) -> None:
    req = request(betas=MESSAGES_MODE_BETAS + ",some-future-beta-2027-01-01")
    kept = filter_request(PROFILES[kind], req)
    assert PROFILES[kind].passthrough and kept.header == req.anthropic_beta and kept.drop == [] and kept.set == {}
    assert kept.dropped == () == req.dropped


def test_claude_codes_own_cloud_requests_pass_the_cloud_profiles_whole() -> None:
    """What the CLI sends Bedrock and Vertex in their own modes (the capture) loses nothing."""
    bedrock = {k: v for k, v in BODY.items() if k not in ("model", "stream", "context_management", "tags")}
    kept = filter_request(PROFILES["bedrock"], request(bedrock, "claude-code-20250219,effort-2025-11-24"))
    assert kept.dropped == ("tool_field:eager_input_streaming",)  # the only thing: a tool flag of our test body
    vertex_betas = (
        "claude-code-20250219,interleaved-thinking-2025-05-14,web-search-2025-03-05,tool-search-tool-2025-10-19,"
        "effort-2025-11-24,thinking-token-count-2026-05-13"
    )
    kept = filter_request(PROFILES["vertex"], request({**bedrock, "stream": True, "tools": TOOLS[:1]}, vertex_betas))
    assert kept.dropped == () and kept.header == vertex_betas


def test_safeguards_is_refused_by_a_cloud_and_passed_to_the_first_party() -> None:
    body = {**BODY, "safeguards": {"type": "auto"}}
    with pytest.raises(InvalidRequest, match=r"^safeguards: "):
        filter_request(PROFILES["vertex"], request(body))
    assert "safeguards" not in filter_request(PROFILES["anthropic"], request(body)).drop


def test_an_operators_override_allows_drops_and_removes_fields() -> None:
    vertex = profile_for("vertex", allow=["context-management"], drop=["effort-2025-11-24"], drop_fields=["metadata"])
    kept = filter_request(vertex, request())
    assert "context-management-2025-06-27" in kept.betas and not any(b.startswith("effort") for b in kept.betas)
    assert "beta:effort-2025-11-24" in kept.dropped and "metadata" in kept.drop
    first = profile_for("anthropic", drop=["per-turn-control"], drop_fields=["tags"])
    assert not first.passthrough
    kept = filter_request(first, request(betas=MESSAGES_MODE_BETAS + ",unknown-2030-01-01"))
    assert "unknown-2030-01-01" in kept.betas  # an unknown beta on the first party is never dropped
    assert "beta:per-turn-control-2026-07-01" in kept.dropped and kept.drop == ["tags"]
    assert profile_for("vertex") is PROFILES["vertex"]  # no override: the shared profile, its cache with it


def test_the_beta_lookup_is_one_dict_lookup_for_a_header_seen_before() -> None:
    profile = profile_for("bedrock", allow=["x-test"])  # a profile of its own: an empty cache
    first = profile.apply_betas(MESSAGES_MODE_BETAS)
    assert profile.apply_betas(MESSAGES_MODE_BETAS) is first
    for i in range(1000):  # distinct headers (a hostile client): the cache stays bounded
        profile.apply_betas(f"beta-{i}")
    assert len(profile._cache) <= 256


def test_metric_labels_are_bounded() -> None:
    assert metric_feature("beta:context-management-2025-06-27") == "beta:context-management"
    assert metric_feature("beta:made-up-by-a-client-2099-01-01") == "beta:other"
    assert metric_feature("field:context_management") == "field:context_management"
    assert metric_feature("field:whatever_a_client_sends") == "field:other"
    assert metric_feature("tool_field:eager_input_streaming") == "tool_field:eager_input_streaming"


def test_a_system_turn_is_folded_into_a_user_turn_for_the_clouds_and_kept_for_the_first_party() -> None:
    """Claude Code in Messages mode ends its first request with a ``role: system`` turn (its environment): the clouds
    refuse that role; it becomes reminder blocks of the user turn, as Claude Code wraps system context in them."""
    env = {
        "role": "system",
        "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}],
    }
    body = {**BODY, "messages": [{"role": "user", "content": "hi"}, env]}
    kept = filter_request(PROFILES["bedrock"], request(body))
    assert kept.set["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {
                    "type": "text",
                    "text": "<system-reminder>\n# Environment\n</system-reminder>",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        }
    ]
    assert kept.dropped[-1] == "message:system_role" and metric_feature("message:system_role") == "message:system_role"
    middle = {
        **BODY,
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {**env, "content": "c"},
            {"role": "user", "content": "d"},
        ],
    }
    folded = filter_request(PROFILES["vertex"], request(middle)).set["messages"]
    assert [m["role"] for m in folded] == ["user", "assistant", "user"]
    assert folded[2]["content"] == [
        {"type": "text", "text": "<system-reminder>\nc\n</system-reminder>"},
        {"type": "text", "text": "d"},
    ]
    after_assistant = {
        **BODY,
        "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, env],
    }
    assert [m["role"] for m in filter_request(PROFILES["vertex"], request(after_assistant)).set["messages"]] == [
        "user",
        "assistant",
        "user",
    ]
    first = filter_request(PROFILES["anthropic"], request(body))
    assert "messages" not in first.set and first.dropped == ()
    plain = filter_request(PROFILES["bedrock"], request({**BODY, "system": "the system prompt"}))
    assert "messages" not in plain.set  # no system turn: the messages are not decoded, not touched

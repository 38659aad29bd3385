"""Named inbound keys with per-key aliases, the client-header policy and the per-alias max_tokens ceiling,
end to end with the real ``anthropic`` SDK through the gateway to the fake Claude API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

KW: dict[str, Any] = {"max_tokens": 1024, "messages": [{"role": "user", "content": "Hello"}]}
SONNET_ONLY = "sk-gw-sonnet-only-0123456789"
EVERYTHING = "sk-gw-everything-0123456789"
PLAIN = "plain-string-key"


def policy_config(base_url: str) -> str:
    return f"""
server:
  forward_headers: [X-Team, authorization, x-api-key, cookie]
auth:
  keys:
    - {{name: sonnet-only, key: {SONNET_ONLY}, models: [sonnet]}}
    - {{name: everything, key: {EVERYTHING}}}
    - {PLAIN}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{base_url}"}}
models:
  sonnet:
    targets: [{{provider: claude, model: fake-text}}]
  opus:
    targets: [{{provider: claude, model: fake-text}}]
  capped:
    max_tokens: 512
    targets: [{{provider: claude, model: fake-text}}]
"""


@pytest.fixture(scope="module")
def policy_gw(fake_claude: FakeClaudeAPI) -> Iterator[RunningGateway]:
    with run_gateway(policy_config(fake_claude.base_url)) as gw:
        yield gw


def via(gw: RunningGateway, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


def call(client: anthropic.Anthropic, model: str, *, stream: bool, **kw: Any) -> str:
    args = {**KW, **kw}
    if stream:
        with client.messages.stream(model=model, **args) as s:
            return s.get_final_message().stop_reason or ""
    return client.messages.create(model=model, **args).stop_reason or ""


# --- keys ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_a_key_limited_to_sonnet_gets_403_on_another_alias(
    stream: bool, fake: FakeClaudeAPI, policy_gw: RunningGateway
) -> None:
    with pytest.raises(anthropic.PermissionDeniedError) as info:
        call(via(policy_gw, SONNET_ONLY), "opus", stream=stream)
    assert info.value.status_code == 403
    assert info.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    assert "sonnet-only" in info.value.message
    assert SONNET_ONLY not in info.value.response.text
    assert fake.requests == []  # refused before anything went upstream


@pytest.mark.parametrize("stream", [True, False])
def test_a_key_limited_to_sonnet_may_use_sonnet(stream: bool, fake: FakeClaudeAPI, policy_gw: RunningGateway) -> None:
    assert call(via(policy_gw, SONNET_ONLY), "sonnet", stream=stream) == "end_turn"
    assert len(fake.requests) == 1


def test_an_unlimited_key_and_a_plain_string_key_may_use_every_alias(policy_gw: RunningGateway) -> None:
    for key in (EVERYTHING, PLAIN):
        for model in ("sonnet", "opus"):
            assert call(via(policy_gw, key), model, stream=False) == "end_turn"


def test_count_tokens_obeys_the_key_too(policy_gw: RunningGateway) -> None:
    client = via(policy_gw, SONNET_ONLY)
    assert client.messages.count_tokens(model="sonnet", messages=KW["messages"]).input_tokens > 0
    with pytest.raises(anthropic.PermissionDeniedError):
        client.messages.count_tokens(model="opus", messages=KW["messages"])


def test_models_are_listed_per_key(policy_gw: RunningGateway) -> None:
    assert [m.id for m in via(policy_gw, SONNET_ONLY).models.list()] == ["sonnet"]
    assert [m.id for m in via(policy_gw, EVERYTHING).models.list()] == ["sonnet", "opus", "capped"]
    assert via(policy_gw, SONNET_ONLY).models.retrieve("sonnet").id == "sonnet"
    with pytest.raises(anthropic.NotFoundError):
        via(policy_gw, SONNET_ONLY).models.retrieve("opus")
    assert via(policy_gw, EVERYTHING).models.retrieve("opus").id == "opus"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens", "/v1/models"])
def test_an_unknown_key_is_401_and_never_echoed(path: str, fake: FakeClaudeAPI, policy_gw: RunningGateway) -> None:
    wrong = "sk-gw-not-a-real-key-9f8e7d6c"
    if path == "/v1/models":
        resp = httpx.get(policy_gw.url + path, headers={"x-api-key": wrong})
    else:
        resp = httpx.post(
            policy_gw.url + path, json={"model": "sonnet", **KW}, headers={"authorization": f"Bearer {wrong}"}
        )
    assert resp.status_code == 401
    assert resp.json()["error"]["type"] == "authentication_error"
    assert wrong not in resp.text
    with pytest.raises(anthropic.AuthenticationError) as info:
        via(policy_gw, wrong).messages.create(model="sonnet", **KW)
    assert wrong not in info.value.response.text and wrong not in info.value.message
    assert fake.requests == []


def test_plain_string_keys_still_work(gateway: RunningGateway) -> None:
    # the shared gateway's auth.keys is a list of plain strings
    assert call(via(gateway, "gw-key-2"), "sonnet", stream=True) == "end_turn"
    with pytest.raises(anthropic.AuthenticationError):
        call(via(gateway, "gw-key-3"), "sonnet", stream=False)


# --- header policy -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_forward_headers_allow_list(stream: bool, fake: FakeClaudeAPI, policy_gw: RunningGateway) -> None:
    client = via(policy_gw, EVERYTHING)
    headers = {
        "x-team": "blue",
        "x-other": "no",
        "anthropic-beta": "fake-beta-2025-01-01",
        "cookie": "s=1",
        "anthropic-version": "2023-06-01",
        "authorization": f"Bearer {EVERYTHING}",  # besides the SDK's x-api-key
    }
    call(client, "sonnet", stream=stream, extra_headers=headers)
    (seen,) = fake.requests
    assert seen.headers["x-team"] == "blue"  # listed (in another case): forwarded
    assert "x-other" not in seen.headers  # not listed
    assert "anthropic-beta" not in seen.headers  # not listed: dropped
    assert "authorization" not in seen.headers and "cookie" not in seen.headers  # listed, but never forwarded
    assert seen.headers["x-api-key"] == "provider-key"  # the provider's key, never the client's
    assert all(EVERYTHING not in value for value in seen.headers.values())
    assert seen.headers["anthropic-version"] == "2023-06-01"  # the client's, carried as before


def test_default_policy_forwards_anthropic_beta_only(fake: FakeClaudeAPI, gateway: RunningGateway) -> None:
    headers = {"x-team": "blue", "anthropic-beta": "fake-beta-2025-01-01"}
    call(via(gateway, "gw-key-1"), "sonnet", stream=False, extra_headers=headers)
    (seen,) = fake.requests
    assert seen.headers["anthropic-beta"] == "fake-beta-2025-01-01"
    assert "x-team" not in seen.headers
    assert "authorization" not in seen.headers


# --- max_tokens ceiling --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_max_tokens_above_the_ceiling_is_400_before_anything_is_sent(
    stream: bool, fake: FakeClaudeAPI, policy_gw: RunningGateway
) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        call(via(policy_gw, EVERYTHING), "capped", stream=stream, max_tokens=513)
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "512" in info.value.message
    assert fake.requests == []


def test_max_tokens_at_the_ceiling_and_count_tokens_are_unaffected(
    fake: FakeClaudeAPI, policy_gw: RunningGateway
) -> None:
    client = via(policy_gw, EVERYTHING)
    assert call(client, "capped", stream=False, max_tokens=512) == "end_turn"
    assert client.messages.count_tokens(model="capped", messages=KW["messages"]).input_tokens > 0
    assert call(client, "sonnet", stream=False, max_tokens=4096) == "end_turn"  # other aliases: no ceiling


@pytest.mark.parametrize("stream", [True, False])
def test_max_tokens_policy_clamp_lowers_the_request_and_says_so(stream: bool, fake: FakeClaudeAPI) -> None:
    """Claude Code always asks for 32,000-128,000 tokens: with ``clamp`` the request goes upstream at the ceiling
    (the rest of the body untouched) and the response says what was changed."""
    config = policy_config(fake.base_url) + (
        "  clamped:\n    max_tokens: 512\n    max_tokens_policy: clamp\n"
        "    targets: [{provider: claude, model: fake-text}]\n"
    )
    with run_gateway(config) as gw:
        body = {**KW, "model": "clamped", "max_tokens": 64000, "system": "be brief", "stream": stream}
        resp = httpx.post(f"{gw.url}/v1/messages", json=body, headers={"x-api-key": EVERYTHING})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-gateway-max-tokens-clamped"] == "64000 -> 512"
        assert ("event: message_stop" in resp.text) if stream else resp.json()["stop_reason"] == "end_turn"
        sent = json.loads(fake.requests[-1].body)
        assert sent["max_tokens"] == 512 and sent["system"] == "be brief" and sent["model"] == "fake-text"
        plain = httpx.post(f"{gw.url}/v1/messages", json={**body, "max_tokens": 100}, headers={"x-api-key": EVERYTHING})
        assert "x-gateway-max-tokens-clamped" not in plain.headers
        assert json.loads(fake.requests[-1].body)["max_tokens"] == 100

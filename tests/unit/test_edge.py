"""The edge: inbound keys (naming, constant-time matching, per-key aliases), the header policy and the
max_tokens ceiling, without a server."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from types import SimpleNamespace
from typing import Any, cast

import pytest

from adapters._http import HeaderAuth, Operation
from adapters.claude import USER_AGENT, ClaudeAdapter
from gateway.governance.keys import ClientKey, authenticate, authorize, build_keys, may_use
from gateway.settings import ApiKey, parse_settings
from gateway.wire.errors import AuthenticationError, InvalidRequest, PermissionDenied
from gateway.wire.request import NEVER_FORWARDED, ProxyRequest, check_max_tokens, forwarded_headers, proxy_request
from gateway.wire.upstream import Timeouts


def route(alias: str, *models: str | None) -> Any:
    """A stand-in for ``gateway.routing.table.Route``: the edge reads only ``alias`` and each target's ``model``."""
    return SimpleNamespace(alias=alias, targets=tuple(SimpleNamespace(model=m) for m in models or (None,)))


# --- build_keys ---------------------------------------------------------------------------------------------


def test_build_keys_names_plain_strings_by_position_and_keeps_named_entries() -> None:
    keys = build_keys(["alpha", ApiKey(name="team-a", key="beta", models=["sonnet"]), "", "gamma"])
    assert [(k.name, k.key, k.models) for k in keys] == [
        ("key-1", b"alpha", None),
        ("team-a", b"beta", ("sonnet",)),
        ("key-4", b"gamma", None),  # the empty entry (an unset ${VAR:-}) is skipped but keeps its position
    ]


def test_build_keys_from_yaml_mixes_strings_and_mappings() -> None:
    settings = parse_settings(
        """
auth:
  keys:
    - plain-key
    - {name: ci, key: ci-key, models: ["claude-haiku-*", sonnet]}
    - {name: ops, key: ops-key}
"""
    )
    keys = build_keys(settings.auth.keys)
    assert [(k.name, k.models) for k in keys] == [("key-1", None), ("ci", ("claude-haiku-*", "sonnet")), ("ops", None)]


def test_a_key_given_by_its_sha256_authenticates_the_secret_and_carries_team_and_user() -> None:
    """``key_sha256``: the file holds the digest, never the secret; ``team``/``user`` attribute the requests."""
    import hashlib

    digest = hashlib.sha256(b"sk-alice-secret").hexdigest()
    settings = parse_settings(
        f"""
auth:
  keys:
    - {{name: alice, key_sha256: "{digest.upper()}", team: payments, user: alice@example.com}}
    - {{name: bob, key: sk-bob, team: payments}}
    - sk-plain
"""
    )
    keys = build_keys(settings.auth.keys)
    assert [(k.name, k.team, k.user) for k in keys] == [
        ("alice", "payments", "alice@example.com"),
        ("bob", "payments", ""),
        ("key-3", "", ""),
    ]
    assert keys[0].key == b"" and "sk-alice" not in repr(keys[0])
    assert authenticate(keys, {"x-api-key": "sk-alice-secret"})[1] is keys[0]
    assert authenticate(keys, {"authorization": "Bearer sk-bob"})[1] is keys[1]
    with pytest.raises(AuthenticationError):
        authenticate(keys, {"x-api-key": digest})  # the digest itself is not the key


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{name: a}", "set exactly one of key and key_sha256"),
        ("{name: a, key: k, key_sha256: '" + "0" * 64 + "'}", "set exactly one of key and key_sha256"),
        ("{name: a, key_sha256: abc}", "64 hexadecimal digits"),
        ("{name: a, key_sha256: " + "g" * 64 + "}", "64 hexadecimal digits"),
    ],
)
def test_a_key_entry_needs_exactly_one_valid_secret(entry: str, message: str) -> None:
    from gateway.settings import ConfigError

    with pytest.raises(ConfigError, match=message):
        parse_settings(f"auth:\n  keys:\n    - {entry}\n")


def test_client_key_repr_never_shows_the_key() -> None:
    key = ClientKey(name="team-a", key=b"sk-very-secret")
    assert "sk-very-secret" not in repr(key)
    assert "team-a" in repr(key)


# --- authenticate ---------------------------------------------------------------------------------------------

KEYS = build_keys(["k-one", ApiKey(name="two", key="k-two", models=["sonnet"]), "k-three", "k-four"])


def test_open_gateway_returns_the_sent_headers_and_no_key() -> None:
    assert authenticate([], {"x-api-key": "anything"}) == ({"x-api-key": "anything"}, None)
    assert authenticate([], {}) == ({}, None)


@pytest.mark.parametrize(
    ("headers", "name"),
    [
        ({"x-api-key": "k-one"}, "key-1"),
        ({"x-api-key": "k-two"}, "two"),
        ({"authorization": "Bearer k-four"}, "key-4"),
        ({"authorization": "bearer  k-three "}, "key-3"),
        ({"x-api-key": "wrong", "authorization": "Bearer k-two"}, "two"),
    ],
)
def test_authenticate_returns_the_matching_key(headers: dict[str, str], name: str) -> None:
    sent, key = authenticate(KEYS, headers)
    assert sent == headers
    assert key is not None and key.name == name


@pytest.mark.parametrize("headers", [{}, {"x-api-key": ""}, {"authorization": "Basic abc"}])
def test_missing_key_is_401(headers: dict[str, str]) -> None:
    with pytest.raises(AuthenticationError, match="missing API key"):
        authenticate(KEYS, headers)


def test_invalid_key_is_401_without_the_key_in_the_message() -> None:
    with pytest.raises(AuthenticationError) as info:
        authenticate(KEYS, {"x-api-key": "k-one-but-wrong", "authorization": "Bearer also-wrong"})
    assert info.value.status_code == 401
    assert info.value.error_type == "authentication_error"
    assert "k-one-but-wrong" not in info.value.message and "also-wrong" not in info.value.message


@pytest.mark.parametrize(
    "headers",
    [
        {"x-api-key": "k-one"},  # matches the first key: the others are still compared
        {"x-api-key": "k-four"},
        {"x-api-key": "nope"},  # no match
        {"x-api-key": "k-one", "authorization": "Bearer k-four"},  # two candidates
        {"x-api-key": "nope", "authorization": "Bearer nope"},
    ],
)
def test_every_candidate_is_compared_with_every_key(headers: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    with contextlib.suppress(AuthenticationError):
        authenticate(KEYS, headers)
    candidates = len(headers)
    assert len(calls) == candidates * len(KEYS)
    assert {len(a) for a, _ in calls} == {32} and {len(b) for _, b in calls} == {32}  # digests: lengths hidden


def test_the_first_of_two_entries_with_the_same_key_wins() -> None:
    keys = build_keys([ApiKey(name="narrow", key="same", models=["sonnet"]), "same"])
    _, key = authenticate(keys, {"x-api-key": "same"})
    assert key is not None and key.name == "narrow"


# --- authorize -------------------------------------------------------------------------------------------------


def test_a_key_without_models_and_an_open_gateway_may_use_everything() -> None:
    authorize(None, route("opus", "claude-opus"), "opus")
    authorize(ClientKey(name="all", key=b"k"), route("opus", "claude-opus"), "opus")


@pytest.mark.parametrize(
    ("patterns", "alias", "targets", "model", "allowed"),
    [
        (["sonnet"], "sonnet", ["x"], "sonnet", True),
        (["sonnet"], "opus", ["x"], "opus", False),
        (["son*"], "sonnet", ["x"], "sonnet", True),
        (["Sonnet"], "sonnet", ["x"], "sonnet", False),  # case-sensitive, as routing is
        (["claude-[hs]*"], "claude-sonnet-4", ["x"], "claude-sonnet-4", True),
        ([], "sonnet", ["x"], "sonnet", False),  # an empty list: nothing
        # a forwarding glob route: the client's model name counts too
        (["claude-haiku-*"], "claude-*", [None], "claude-haiku-4-5", True),
        (["claude-haiku-*"], "claude-*", [None], "claude-opus-4-1", False),
        (["claude-*"], "claude-*", [None], "claude-opus-4-1", True),  # the glob alias named as itself
        # a glob route that sends a fixed model: only its alias counts
        (["claude-haiku-*"], "claude-*", ["opus-id"], "claude-haiku-4-5", False),
        (["claude-haiku-*"], "claude-*", [None, "opus-id"], "claude-haiku-4-5", False),
        (["[*]"], "*", ["x"], "anything", True),  # the literal "*" alias
    ],
)
def test_authorize_globs(patterns: list[str], alias: str, targets: list[str | None], model: str, allowed: bool) -> None:
    key = ClientKey(name="team", key=b"secret-value", models=tuple(patterns))
    assert may_use(key, route(alias, *targets), model) is allowed
    if allowed:
        authorize(key, route(alias, *targets), model)
    else:
        with pytest.raises(PermissionDenied) as info:
            authorize(key, route(alias, *targets), model)
        assert info.value.status_code == 403 and info.value.error_type == "permission_error"
        assert "'team'" in info.value.message and repr(model) in info.value.message
        assert "secret-value" not in info.value.message


# --- max_tokens ceiling ----------------------------------------------------------------------------------------


def test_max_tokens_ceiling() -> None:
    check_max_tokens(4096, None, "sonnet")
    check_max_tokens(4096, 4096, "sonnet")
    with pytest.raises(InvalidRequest, match=r"max_tokens: 4097 > 4096") as info:
        check_max_tokens(4097, 4096, "sonnet")
    assert info.value.status_code == 400


# --- header policy ---------------------------------------------------------------------------------------------

CLIENT_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "beta-1",
    "x-team": "blue",
    "x-trace-id": "t-1",
    "authorization": "Bearer gw-key",
    "x-api-key": "gw-key",
    "cookie": "session=1",
    "host": "gateway",
    "content-length": "12",
}


def _proxy(forward: list[str] | None) -> Any:
    return proxy_request(
        CLIENT_HEADERS, "", body=b"{}", model="m", stream=False, client_auth={}, request_id="r", forward=forward
    )


def test_default_policy_forwards_anthropic_beta_only() -> None:
    request = _proxy(None)
    assert request.anthropic_beta == "beta-1"
    assert request.anthropic_version == "2023-06-01"
    assert request.extra_headers == {}


def test_an_allow_list_forwards_exactly_the_listed_headers() -> None:
    request = _proxy(["X-Team", "x-absent"])
    assert request.extra_headers == {"x-team": "blue"}
    assert request.anthropic_beta is None  # not listed: dropped
    assert request.anthropic_version == "2023-06-01"  # always carried


def test_anthropic_beta_is_forwarded_when_listed_in_its_own_field() -> None:
    request = _proxy(["Anthropic-Beta", "x-trace-id"])
    assert request.anthropic_beta == "beta-1"
    assert request.extra_headers == {"x-trace-id": "t-1"}


def test_never_forwarded_headers_are_ignored_whatever_the_list_says() -> None:
    listed = [*NEVER_FORWARDED, "Authorization", "anthropic-version", "x-team"]
    assert forwarded_headers(CLIENT_HEADERS, listed) == {"x-team": "blue"}
    named = {"authorization", "x-api-key", "api-key", "host", "content-length", "connection", "transfer-encoding"}
    assert named | {"cookie"} <= NEVER_FORWARDED
    assert forwarded_headers(CLIENT_HEADERS, []) == {}


def test_claude_adapter_sends_the_extras_but_its_own_headers_win() -> None:
    adapter = ClaudeAdapter(
        "claude",
        cast(Any, None),
        base_url="http://upstream",
        timeouts=Timeouts(1, 1),
        auth=HeaderAuth({"x-api-key": "provider-key"}),
        extra_headers={"anthropic-workspace-id": "ws-1"},
    )
    extras = {"x-team": "blue", "user-agent": "client/1", "anthropic-workspace-id": "ws-client", "accept": "*/*"}
    request = ProxyRequest(body=b"{}", model="m", stream=True, request_id="r", extra_headers=extras)

    async def sent() -> dict[str, str]:  # what goes on the wire: prepared, then authenticated
        url, body, headers = await adapter.prepare(request, "m", Operation.STREAM)
        return await adapter.auth.apply(request, url, headers, body)

    headers = asyncio.run(sent())
    assert headers["x-team"] == "blue"
    assert headers["user-agent"] == USER_AGENT
    assert headers["anthropic-workspace-id"] == "ws-1"
    assert headers["accept"] == "text/event-stream"
    assert headers["x-api-key"] == "provider-key"

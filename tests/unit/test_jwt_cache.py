"""The JWT verifier's memory (``gateway/governance/jwt_auth.py``), against a local identity provider
(``tests/jwt_issuer.py``): it remembers verified claims, never a principal, so a reload's teams apply to a token
already seen; an entry lives at most ``min(exp, verified + jwks_cache_s)``; a JWKS fetch forgets the tokens of a
withdrawn or changed key; and ``unknown_team`` refuses (or allows) a token that names no configured team."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from gateway.governance import jwt_auth
from gateway.governance.jwt_auth import JwtVerifier
from gateway.settings import ConfigError, JwtSettings, TeamSettings, parse_settings
from gateway.wire.errors import AuthenticationError, PermissionDenied
from tests.jwt_issuer import AUDIENCE, LocalIssuer

WIDE = {"pay": TeamSettings(models=["claude-opus-*", "claude-sonnet-*"])}
NARROW = {"pay": TeamSettings(models=["claude-sonnet-*"])}


@pytest.fixture
def issuer() -> Iterator[LocalIssuer]:
    local = LocalIssuer()
    local.add_key("k2")
    yield local
    local.close()


class Clock:
    """Wall time that moves only when told (PyJWT's own ``exp`` check reads the real one)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def settings(issuer: LocalIssuer, **fields: Any) -> JwtSettings:
    return msgspec.convert(
        {"issuer": issuer.url, "audience": AUDIENCE, "user_claim": "email", "team_claim": "groups", **fields},
        JwtSettings,
    )


def counting_decodes(verifier: JwtVerifier) -> list[str]:
    """The tokens ``verifier`` checks a signature of, in order."""
    seen: list[str] = []
    decode = verifier._decode

    def spy(token: str, key: Any, alg: str) -> dict[str, Any]:
        seen.append(token)
        return decode(token, key, alg)

    verifier._decode = spy  # type: ignore[method-assign]
    return seen


def test_a_remembered_token_gets_the_teams_of_the_running_config(issuer: LocalIssuer) -> None:
    """Before: the principal itself was remembered, so a reload that narrowed team pay left a token already seen
    with the old team's models."""
    verifier = JwtVerifier(settings(issuer))
    decodes = counting_decodes(verifier)
    token = issuer.token(groups=["pay"])

    async def go() -> None:
        wide = await verifier.principal(token, WIDE)
        assert wide.allows("claude-opus-4-6") and wide.team == "pay"
        assert await verifier.principal(token, WIDE) is wide  # the same teams: the same principal
        narrow = await verifier.principal(token, NARROW)  # the reloaded config's teams
        assert not narrow.allows("claude-opus-4-6") and narrow.allows("claude-sonnet-4-6")
        again = {"pay": TeamSettings(models=["claude-opus-*"])}  # equal content matters not: a new mapping
        assert (await verifier.principal(token, again)).models == ("claude-opus-*",)

    asyncio.run(go())
    assert decodes == [token]  # the signature was checked once: the claims are what is remembered


def test_an_entry_lives_until_the_earlier_of_exp_and_the_jwks_cache_life(issuer: LocalIssuer) -> None:
    """Before: a token was remembered until its ``exp`` whatever the key set did meanwhile."""
    clock = Clock()
    verifier = JwtVerifier(settings(issuer, jwks_cache_s=60), clock=clock)
    decodes = counting_decodes(verifier)
    long_lived = issuer.token(exp=int(clock.now) + 600)
    short_lived = issuer.token(exp=int(clock.now) + 30, jti="short")

    async def go() -> None:
        await verifier.principal(long_lived, WIDE)
        await verifier.principal(short_lived, WIDE)
        clock.now += 29  # before either bound: both remembered
        await verifier.principal(long_lived, WIDE)
        await verifier.principal(short_lived, WIDE)
        assert decodes == [long_lived, short_lived]
        clock.now += 2  # past the short token's exp (30 s), within the cache life (60 s)
        await verifier.principal(long_lived, WIDE)
        assert decodes == [long_lived, short_lived]
        clock.now += 30  # 61 s: past the cache life, long before the long token's exp
        await verifier.principal(long_lived, WIDE)  # verified again, against the keys held, and still good
        assert decodes == [long_lived, short_lived, long_lived]
        await verifier.principal(long_lived, WIDE)
        assert decodes == [long_lived, short_lived, long_lived]  # remembered again, for another 60 s

    asyncio.run(go())
    remembered = verifier._remembered
    assert remembered[long_lived].until == clock.now + 60
    assert remembered[short_lived].until == int(clock.now) - 61 + 30  # its exp


def test_a_jwks_fetch_forgets_the_tokens_of_a_withdrawn_kid(
    issuer: LocalIssuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issuer stops publishing k2 and publishes k3; the first k3 token makes the verifier fetch the set, and
    from then an earlier k2 token is refused, long before its entry's time is up. Before: accepted until its
    ``exp``."""
    monkeypatch.setattr(jwt_auth, "REFETCH_S", 0.0)  # a new kid may fetch at once (the floor is its own test)
    clock = Clock()  # frozen: no entry reaches its time
    verifier = JwtVerifier(settings(issuer), clock=clock)
    old, kept = issuer.token("k2", jti="old"), issuer.token("k1", jti="kept")

    async def go() -> None:
        assert (await verifier.principal(old, WIDE)).user == "alice@example.com"
        await verifier.principal(kept, WIDE)
        issuer.published.remove("k2")
        issuer.add_key("k3")
        fetches = verifier.fetches
        await verifier.principal(issuer.token("k3"), WIDE)
        assert verifier.fetches == fetches + 1
        with pytest.raises(AuthenticationError, match="does not publish"):
            await verifier.principal(old, WIDE)
        await verifier.principal(kept, WIDE)  # a key still published keeps its tokens

    asyncio.run(go())
    assert kept in verifier._remembered and old not in verifier._remembered


def test_a_jwks_fetch_forgets_the_tokens_of_a_key_whose_material_changed(
    issuer: LocalIssuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same kid, a new key behind it (a re-keyed issuer that reuses its names): tokens signed with the old
    key no longer verify."""
    monkeypatch.setattr(jwt_auth, "REFETCH_S", 0.0)
    clock = Clock()
    verifier = JwtVerifier(settings(issuer), clock=clock)
    old = issuer.token("k2", jti="old")

    async def go() -> None:
        await verifier.principal(old, WIDE)
        issuer.published.remove("k2")
        issuer.add_key("k2")  # new material, the same kid
        issuer.add_key("k4")
        await verifier.principal(issuer.token("k4"), WIDE)  # fetches the set
        with pytest.raises(AuthenticationError, match="signature does not verify"):
            await verifier.principal(old, WIDE)
        await verifier.principal(issuer.token("k2", jti="new"), WIDE)

    asyncio.run(go())


def test_a_healthy_token_outlives_the_default_jwks_cache_life(issuer: LocalIssuer) -> None:
    """The default ``jwks_cache_s`` (300 s) passes for both the remembered entry and the key set: the token is
    verified again, the set fetched again once, and it is still accepted (the long-haul twin in
    ``tests/e2e/test_jwt_cache.py`` waits the real 300 s)."""
    clock, monotonic = Clock(), Clock()
    verifier = JwtVerifier(settings(issuer), clock=clock, monotonic=monotonic)
    assert verifier.settings.jwks_cache_s == 300
    decodes = counting_decodes(verifier)
    token = issuer.token(exp=int(time.time()) + 900)

    async def go() -> None:
        await verifier.principal(token, WIDE)
        fetches = verifier.fetches
        clock.now += 301
        monotonic.now += 301
        principal = await verifier.principal(token, WIDE)
        assert principal.allows("claude-opus-4-6") and principal.name == "jwt:alice@example.com"
        assert verifier.fetches == fetches + 1 and decodes == [token, token]

    asyncio.run(go())


def test_a_token_of_no_configured_team_is_refused_by_default(issuer: LocalIssuer) -> None:
    """Before: a token whose groups named no team got every model."""
    verifier = JwtVerifier(settings(issuer))
    assert verifier.settings.unknown_team == "deny"

    async def go() -> None:
        for token in (issuer.token(groups=["staff", "ops"]), issuer.token(groups=None), issuer.token(groups="ops")):
            with pytest.raises(PermissionDenied, match="no configured team matches its 'groups' claim") as info:
                await verifier.principal(token, WIDE)
            assert info.value.status_code == 403 and info.value.error_type == "permission_error"
        assert (await verifier.principal(issuer.token(groups=["staff", "pay"]), WIDE)).team == "pay"
        remembered = issuer.token(groups=["pay"], jti="was-in-a-team")
        await verifier.principal(remembered, WIDE)
        with pytest.raises(PermissionDenied):  # a reload removed its team: refused at once
            await verifier.principal(remembered, {"other": TeamSettings(models=["x"])})

    asyncio.run(go())


def test_unknown_team_allow_keeps_every_model_and_the_first_name(issuer: LocalIssuer) -> None:
    verifier = JwtVerifier(settings(issuer, unknown_team="allow"))

    async def go() -> None:
        principal = await verifier.principal(issuer.token(groups=["staff", "ops"]), WIDE)
        assert (principal.team, principal.models) == ("staff", None)
        assert (await verifier.principal(issuer.token(groups=None), WIDE)).team == ""

    asyncio.run(go())


def test_without_a_team_claim_unknown_team_does_not_apply(issuer: LocalIssuer) -> None:
    verifier = JwtVerifier(settings(issuer, team_claim=None))
    principal = asyncio.run(verifier.principal(issuer.token(groups=["staff"]), WIDE))
    assert (principal.team, principal.models) == ("", None)


def test_a_team_claim_that_must_match_and_no_teams_is_a_config_error() -> None:
    base = """
auth: {{jwt: {{issuer: "https://login.example", audience: gw, team_claim: groups{extra}}}}}
providers: {{m: {{kind: mock}}}}
models: {{live: {{targets: [{{provider: m}}]}}}}
"""
    with pytest.raises(ConfigError, match="unknown_team: allow"):
        parse_settings(base.format(extra=""), environ={})
    assert parse_settings(base.format(extra=", unknown_team: allow"), environ={}).auth.jwt is not None
    with pytest.raises(ConfigError):
        parse_settings(base.format(extra=", unknown_team: maybe"), environ={})

"""The device flow's timers and answers with an injected clock (``gateway.governance.signin``), and the bearer's
check (``gateway.governance.sessions``): what it is made of, remembered after the first check, refused once expired
or revoked — in this process at once, in another at its next poll — and rebuilt under a reloaded config."""

from __future__ import annotations

import asyncio
from typing import Any

import jwt
import pytest

from gateway.governance import sessions as sessions_module
from gateway.governance.identity import SESSION_PREFIX as IDENTITY_PREFIX
from gateway.governance.sessions import SESSION_PREFIX, Sessions, policy_for
from gateway.governance.signin import OAuthError, SignIn, format_user_code, sha
from gateway.governance.signin_store import MemorySigninStore, UserInfo
from gateway.settings import Settings, parse_settings
from gateway.wire.errors import AuthenticationError

ALICE = UserInfo(subject="u-1", email="alice@example.com", name="Alice", groups=["eng", "payments"])
YAML = """
auth: {keys: [sk-x]}
teams: {payments: {models: ["claude-sonnet-*"]}, eng: {}}
login:
  public_url: https://gw.example.com
  oidc: {issuer: "https://idp.example.com", client_id: gw}
managed:
  policies:
    - match: {groups: [eng]}
      settings: {availableModels: [sonnet, "claude-haiku-*"]}
    - settings: {model: opus}
"""


class Clock:
    def __init__(self) -> None:
        import time

        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def setup(yaml: str = YAML) -> tuple[Settings, MemorySigninStore, Sessions, SignIn, Clock]:
    settings = parse_settings(yaml, environ={})
    assert settings.login is not None
    store = MemorySigninStore()
    clock = Clock()

    async def opened() -> MemorySigninStore:
        return store

    sessions = Sessions(opened, clock=clock)
    return settings, store, sessions, SignIn(settings.login, opened, sessions, clock=clock), clock


async def approve(store: MemorySigninStore, signin: SignIn, clock: Clock, user: UserInfo = ALICE) -> str:
    """A device code started and approved as the browser would (the IdP half skipped): its device code."""
    started = await signin.start("claude_code", "10.0.0.1")
    digest = sha(started["device_code"])
    now = int(clock.now * 1000)
    assert await store.begin(digest, state="s", nonce="n", code_verifier="v", browser_sha256="b", now_ms=now)
    assert await store.finish(digest, user, now)
    return str(started["device_code"])


def grant(code: str) -> dict[str, str]:
    return {"grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": code}


def test_the_prefix_identity_checks_is_the_one_minted() -> None:
    assert IDENTITY_PREFIX == SESSION_PREFIX
    token = jwt.encode({"a": 1}, b"k" * 32, algorithm="HS256", headers={"kid": "mgw-session"})
    assert token.startswith(SESSION_PREFIX)


def test_user_codes_are_read_as_people_type_them() -> None:
    assert format_user_code("bcdf ghjk") == "BCDF-GHJK"
    assert format_user_code("BCDF-GHJ") is None
    assert format_user_code("ABCD-EFGH") is None  # vowels are not in the alphabet


def test_the_device_grant_answers_every_rfc_8628_error_on_its_clock() -> None:
    async def go() -> None:
        _, store, _, signin, clock = setup()
        started = await signin.start("claude_code", "10.0.0.1")
        code = started["device_code"]
        with pytest.raises(OAuthError) as pending:
            await signin.token(grant(code))
        assert (pending.value.status, pending.value.error) == (400, "authorization_pending")
        clock.now += 2  # faster than the 5 s interval
        with pytest.raises(OAuthError) as slow:
            await signin.token(grant(code))
        assert slow.value.error == "slow_down"
        clock.now += 5
        with pytest.raises(OAuthError) as waiting:
            await signin.token(grant(code))
        assert waiting.value.error == "authorization_pending"
        clock.now += 600  # past expires_in
        with pytest.raises(OAuthError) as expired:
            await signin.token(grant(code))
        assert expired.value.error == "expired_token"
        assert await signin.pending(started["user_code"]) is None  # the page no longer takes it either

        denied = await signin.start("claude_code", "10.0.0.1")
        device = await signin.pending(denied["user_code"])
        assert device is not None
        await signin.deny(device)
        with pytest.raises(OAuthError) as refused:
            await signin.token(grant(denied["device_code"]))
        assert refused.value.error == "access_denied"

        code = await approve(store, signin, clock)
        clock.now += 0.1  # an approved code is answered at once, however soon after the last poll
        answer = await signin.token(grant(code))
        assert answer["token_type"] == "Bearer" and answer["email"] == "alice@example.com"
        with pytest.raises(OAuthError) as used:
            await signin.token(grant(code))
        assert used.value.error == "invalid_grant"

    asyncio.run(go())


def test_the_bearer_is_remembered_and_refused_once_expired_or_revoked(monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        settings, store, sessions, signin, clock = setup()
        answer = await signin.token(grant(await approve(store, signin, clock)))
        token = answer["access_token"]
        decodes: list[str] = []
        real = jwt.decode

        def counting(*args: Any, **kwargs: Any) -> Any:
            decodes.append(args[0])
            return real(*args, **kwargs)

        monkeypatch.setattr(jwt, "decode", counting)
        key = await sessions.principal(token, settings)
        assert (key.id, key.name, key.user, key.email) == (
            "sso:u-1",
            "sso:alice@example.com",
            "alice@example.com",
            "alice@example.com",
        )
        assert key.team == "payments" and key.groups == ("eng", "payments")  # the first configured team in its groups
        assert key.models == ("claude-sonnet-*",) and key.policy_models == ("sonnet", "claude-haiku-*")
        assert key.session.startswith("ses_")
        for _ in range(100):
            assert await sessions.principal(token, settings) is key
        assert len(decodes) == 1  # verified once, then remembered

        reloaded = parse_settings(
            YAML.replace("payments: {models", "payments: {limits: {requests_per_minute: 5}, models"), environ={}
        )
        again = await sessions.principal(token, reloaded)
        assert again is not key and again.team == "payments"  # rebuilt under the reloaded config

        clock.now += 3600
        with pytest.raises(AuthenticationError, match="expired"):
            await sessions.principal(token, settings)
        clock.now -= 3600  # back to the real time: PyJWT checks a new token's `iat` against it

        fresh = await signin.token({"grant_type": "refresh_token", "refresh_token": answer["refresh_token"]})
        assert (await sessions.principal(fresh["access_token"], settings)).session == key.session

        # another process's view of the same store learns of the revocation at its next poll
        async def opened() -> MemorySigninStore:
            return store

        other = Sessions(opened, clock=clock)
        await other.refresh()
        assert (await other.principal(fresh["access_token"], settings)).user == "alice@example.com"
        await signin.revoke_token(fresh["refresh_token"])
        with pytest.raises(AuthenticationError, match="revoked"):
            await sessions.principal(fresh["access_token"], settings)  # this process: at once
        await other.refresh()
        with pytest.raises(AuthenticationError, match="revoked"):
            await other.principal(fresh["access_token"], settings)

        with pytest.raises(AuthenticationError, match="invalid"):
            await sessions.principal(SESSION_PREFIX + "e30.x", settings)

    asyncio.run(go())


def test_a_forged_bearer_signed_with_another_secret_is_refused() -> None:
    async def go() -> None:
        settings, store, sessions, _, clock = setup()
        claims = {
            "iss": "https://gw.example.com",
            "aud": "https://gw.example.com",
            "sub": "mallory",
            "sid": "ses_x",
            "exp": int(clock.now) + 3600,
        }
        forged = jwt.encode(
            claims, b"not-the-store-secret-32-bytes-xx", algorithm="HS256", headers={"kid": "mgw-session"}
        )
        with pytest.raises(AuthenticationError):
            await sessions.principal(forged, settings)
        elsewhere = dict(claims, aud="https://other.example.com")
        wrong = jwt.encode(elsewhere, await store.secret(), algorithm="HS256", headers={"kid": "mgw-session"})
        with pytest.raises(AuthenticationError):
            await sessions.principal(wrong, settings)

    asyncio.run(go())


def test_the_first_matching_policy_wins() -> None:
    settings = parse_settings(YAML, environ={})
    found = policy_for(settings, ("eng",))
    assert found is not None and found[0] == 0
    everyone = policy_for(settings, ("sales",))
    assert everyone is not None and everyone[0] == 1  # a policy with no groups matches everyone
    assert sessions_module.POLL_S <= 1.0  # a revocation reaches every replica within 2 s

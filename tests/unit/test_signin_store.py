"""Sign-in's state (``gateway.governance.signin_store``) on each backend: the in-memory twin, SQLite and a real
PostgreSQL; every transition taken once, expired codes refused, refresh tokens single use, revocations raising the
version that replicas poll."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.governance.signin_store import Device, Session, SigninStore, UserInfo, signin_store
from gateway.governance.store import open_store

NOW = 1_764_547_200_000


def run(url: str, work: Callable[[SigninStore], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        store = open_store(url)
        await store.open()
        try:
            return await work(signin_store(store))
        finally:
            await store.aclose()

    return asyncio.run(go())


def device(sha: str = "d1", code: str = "BCDF-GHJK", **fields: Any) -> Device:
    base: dict[str, Any] = {
        "device_sha256": sha,
        "user_code": code,
        "surface": "claude_code",
        "client_ip": "127.0.0.1",
        "created_ms": NOW,
        "expires_ms": NOW + 600_000,
        "interval_s": 5,
    }
    return Device(**{**base, **fields})


ALICE = UserInfo(subject="u-1", email="alice@example.com", name="Alice", groups=["eng"], idp_refresh_token="idp-r1")


def session(sid: str = "ses_1", refresh: str = "r1", **fields: Any) -> Session:
    base: dict[str, Any] = {
        "id": sid,
        "subject": "u-1",
        "email": "alice@example.com",
        "name": "Alice",
        "groups": ["eng", "payments"],
        "surface": "claude_code",
        "created_ms": NOW,
        "refreshed_ms": NOW,
        "ends_ms": NOW + 86_400_000,
        "bearer_expires_ms": NOW + 3_600_000,
        "refresh_sha256": refresh,
        "idp_refresh_token": "idp-r1",
    }
    return Session(**{**base, **fields})


def test_a_device_code_goes_pending_verifying_approved_consumed_once(store_url: str) -> None:
    async def work(store: SigninStore) -> None:
        assert await store.add_device(device())
        assert not await store.add_device(device("d2"))  # the user code is taken: another is drawn
        assert (await store.device_by_user_code("BCDF-GHJK")) == device()
        assert await store.poll("d1", NOW + 5_000) == 0
        assert await store.poll("d1", NOW + 10_000) == NOW + 5_000
        assert await store.poll("nope", NOW) is None
        begun = await store.begin(
            "d1", state="s", nonce="n", code_verifier="v", browser_sha256="b", now_ms=NOW + 11_000
        )
        assert begun
        found = await store.device_by_state("s")
        assert found is not None and found.status == "verifying" and found.code_verifier == "v"
        assert await store.finish("d1", ALICE, NOW + 12_000)
        assert not await store.finish("d1", ALICE, NOW + 12_000)  # approved once
        approved = await store.device("d1")
        assert approved is not None and approved.status == "approved" and approved.user == ALICE
        assert approved.code_verifier is None and approved.state is None  # the flow's secrets are gone
        assert await store.consume("d1")
        assert not await store.consume("d1")  # one token per code, however many pollers race
        consumed = await store.device("d1")
        assert consumed is not None and consumed.status == "consumed" and consumed.user is None

    run(store_url, work)


def test_an_expired_or_denied_code_cannot_be_approved(store_url: str) -> None:
    async def work(store: SigninStore) -> None:
        await store.add_device(device())
        await store.add_device(device("d2", "CDFG-HJKL"))
        assert not await store.begin(
            "d1", state="s1", nonce="n", code_verifier="v", browser_sha256="b", now_ms=NOW + 600_000
        )
        assert await store.deny("d2", NOW)
        assert not await store.begin("d2", state="s2", nonce="n", code_verifier="v", browser_sha256="b", now_ms=NOW + 1)
        denied = await store.device("d2")
        assert denied is not None and denied.status == "denied"
        await store.prune(NOW + 600_000 + 3_600_001)
        assert await store.device("d1") is None

    run(store_url, work)


def test_sessions_rotate_their_refresh_token_once_and_revocation_raises_the_version(store_url: str) -> None:
    async def work(store: SigninStore) -> None:
        secret = await store.secret()
        assert len(secret) == 32 and await store.secret() == secret
        await store.add_session(session())
        await store.add_session(session("ses_2", "r2", subject="u-2", email="bob@example.com"))
        found = await store.session_by_refresh("r1")
        assert found is not None and found.groups == ["eng", "payments"] and found.idp_refresh_token == "idp-r1"
        rotate = {"idp_refresh_token": "idp-r2", "bearer_ms": NOW + 7_200_000, "now_ms": NOW + 3_000_000}
        assert await store.rotate("ses_1", "r1", "r1b", **rotate)
        assert not await store.rotate("ses_1", "r1", "r1c", **rotate)  # the old refresh token is spent
        assert await store.session_by_refresh("r1") is None
        rotated = await store.session("ses_1")
        assert rotated is not None and rotated.idp_refresh_token == "idp-r2"
        assert [s.id for s in await store.sessions(subject="u-2")] == ["ses_2"]
        before = await store.version()
        assert await store.revoke("ses_1", "signed_out", NOW + 3_100_000)
        assert not await store.revoke("ses_1", "signed_out", NOW + 3_100_000)
        assert await store.version() > before
        assert await store.revoked(NOW + 3_200_000) == ["ses_1"]
        revoked = await store.session("ses_1")
        assert revoked is not None and revoked.revoked_why == "signed_out" and revoked.idp_refresh_token is None
        assert not await store.rotate("ses_1", "r1b", "r1d", **rotate)  # a revoked session refreshes no more
        assert [s.id for s in await store.sessions()] == ["ses_2"]
        assert await store.revoked(NOW + 7_200_000 + 60_001) == []  # its last bearer has expired

    run(store_url, work)


def test_two_processes_share_the_secret_and_see_each_others_revocations(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"

    async def go() -> None:
        one, two = open_store(url), open_store(url)
        await one.open()
        await two.open()
        try:
            a, b = signin_store(one), signin_store(two)
            assert await a.secret() == await b.secret()
            await a.add_session(session())
            version = await b.version()
            assert await a.revoke("ses_1", "admin", NOW)
            assert await b.version() > version and await b.revoked(NOW) == ["ses_1"]
        finally:
            await one.aclose()
            await two.aclose()

    asyncio.run(go())

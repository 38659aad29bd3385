"""Where sign-in keeps its state, so that every replica serves every step (issue 34): the device codes (by their
SHA-256 digest; the code itself is only ever in the client's hands), the sessions (their refresh token by digest,
the identity provider's refresh token beside it), the HMAC secret the bearers are signed with, and a version that
every revocation raises in its own transaction, so a replica polls one integer to learn that a bearer it accepts
was revoked.

One narrow interface (``SigninStore``), two backends: ``SqlSigninStore`` over the ledger's SQLite or PostgreSQL
store (``SqlStore.sql``; the tables are schema version 5 of ``gateway.governance.store``) and ``MemorySigninStore``,
the twin for unit tests and for a ``memory://`` store. Each state change is one conditional statement (``UPDATE …
WHERE status = 'pending'``), so two replicas racing on one device code or one refresh token cannot both win.

A device code's life: ``pending`` (issued) → ``verifying`` (the browser posted its user code: the OIDC ``state``,
``nonce`` and PKCE verifier are kept with it) → ``approved`` (the IdP's callback: the user's identity is kept) or
``denied`` → ``consumed`` (the token endpoint gave its one token). Past ``expires_ms`` it is ``expired`` whatever
its state.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from gateway.governance.store import MemoryStore, SqlStep, SqlStore, Store

__all__ = [
    "Device",
    "MemorySigninStore",
    "Session",
    "SigninStore",
    "SqlSigninStore",
    "UserInfo",
    "signin_store",
]


class UserInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Who signed in, as the identity provider's id token says."""

    subject: str
    email: str = ""
    name: str = ""
    groups: list[str] = []
    idp_refresh_token: str | None = None  # kept server-side only; never in a log or an answer


class Device(msgspec.Struct, frozen=True, kw_only=True):
    device_sha256: str
    user_code: str
    surface: str
    client_ip: str
    created_ms: int
    expires_ms: int
    interval_s: int
    polled_ms: int = 0
    status: str = "pending"  # pending | verifying | approved | denied | consumed
    state: str | None = None
    nonce: str | None = None
    code_verifier: str | None = None
    browser_sha256: str | None = None
    user: UserInfo | None = None


class Session(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    subject: str
    email: str
    name: str
    groups: list[str]
    surface: str
    created_ms: int
    refreshed_ms: int
    ends_ms: int  # the session's end: /login again after it
    bearer_expires_ms: int  # the latest bearer minted for it expires then
    refresh_sha256: str
    idp_refresh_token: str | None = None
    revoked_ms: int | None = None
    revoked_why: str | None = None


class SigninStore(Protocol):
    async def secret(self) -> bytes:
        """The bearers' HMAC secret: made by the first replica that asks, the same for all after."""
        ...

    async def add_device(self, device: Device) -> bool:
        """False when the user code is taken (the caller draws another)."""
        ...

    async def device(self, device_sha256: str) -> Device | None: ...

    async def device_by_user_code(self, user_code: str) -> Device | None: ...

    async def device_by_state(self, state: str) -> Device | None: ...

    async def poll(self, device_sha256: str, now_ms: int) -> int | None:
        """Record a poll at ``now_ms``; the previous poll's time (None: no such device)."""
        ...

    async def begin(
        self, device_sha256: str, *, state: str, nonce: str, code_verifier: str, browser_sha256: str, now_ms: int
    ) -> bool:
        """pending (or verifying: the user pressed Continue again) → verifying, unexpired; False otherwise."""
        ...

    async def finish(self, device_sha256: str, user: UserInfo | None, now_ms: int) -> bool:
        """verifying → approved (``user``) or denied (None), unexpired; False otherwise."""
        ...

    async def deny(self, device_sha256: str, now_ms: int) -> bool:
        """pending or verifying → denied (the page's Deny)."""
        ...

    async def consume(self, device_sha256: str) -> bool:
        """approved → consumed: True once, for the one token the code gives."""
        ...

    async def prune(self, now_ms: int) -> None:
        """Forget device codes expired an hour ago and sessions ended a day ago."""
        ...

    async def add_session(self, session: Session) -> None: ...

    async def session(self, session_id: str) -> Session | None: ...

    async def session_by_refresh(self, refresh_sha256: str) -> Session | None: ...

    async def rotate(
        self,
        session_id: str,
        old_sha256: str,
        new_sha256: str,
        *,
        idp_refresh_token: str | None,
        bearer_ms: int,
        now_ms: int,
    ) -> bool:
        """The refresh token ``old`` → ``new`` (single use: False when it was used already or the session is
        revoked)."""
        ...

    async def revoke(self, session_id: str, why: str, now_ms: int) -> bool:
        """Revoke a session (its bearers and refresh token); raises the version. False when it was already."""
        ...

    async def version(self) -> int: ...

    async def revoked(self, now_ms: int) -> list[str]:
        """The ids of revoked sessions whose last bearer has not yet expired."""
        ...

    async def sessions(self, *, subject: str | None = None) -> list[Session]:
        """The live sessions (not revoked, not ended), newest first; one user's with ``subject``."""
        ...


_encode = msgspec.json.encode
_decode_user = msgspec.json.Decoder(UserInfo).decode
_decode_groups = msgspec.json.Decoder(list[str]).decode

_DEVICE_COLUMNS = (
    "device_sha256, user_code, surface, client_ip, created_ms, expires_ms, interval_s, polled_ms, status, state, "
    "nonce, code_verifier, browser_sha256, principal"
)
_SESSION_COLUMNS = (
    "id, subject, email, name, groups_json, surface, created_ms, refreshed_ms, ends_ms, bearer_expires_ms, "
    "refresh_sha256, idp_refresh_token, revoked_ms, revoked_why"
)
_BUMP = SqlStep("UPDATE login_version SET version = version + 1")


def _device(row: Sequence[Any]) -> Device:
    (sha, code, surface, ip, created, expires, interval, polled, status, state, nonce, verifier, browser, user) = row
    return Device(
        device_sha256=sha,
        user_code=code,
        surface=surface,
        client_ip=ip,
        created_ms=int(created),
        expires_ms=int(expires),
        interval_s=int(interval),
        polled_ms=int(polled),
        status=status,
        state=state,
        nonce=nonce,
        code_verifier=verifier,
        browser_sha256=browser,
        user=None if user is None else _decode_user(user),
    )


def _session(row: Sequence[Any]) -> Session:
    (sid, subject, email, name, groups, surface, created, refreshed, ends, bearer, refresh, idp, revoked, why) = row
    return Session(
        id=sid,
        subject=subject,
        email=email,
        name=name,
        groups=_decode_groups(groups),
        surface=surface,
        created_ms=int(created),
        refreshed_ms=int(refreshed),
        ends_ms=int(ends),
        bearer_expires_ms=int(bearer),
        refresh_sha256=refresh,
        idp_refresh_token=idp,
        revoked_ms=None if revoked is None else int(revoked),
        revoked_why=why,
    )


class SqlSigninStore:
    """Sign-in's state in the ledger's SQLite or PostgreSQL database."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store
        self._secret: bytes | None = None

    async def _one(self, statement: str, params: Sequence[Any] = (), *, read_only: bool = False) -> list[Any]:
        (result,) = await self._store.sql([SqlStep(statement, params, fetch=True)], read_only=read_only)
        return result.rows

    async def _change(self, statement: str, params: Sequence[Any]) -> bool:
        (result,) = await self._store.sql([SqlStep(statement, params)])
        return result.rowcount > 0

    async def secret(self) -> bytes:
        if self._secret is None:
            made = secrets.token_hex(32)
            _, rows = await self._store.sql(
                [
                    SqlStep("INSERT INTO login_secret (id, secret) VALUES (1, ?) ON CONFLICT DO NOTHING", (made,)),
                    SqlStep("SELECT secret FROM login_secret WHERE id = 1", fetch=True),
                ]
            )
            self._secret = bytes.fromhex(rows.rows[0][0])
        return self._secret

    async def add_device(self, device: Device) -> bool:
        user = None if device.user is None else _encode(device.user).decode()
        return await self._change(
            f"INSERT INTO login_devices ({_DEVICE_COLUMNS}) VALUES ({', '.join('?' * 14)}) ON CONFLICT DO NOTHING",
            (
                device.device_sha256,
                device.user_code,
                device.surface,
                device.client_ip,
                device.created_ms,
                device.expires_ms,
                device.interval_s,
                device.polled_ms,
                device.status,
                device.state,
                device.nonce,
                device.code_verifier,
                device.browser_sha256,
                user,
            ),
        )

    async def _device_where(self, column: str, value: str) -> Device | None:
        rows = await self._one(f"SELECT {_DEVICE_COLUMNS} FROM login_devices WHERE {column} = ?", (value,))
        return _device(rows[0]) if rows else None

    async def device(self, device_sha256: str) -> Device | None:
        return await self._device_where("device_sha256", device_sha256)

    async def device_by_user_code(self, user_code: str) -> Device | None:
        return await self._device_where("user_code", user_code)

    async def device_by_state(self, state: str) -> Device | None:
        return await self._device_where("state", state)

    async def poll(self, device_sha256: str, now_ms: int) -> int | None:
        before, _ = await self._store.sql(
            [
                SqlStep("SELECT polled_ms FROM login_devices WHERE device_sha256 = ?", (device_sha256,), fetch=True),
                SqlStep("UPDATE login_devices SET polled_ms = ? WHERE device_sha256 = ?", (now_ms, device_sha256)),
            ]
        )
        return int(before.rows[0][0]) if before.rows else None

    async def begin(
        self, device_sha256: str, *, state: str, nonce: str, code_verifier: str, browser_sha256: str, now_ms: int
    ) -> bool:
        return await self._change(
            "UPDATE login_devices SET status = 'verifying', state = ?, nonce = ?, code_verifier = ?, browser_sha256 = ?"
            " WHERE device_sha256 = ? AND status IN ('pending', 'verifying') AND expires_ms > ?",
            (state, nonce, code_verifier, browser_sha256, device_sha256, now_ms),
        )

    async def finish(self, device_sha256: str, user: UserInfo | None, now_ms: int) -> bool:
        status = "denied" if user is None else "approved"
        principal = None if user is None else _encode(user).decode()
        return await self._change(
            "UPDATE login_devices SET status = ?, principal = ?, state = NULL, code_verifier = NULL"
            " WHERE device_sha256 = ? AND status = 'verifying' AND expires_ms > ?",
            (status, principal, device_sha256, now_ms),
        )

    async def deny(self, device_sha256: str, now_ms: int) -> bool:
        return await self._change(
            "UPDATE login_devices SET status = 'denied', state = NULL, code_verifier = NULL"
            " WHERE device_sha256 = ? AND status IN ('pending', 'verifying') AND expires_ms > ?",
            (device_sha256, now_ms),
        )

    async def consume(self, device_sha256: str) -> bool:
        return await self._change(
            "UPDATE login_devices SET status = 'consumed', principal = NULL"
            " WHERE device_sha256 = ? AND status = 'approved'",
            (device_sha256,),
        )

    async def prune(self, now_ms: int) -> None:
        await self._store.sql(
            [
                SqlStep("DELETE FROM login_devices WHERE expires_ms < ?", (now_ms - 3_600_000,)),
                SqlStep("DELETE FROM login_sessions WHERE ends_ms < ?", (now_ms - 86_400_000,)),
            ]
        )

    async def add_session(self, session: Session) -> None:
        await self._store.sql(
            [
                SqlStep(
                    f"INSERT INTO login_sessions ({_SESSION_COLUMNS}) VALUES ({', '.join('?' * 14)})",
                    (
                        session.id,
                        session.subject,
                        session.email,
                        session.name,
                        _encode(session.groups).decode(),
                        session.surface,
                        session.created_ms,
                        session.refreshed_ms,
                        session.ends_ms,
                        session.bearer_expires_ms,
                        session.refresh_sha256,
                        session.idp_refresh_token,
                        session.revoked_ms,
                        session.revoked_why,
                    ),
                )
            ]
        )

    async def _session_where(self, column: str, value: str) -> Session | None:
        rows = await self._one(f"SELECT {_SESSION_COLUMNS} FROM login_sessions WHERE {column} = ?", (value,))
        return _session(rows[0]) if rows else None

    async def session(self, session_id: str) -> Session | None:
        return await self._session_where("id", session_id)

    async def session_by_refresh(self, refresh_sha256: str) -> Session | None:
        return await self._session_where("refresh_sha256", refresh_sha256)

    async def rotate(
        self,
        session_id: str,
        old_sha256: str,
        new_sha256: str,
        *,
        idp_refresh_token: str | None,
        bearer_ms: int,
        now_ms: int,
    ) -> bool:
        return await self._change(
            "UPDATE login_sessions SET refresh_sha256 = ?, idp_refresh_token = ?, bearer_expires_ms = ?,"
            " refreshed_ms = ? WHERE id = ? AND refresh_sha256 = ? AND revoked_ms IS NULL AND ends_ms > ?",
            (new_sha256, idp_refresh_token, bearer_ms, now_ms, session_id, old_sha256, now_ms),
        )

    async def revoke(self, session_id: str, why: str, now_ms: int) -> bool:
        results = await self._store.sql(
            [
                SqlStep(
                    "UPDATE login_sessions SET revoked_ms = ?, revoked_why = ?, idp_refresh_token = NULL"
                    " WHERE id = ? AND revoked_ms IS NULL",
                    (now_ms, why, session_id),
                ),
                _BUMP,
            ]
        )
        return results[0].rowcount > 0

    async def version(self) -> int:
        rows = await self._one("SELECT version FROM login_version", read_only=True)
        return int(rows[0][0])

    async def revoked(self, now_ms: int) -> list[str]:
        rows = await self._one(
            "SELECT id FROM login_sessions WHERE revoked_ms IS NOT NULL AND bearer_expires_ms > ?",
            (now_ms - 60_000,),
            read_only=True,
        )
        return [str(r[0]) for r in rows]

    async def sessions(self, *, subject: str | None = None) -> list[Session]:
        where = "revoked_ms IS NULL" + ("" if subject is None else " AND subject = ?")
        rows = await self._one(
            f"SELECT {_SESSION_COLUMNS} FROM login_sessions WHERE {where} ORDER BY created_ms DESC",
            () if subject is None else (subject,),
        )
        return [_session(r) for r in rows]


class MemorySigninStore:
    """The twin: the same transitions over dicts (one event loop, so each change is atomic)."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)
        self.devices: dict[str, Device] = {}
        self.by_id: dict[str, Session] = {}
        self._version = 0

    async def secret(self) -> bytes:
        return self._secret

    async def add_device(self, device: Device) -> bool:
        if device.device_sha256 in self.devices or any(d.user_code == device.user_code for d in self.devices.values()):
            return False
        self.devices[device.device_sha256] = device
        return True

    async def device(self, device_sha256: str) -> Device | None:
        return self.devices.get(device_sha256)

    async def device_by_user_code(self, user_code: str) -> Device | None:
        return next((d for d in self.devices.values() if d.user_code == user_code), None)

    async def device_by_state(self, state: str) -> Device | None:
        return next((d for d in self.devices.values() if d.state == state), None)

    async def poll(self, device_sha256: str, now_ms: int) -> int | None:
        device = self.devices.get(device_sha256)
        if device is None:
            return None
        self.devices[device_sha256] = msgspec.structs.replace(device, polled_ms=now_ms)
        return device.polled_ms

    def _move(self, sha: str, allowed: tuple[str, ...], now_ms: int | None, **changes: Any) -> bool:
        device = self.devices.get(sha)
        if device is None or device.status not in allowed or (now_ms is not None and device.expires_ms <= now_ms):
            return False
        self.devices[sha] = msgspec.structs.replace(device, **changes)
        return True

    async def begin(
        self, device_sha256: str, *, state: str, nonce: str, code_verifier: str, browser_sha256: str, now_ms: int
    ) -> bool:
        return self._move(
            device_sha256,
            ("pending", "verifying"),
            now_ms,
            status="verifying",
            state=state,
            nonce=nonce,
            code_verifier=code_verifier,
            browser_sha256=browser_sha256,
        )

    async def finish(self, device_sha256: str, user: UserInfo | None, now_ms: int) -> bool:
        status = "denied" if user is None else "approved"
        return self._move(
            device_sha256, ("verifying",), now_ms, status=status, user=user, state=None, code_verifier=None
        )

    async def deny(self, device_sha256: str, now_ms: int) -> bool:
        return self._move(
            device_sha256, ("pending", "verifying"), now_ms, status="denied", state=None, code_verifier=None
        )

    async def consume(self, device_sha256: str) -> bool:
        return self._move(device_sha256, ("approved",), None, status="consumed", user=None)

    async def prune(self, now_ms: int) -> None:
        for sha in [s for s, d in self.devices.items() if d.expires_ms < now_ms - 3_600_000]:
            del self.devices[sha]
        for sid in [s for s, x in self.by_id.items() if x.ends_ms < now_ms - 86_400_000]:
            del self.by_id[sid]

    async def add_session(self, session: Session) -> None:
        self.by_id[session.id] = session

    async def session(self, session_id: str) -> Session | None:
        return self.by_id.get(session_id)

    async def session_by_refresh(self, refresh_sha256: str) -> Session | None:
        return next((s for s in self.by_id.values() if s.refresh_sha256 == refresh_sha256), None)

    async def rotate(
        self,
        session_id: str,
        old_sha256: str,
        new_sha256: str,
        *,
        idp_refresh_token: str | None,
        bearer_ms: int,
        now_ms: int,
    ) -> bool:
        session = self.by_id.get(session_id)
        if (
            session is None
            or session.refresh_sha256 != old_sha256
            or session.revoked_ms is not None
            or session.ends_ms <= now_ms
        ):
            return False
        self.by_id[session_id] = msgspec.structs.replace(
            session,
            refresh_sha256=new_sha256,
            idp_refresh_token=idp_refresh_token,
            bearer_expires_ms=bearer_ms,
            refreshed_ms=now_ms,
        )
        return True

    async def revoke(self, session_id: str, why: str, now_ms: int) -> bool:
        session = self.by_id.get(session_id)
        self._version += 1
        if session is None or session.revoked_ms is not None:
            return False
        self.by_id[session_id] = msgspec.structs.replace(
            session, revoked_ms=now_ms, revoked_why=why, idp_refresh_token=None
        )
        return True

    async def version(self) -> int:
        return self._version

    async def revoked(self, now_ms: int) -> list[str]:
        return [s.id for s in self.by_id.values() if s.revoked_ms is not None and s.bearer_expires_ms > now_ms - 60_000]

    async def sessions(self, *, subject: str | None = None) -> list[Session]:
        live = [s for s in self.by_id.values() if s.revoked_ms is None and (subject is None or s.subject == subject)]
        return sorted(live, key=lambda s: s.created_ms, reverse=True)


def signin_store(store: Store) -> SigninStore:
    """Sign-in's state beside the ledger: in its database, or (a ``memory://`` store) in this process."""
    if isinstance(store, MemoryStore):
        return MemorySigninStore()
    sql: SqlStore = store  # type: ignore[assignment]  # SQLite and PostgreSQL both run SQL
    return SqlSigninStore(sql)

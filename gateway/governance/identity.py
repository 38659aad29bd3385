"""Who a request is: a key from the config, a key issued at run time, or the identity provider's token.

``Identity.authenticate`` is the one check every client route makes. A client sends its key as ``x-api-key`` or
``Authorization: Bearer``. With ``auth.jwt``, a candidate that is a JWT is verified as one
(``gateway.governance.jwt_auth``); any other is looked up by its SHA-256 digest, first among the config's keys (the
runtime's ``key_index``), then among the issued ones — the same lookup for both, whose cost depends on neither
the number of keys nor the key sent, then ``hmac.compare_digest`` on the entry found. A key past its expiry is
refused at once (not at the next poll).

Keys issued at run time (``POST /v1/gateway/keys``) live in the ledger's store, as their digest only: the
secret is shown once, when it is made. Every process reads them into memory (``IssuedKeys``) and polls the
store's ``keys_version`` every ``POLL_S`` seconds, reading the keys again when it moved; so a key revoked through
one replica is refused by every replica within ``POLL_S`` plus one query (the issuing process at once).

An issued key is known by its ``id`` (``apikey_`` and 26 characters: the time it was issued, then 80 random bits,
in Crockford's base32, so ids sort by issue time as the Admin API's ``apikey_01…`` ids look), given when it is
issued and never changed: its limits' scope (``key:<id>``), its ledger rows and the reports' ``api_key_id``. Its
``name`` is a label (``ClientKey.name``, shown in refusals), unique among the stored keys only: a name revoked
may be issued again, and the new key starts with none of the old one's counters or history. A config key's id is
its name (it has no other); so is the id of a key issued before schema version 4 (``gateway.governance.store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import msgspec

from gateway.governance.keys import ClientKey, digest_of, key_candidates, key_headers
from gateway.governance.store import IssuedKey, Store, StoreError
from gateway.settings import JwtSettings, LimitSettings, Settings, TeamSettings
from gateway.wire.errors import AuthenticationError, InvalidRequest, StoreUnavailable

if TYPE_CHECKING:
    from gateway.governance.jwt_auth import JwtVerifier
    from gateway.governance.sessions import Sessions

# the header every bearer of Claude Code's /login begins with (gateway.governance.sessions.SESSION_PREFIX, which
# tests/unit/test_signin.py holds equal): known here without importing PyJWT on a gateway that never signs anyone in
SESSION_PREFIX = "eyJhbGciOiJIUzI1NiIsImtpZCI6Im1ndy1zZXNzaW9uIiwidHlwIjoiSldUIn0."


def looks_like_jwt(token: str) -> bool:
    """A compact JWS: three base64url parts, the header a JSON object (``eyJ`` is ``{"``)."""
    return token.startswith("eyJ") and token.count(".") == 2


class Snapshot(Protocol):
    """What authentication reads of a runtime (``gateway.runtime.Runtime``)."""

    settings: Settings
    key_index: dict[bytes, ClientKey]


__all__ = ["ID_PREFIX", "KEY_PREFIX", "POLL_S", "SESSION_PREFIX", "Identity", "IssuedKeys", "KeyRequest", "new_key_id"]

log = logging.getLogger("gateway")

KEY_PREFIX = "sk-gw-"
ID_PREFIX = "apikey_"
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
POLL_S = 1.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")


class KeyRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The body of ``POST /v1/gateway/keys``."""

    name: str
    team: str | None = None
    user: str | None = None
    models: list[str] | None = None
    limits: LimitSettings | None = None
    expires_at: str | None = None  # RFC 3339


def new_key_id(now_ms: int) -> str:
    """``apikey_`` + the issue time (48 bits of milliseconds) and 80 random bits, as 26 Crockford base32 digits."""
    value = (now_ms & (1 << 48) - 1) << 80 | secrets.randbits(80)
    digits = [_CROCKFORD[value >> shift & 31] for shift in range(125, -1, -5)]
    return ID_PREFIX + "".join(digits)


def _epoch_ms(text: str) -> int:
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest("expires_at: an RFC 3339 time, e.g. 2027-01-31T00:00:00Z") from None
    if when.tzinfo is None:
        raise InvalidRequest("expires_at: give the time zone (Z for UTC)")
    try:
        return int(when.astimezone(UTC).timestamp() * 1000)
    except OverflowError:  # 9999-12-31T23:59:59-01:00 is in year 10000 in UTC, past what datetime holds
        raise InvalidRequest("expires_at: a time up to 9999-12-31T23:59:59Z") from None


def _client_key(record: IssuedKey, teams: Mapping[str, TeamSettings]) -> ClientKey:
    allowed = record.models
    if allowed is None and record.team in teams:
        allowed = teams[record.team].models  # the team's aliases, unless the key names its own
    limits = None if record.limits is None else msgspec.convert(record.limits, LimitSettings)
    return ClientKey(
        id=record.id,
        name=record.name,
        digest=bytes.fromhex(record.key_sha256),
        models=None if allowed is None else tuple(allowed),
        team=record.team,
        user=record.user,
        limits=limits,
        expires=None if record.expires_ms is None else record.expires_ms / 1000,
    )


class IssuedKeys:
    """The keys issued at run time, as this process knows them (``get``), and issuing and revoking them.
    ``store``: the opened store (the ledger's ``ready``)."""

    def __init__(
        self, store: Callable[[], Awaitable[Store]], *, poll_s: float = POLL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self._poll_s = poll_s
        self._clock = clock
        self.version = -1  # the store's keys_version these keys were read at
        self._records: list[IssuedKey] = []
        self._by_digest: dict[bytes, ClientKey] = {}
        self._teams: Mapping[str, TeamSettings] = {}
        self._logged_at = -1e18

    def get(self, digest: bytes) -> ClientKey | None:
        return self._by_digest.get(digest)

    def all(self) -> list[ClientKey]:
        """Every issued key this process knows (as last read from the store)."""
        return list(self._by_digest.values())

    def use_teams(self, teams: Mapping[str, TeamSettings]) -> None:
        """The config's teams (their models apply to their keys that name none): at start-up and on reload."""
        self._teams = teams
        self._build()

    def _build(self) -> None:
        by_digest: dict[bytes, ClientKey] = {}
        for record in self._records:
            try:
                by_digest[bytes.fromhex(record.key_sha256)] = _client_key(record, self._teams)
            except (ValueError, msgspec.ValidationError) as exc:  # a row this version cannot read: not a key
                log.error("issued key %s (%r) is unreadable and refused: %s", record.id, record.name, exc)
        self._by_digest = by_digest  # one assignment: a request sees the old set or the new one

    async def refresh(self) -> None:
        """Read the keys again if the store's version moved; ``StoreError`` when it cannot be reached."""
        store = await self._store()
        version = await store.keys_version()
        if version != self.version:
            self._records = await store.list_keys()
            self.version = version
            self._build()

    async def run(self) -> None:
        """Poll the store for changes (every ``poll_s``); an unreachable store keeps the keys last read."""
        while True:
            try:
                await self.refresh()
            except StoreError as exc:
                now = time.monotonic()
                if now - self._logged_at >= 60:
                    self._logged_at = now
                    log.warning("issued keys: the store cannot be read (%s); serving the keys last read", exc)
            await asyncio.sleep(self._poll_s)

    async def issue(self, request: KeyRequest, settings: Settings, taken: set[str]) -> tuple[str, IssuedKey]:
        """A new key for ``request``: its secret (shown once) and its stored record. ``taken``: the config keys'
        names (their ids), which no issued key may be named or known by."""
        if not _NAME.fullmatch(request.name):
            raise InvalidRequest("name: 1 to 128 letters, digits and . _ @ -, starting with a letter or digit")
        if request.name.startswith(ID_PREFIX):  # so a key's id and another key's name are never the same text
            raise InvalidRequest(f"name: {ID_PREFIX!r} starts the keys' ids, not their names")
        if request.name in taken:
            raise InvalidRequest(f"name: {request.name!r} is a key of the config file")
        if request.team and settings.teams and request.team not in settings.teams:
            raise InvalidRequest(f"team: {request.team!r} is not one of the config's teams")
        for name, value in (("team", request.team), ("user", request.user)):
            if value is not None and len(value) > 128:
                raise InvalidRequest(f"{name}: at most 128 characters")
        if (
            request.limits is not None
            and request.limits.budget is not None
            and not settings.pricing
            and not settings.builtin_pricing
        ):
            raise InvalidRequest(
                "limits.budget: this gateway has no prices to count a budget with (builtin_pricing: false)"
            )
        now_ms = int(self._clock() * 1000)
        expires_ms = None if request.expires_at is None else _epoch_ms(request.expires_at)
        if expires_ms is not None and expires_ms <= now_ms:
            raise InvalidRequest("expires_at: in the past")
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        limits = None if request.limits is None else msgspec.to_builtins(request.limits)
        key_id = new_key_id(now_ms)
        while key_id in taken:  # a config key named like an id: never in practice
            key_id = new_key_id(now_ms)
        record = IssuedKey(
            id=key_id,
            name=request.name,
            key_sha256=digest_of(secret).hex(),
            hint=f"{secret[:9]}…{secret[-4:]}",
            team=request.team or "",
            user=request.user or "",
            models=request.models,
            limits=limits,
            created_ms=now_ms,
            expires_ms=expires_ms,
        )
        store = await self._ready()
        try:
            added = await store.add_key(record)
        except StoreError as exc:
            raise StoreUnavailable(f"the key store cannot be written: {exc}") from exc
        if not added:
            raise InvalidRequest(f"name: a key named {request.name!r} exists; revoke it first")
        await self._refresh_now()
        return secret, record

    async def revoke(self, ref: str) -> IssuedKey | None:
        """Revoke the key whose id is ``ref``, or else the one named ``ref`` (a name is unique among the stored
        keys, and no name looks like an id); the key revoked, ``None`` when there is none."""
        records = await self.listed()
        record = next((r for r in records if r.id == ref), None) or next((r for r in records if r.name == ref), None)
        if record is None:
            return None
        store = await self._ready()
        try:
            deleted = await store.delete_key(record.id)
        except StoreError as exc:
            raise StoreUnavailable(f"the key store cannot be written: {exc}") from exc
        await self._refresh_now()
        return record if deleted else None

    async def listed(self) -> list[IssuedKey]:
        """Every issued key, read from the store (the truth, not this process's copy)."""
        store = await self._ready()
        try:
            return await store.list_keys()
        except StoreError as exc:
            raise StoreUnavailable(f"the key store cannot be read: {exc}") from exc

    async def _ready(self) -> Store:
        try:
            return await self._store()
        except StoreError as exc:
            raise StoreUnavailable(f"the key store cannot be opened: {exc}") from exc

    async def _refresh_now(self) -> None:
        with contextlib.suppress(StoreError):  # this process sees its own change at once; the others at their poll
            await self.refresh()


class Identity:
    """The process's authentication: the runtime's config keys, the issued keys (None: the store is off) and
    the JWT verifier of the running ``auth.jwt`` (rebuilt when a reload changes it)."""

    def __init__(self, issued: IssuedKeys | None, sessions: Sessions | None = None) -> None:
        self.issued = issued
        self.sessions = sessions  # the bearers of Claude Code's /login (None: the store is off)
        self._verifier: JwtVerifier | None = None

    def verifier(self, settings: JwtSettings) -> JwtVerifier:
        from gateway.governance.jwt_auth import (
            JwtVerifier,  # PyJWT and cryptography (~20 MB) only where auth.jwt is set
        )

        verifier = self._verifier
        if verifier is None or verifier.settings != settings:
            verifier = self._verifier = JwtVerifier(settings)
        return verifier

    async def authenticate(
        self, runtime: Snapshot, headers: Mapping[str, str]
    ) -> tuple[dict[str, str], ClientKey | None]:
        """The key headers the client sent and who it is (``None`` on an open gateway);
        ``AuthenticationError`` (401, ``x-should-retry: false``) when it is nobody."""
        settings = runtime.settings
        if settings.auth.open:
            return key_headers(headers), None
        sent, candidates = key_candidates(headers)
        sessions = self.sessions
        if sessions is not None and settings.login is not None:
            for candidate in candidates:
                if candidate.startswith(SESSION_PREFIX):
                    return sent, await sessions.principal(candidate, settings)
        jwt = settings.auth.jwt
        if jwt is not None:
            for candidate in candidates:
                if looks_like_jwt(candidate):
                    return sent, await self.verifier(jwt).principal(candidate, settings.teams)
        return sent, self._key(runtime, candidates)

    def _key(self, runtime: Snapshot, candidates: list[str]) -> ClientKey:
        matched: ClientKey | None = None
        issued = self.issued
        for digest in map(digest_of, candidates):
            key = runtime.key_index.get(digest)
            if key is None and issued is not None:
                key = issued.get(digest)
            if key is not None and hmac.compare_digest(key.digest, digest) and matched is None:
                matched = key
        if matched is None:
            raise AuthenticationError("invalid API key")
        if matched.expires is not None and time.time() >= matched.expires:
            raise AuthenticationError(f"API key {matched.name!r} has expired")
        return matched

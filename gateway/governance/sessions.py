"""This process's view of the sessions Claude Code's ``/login`` made (``gateway.governance.signin``): the check of a
bearer on every route, and the revocations learnt from the store.

A bearer verified once is remembered by its text (its claims, and the principal made of them under the running
config): after the first request a check is a dict look-up, an ``exp`` comparison and a set membership — the cost
of ``auth.jwt``'s cached tokens (``bench/``). The revoked sessions are a set that every process re-reads when the
store's sign-in version moves (polled every ``POLL_S``), so a session revoked through one replica (sign-out, the
admin API, the IdP refusing its refresh) is refused by every replica within ``POLL_S`` plus one query, and by the
revoking one at once. PyJWT is imported when the first bearer is seen, so a gateway without sign-in never loads it.

The principal: a ``ClientKey`` named ``sso:<email>`` (id ``sso:<subject>``: its limits' scope and its ledger
rows), whose user is the email (else the subject), whose team is the first team of the config (in its order) among
the IdP's groups (its models and limits apply), and whose ``policy_models`` are the matching managed policy's
``availableModels``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.governance.audit import audit
from gateway.governance.keys import ClientKey
from gateway.governance.signin_store import SigninStore
from gateway.governance.store import StoreError
from gateway.settings import ManagedPolicy, Settings, TeamSettings
from gateway.wire.errors import AuthenticationError

__all__ = ["POLL_S", "SESSION_PREFIX", "Sessions", "policy_for"]

log = logging.getLogger("gateway")

POLL_S = 1.0
KID = "mgw-session"
# PyJWT writes the header with sorted keys and no spaces, so every bearer this gateway mints starts so
SESSION_PREFIX = (
    base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": KID, "typ": "JWT"}, separators=(",", ":")).encode())
    .rstrip(b"=")
    .decode()
    + "."
)
_MAX_REMEMBERED = 10_000
_NO_KEY = hashlib.sha256(b"").digest()


class Revoker(Protocol):
    async def revoke(self, token: str) -> None: ...


def policy_for(settings: Settings, groups: tuple[str, ...] | list[str]) -> tuple[int, ManagedPolicy] | None:
    """The first managed policy whose ``match`` fits a user in ``groups`` (no groups in the match: everyone)."""
    for index, policy in enumerate(settings.managed.policies):
        wanted = policy.match.groups
        if not wanted or any(g in wanted for g in groups):
            return index, policy
    return None


def _team_of(groups: list[str], teams: Mapping[str, TeamSettings]) -> str:
    """The first team of the config (in its order: the operator's priority) that is among the user's groups."""
    return next((team for team in teams if team in groups), "")


@dataclass(slots=True)
class _Known:
    """A bearer verified once: its claims, and the principal made of them under one config."""

    exp: float
    sid: str
    claims: dict[str, Any]
    principal: ClientKey | None = None
    settings: Settings | None = None


class Sessions:
    """This process's view of the sessions: it checks bearers, and learns of revocations (``run``)."""

    def __init__(
        self,
        store: Callable[[], Awaitable[SigninStore]],
        *,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._poll_s = poll_s
        self._clock = clock
        self._secret: bytes | None = None
        self._known: dict[str, _Known] = {}
        self.revoked: set[str] = set()
        self._local: dict[str, float] = {}  # sessions this process revoked, and when (monotonic)
        self.version = -1
        self._logged_at = -1e18

    async def secret(self) -> bytes:
        if self._secret is None:
            store = await self._store()
            self._secret = await store.secret()
        return self._secret

    async def principal(self, token: str, settings: Settings) -> ClientKey:
        """Who a bearer of ours is; ``AuthenticationError`` (401, ``x-should-retry: false``) when it is invalid,
        expired or its session revoked."""
        login = settings.login
        known = self._known.get(token)
        if known is None:
            if login is None:
                raise AuthenticationError("sign-in is not configured on this gateway")
            try:
                secret = self._secret or await self.secret()
            except StoreError as exc:
                raise AuthenticationError(f"the sign-in store cannot be read ({exc}); try again shortly") from exc
            import jwt  # PyJWT only once a bearer of ours is seen

            try:
                claims = jwt.decode(
                    token,
                    secret,
                    algorithms=["HS256"],
                    audience=login.public_url,
                    issuer=login.public_url,
                    options={"require": ["exp", "sub", "sid"]},
                )
            except jwt.ExpiredSignatureError:
                audit("auth.denied", reason="expired_token")
                raise AuthenticationError("your sign-in has expired: run /login again") from None
            except jwt.PyJWTError:
                audit("auth.denied", reason="invalid_token")
                raise AuthenticationError("invalid sign-in token: run /login again") from None
            known = _Known(exp=float(claims["exp"]), sid=str(claims["sid"]), claims=claims)
            if len(self._known) >= _MAX_REMEMBERED:
                self._known.clear()
            self._known[token] = known
        if self._clock() >= known.exp:
            self._known.pop(token, None)
            audit("auth.denied", reason="expired_token", subject=known.claims.get("sub"))
            raise AuthenticationError("your sign-in has expired: run /login again")
        if known.sid in self.revoked:
            audit("auth.denied", reason="revoked_session", subject=known.claims.get("sub"), session=known.sid)
            raise AuthenticationError("your session was revoked: run /login again")
        principal = known.principal
        if principal is None or known.settings is not settings:
            principal = known.principal = _principal(known, settings)
            known.settings = settings
        return principal

    async def revoke(self, session_id: str, why: str, *, by: str | None, oidc: Revoker | None) -> bool:
        """Revoke a session everywhere (this process at once, the others at their next poll); its IdP refresh
        token is revoked at the IdP too, off this call."""
        store = await self._store()
        session = await store.session(session_id)
        now = int(self._clock() * 1000)
        revoked = await store.revoke(session_id, why, now)
        self.revoked.add(session_id)
        self._local[session_id] = time.monotonic()
        if revoked:
            audit("session.revoke", session=session_id, reason=why, by=by, subject=session and session.subject)
            if oidc is not None and session is not None and session.idp_refresh_token:
                task = asyncio.get_running_loop().create_task(oidc.revoke(session.idp_refresh_token))
                _background.add(task)
                task.add_done_callback(_background.discard)
        return revoked

    async def refresh(self) -> None:
        store = await self._store()
        version = await store.version()
        if version != self.version:
            revoked = await store.revoked(int(self._clock() * 1000))
            now = time.monotonic()
            for sid in [sid for sid, at in self._local.items() if now - at > 10 * self._poll_s]:
                del self._local[sid]
            self.revoked = set(revoked) | set(self._local)  # a read that began before this process revoked one
            self.version = version

    async def run(self) -> None:
        """Poll the store's sign-in version (every ``poll_s``); re-read the revoked sessions when it moved."""
        while True:
            try:
                await self.secret()
                await self.refresh()
            except StoreError as exc:
                now = time.monotonic()
                if now - self._logged_at >= 60:
                    self._logged_at = now
                    log.warning("sign-in: the store cannot be read (%s); revocations wait for it", exc)
            await asyncio.sleep(self._poll_s)


_background: set[asyncio.Task[Any]] = set()


def _principal(known: _Known, settings: Settings) -> ClientKey:
    claims = known.claims
    subject = str(claims["sub"])
    email = str(claims.get("email") or "")
    groups = [str(g) for g in claims.get("groups") or []]
    team = _team_of(groups, settings.teams)
    models = settings.teams[team].models if team else None
    found = policy_for(settings, groups)
    available = found[1].settings.get("availableModels") if found is not None else None
    user = email or subject
    return ClientKey(
        name=f"sso:{user}",
        id=f"sso:{subject}",
        digest=_NO_KEY,
        models=None if models is None else tuple(models),
        policy_models=tuple(str(m) for m in available) if isinstance(available, list) else None,
        team=team,
        user=user,
        expires=known.exp,
        session=known.sid,
        groups=tuple(groups),
        email=email,
    )

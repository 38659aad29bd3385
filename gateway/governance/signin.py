"""Claude Code's ``/login`` to this gateway (issue 34; the protocol: ``docs/single-sign-on.md``): the device
authorization grant (RFC 8628) in front of the organisation's OpenID Connect provider, and the bearers it mints.

The flow, each step on any replica (the state is in the store, ``gateway.governance.signin_store``):

1. ``start``: the CLI asks for a device code (``POST /oauth/device_authorization``): 256 random bits (only their
   SHA-256 is stored), a user code of 8 letters from RFC 8628's base-20 alphabet (``BCDF-GHJK``; 20^8 ≈ 2^34.6,
   guessed at most ``device_requests_per_minute`` times a minute per address), ``expires_in`` and ``interval``.
2. ``begin``: the user's browser posts the code from the verification page (``gateway/http/login.py``): a new
   ``state``, ``nonce`` and PKCE verifier are kept with the device code, bound to a cookie of that browser, and the
   browser goes to the IdP.
3. ``callback``: the IdP sends the browser back with a code; it is exchanged (``gateway.governance.oidc``), the id
   token checked, and the device code approved with the user's subject, email, name and groups.
4. ``token``: the CLI's poll gets, once, a session: a bearer (an HS256 JWT signed with the store's secret:
   ``iss``/``aud`` the public URL, ``sub``, ``email``, ``name``, ``groups``, ``sid``, ``exp`` after
   ``session.ttl_s``) and a refresh token (only its SHA-256 stored). Polling faster than ``interval`` is
   ``slow_down``; the RFC 8628 errors are answered as the RFC spells them.
5. ``refresh``: the refresh grant refreshes against the IdP first (a user the IdP no longer knows is refused:
   ``401 invalid_grant``, the session revoked), then rotates the refresh token and mints a new bearer.
6. ``revoke`` (RFC 7009, the CLI's sign-out) and the admin API revoke a session.

The bearer is checked on every route, as a key is, by ``gateway.governance.sessions``.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import jwt

from gateway.governance.audit import audit
from gateway.governance.oidc import IdpDown, IdpRefused, OidcClient, new_flow_secrets
from gateway.governance.sessions import KID, SESSION_PREFIX, Sessions
from gateway.governance.signin_store import Device, Session, SigninStore, UserInfo
from gateway.governance.store import StoreError
from gateway.settings import LoginSettings

__all__ = ["USER_CODE_ALPHABET", "OAuthError", "SignIn", "format_user_code"]

log = logging.getLogger("gateway")

USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"  # RFC 8628 §6.1: base 20, no vowels, no look-alikes


class OAuthError(Exception):
    """An OAuth error answer (RFC 6749 §5.2, RFC 8628 §3.5): ``{"error", "error_description"}`` with a status."""

    def __init__(self, status: int, error: str, description: str = "") -> None:
        super().__init__(description or error)
        self.status, self.error, self.description = status, error, description


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def format_user_code(raw: str) -> str | None:
    """What a person typed, as a stored user code (``bcdf ghjk`` → ``BCDF-GHJK``); None when it cannot be one."""
    letters = "".join(c for c in raw.upper() if c.isalpha())
    if len(letters) != 8 or any(c not in USER_CODE_ALPHABET for c in letters):
        return None
    return f"{letters[:4]}-{letters[4:]}"


class SignIn:
    """The device flow and the sessions it makes, for one ``login`` config (rebuilt when a reload changes it)."""

    def __init__(
        self,
        settings: LoginSettings,
        store: Callable[[], Awaitable[SigninStore]],
        sessions: Sessions,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._store = store
        self.sessions = sessions
        self._clock = clock
        self.oidc = OidcClient(settings.oidc, settings.public_url + "/oauth/callback")
        self._asked: dict[str, collections.deque[float]] = {}  # client address -> its recent device requests

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def store(self) -> SigninStore:
        try:
            return await self._store()
        except StoreError as exc:
            raise OAuthError(503, "temporarily_unavailable", f"the sign-in store cannot be opened: {exc}") from exc

    def _limited(self, address: str) -> bool:
        now = self._clock()
        asked = self._asked.setdefault(address, collections.deque())
        while asked and asked[0] <= now - 60:
            asked.popleft()
        if len(asked) >= self.settings.device_requests_per_minute:
            return True
        asked.append(now)
        if len(self._asked) > 10_000:  # many addresses: forget those with nothing recent
            for other in [a for a, q in self._asked.items() if not q or q[-1] <= now - 60]:
                del self._asked[other]
        return False

    async def start(self, surface: str, address: str) -> dict[str, Any]:
        """A new device code (``POST /oauth/device_authorization``)."""
        if self._limited(address):
            audit("device.authorize", outcome="rate_limited", ip=address, surface=surface)
            raise OAuthError(429, "slow_down", "too many sign-in requests from this address; wait a minute")
        store = await self.store()
        now = self._now_ms()
        s = self.settings
        device_code = secrets.token_urlsafe(32)
        for _ in range(5):
            user_code = format_user_code("".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(8)))
            assert user_code is not None
            device = Device(
                device_sha256=sha(device_code),
                user_code=user_code,
                surface=surface[:64],
                client_ip=address,
                created_ms=now,
                expires_ms=now + int(s.device_code_ttl_s * 1000),
                interval_s=s.poll_interval_s,
            )
            try:
                added = await store.add_device(device)
            except StoreError as exc:
                raise OAuthError(503, "temporarily_unavailable", f"the sign-in store: {exc}") from exc
            if added:
                break
        else:  # pragma: no cover - five collisions in 20^8
            raise OAuthError(503, "temporarily_unavailable", "no free user code; try again")
        audit("device.authorize", outcome="success", ip=address, surface=surface)
        answer: dict[str, Any] = {
            "device_code": device_code,
            "user_code": user_code,
            "verification_uri": f"{s.public_url}/device",
            "verification_uri_complete": f"{s.public_url}/device?user_code={user_code}",
            "expires_in": int(s.device_code_ttl_s),
            "interval": s.poll_interval_s,
        }
        if s.notice:
            answer["login_notice"] = s.notice
        return answer

    async def pending(self, user_code: str) -> Device | None:
        """The device code a verification page's user code names, while it may still be approved."""
        code = format_user_code(user_code)
        if code is None:
            return None
        store = await self.store()
        device = await store.device_by_user_code(code)
        if device is None or device.expires_ms <= self._now_ms() or device.status not in ("pending", "verifying"):
            return None
        return device

    async def begin(self, device: Device, browser: str) -> str:
        """Continue: the IdP's authorization URL for this device code, bound to the browser's cookie."""
        state, nonce, verifier = new_flow_secrets()
        try:
            url = await self.oidc.authorization_url(state=state, nonce=nonce, code_verifier=verifier)
        except IdpDown as exc:
            raise OAuthError(503, "temporarily_unavailable", str(exc)) from exc
        store = await self.store()
        begun = await store.begin(
            device.device_sha256,
            state=state,
            nonce=nonce,
            code_verifier=verifier,
            browser_sha256=sha(browser),
            now_ms=self._now_ms(),
        )
        if not begun:
            raise OAuthError(400, "expired_token", "this code has expired or was used; run /login again")
        audit("device.verify", outcome="redirect", surface=device.surface)
        return url

    async def deny(self, device: Device) -> None:
        store = await self.store()
        await store.deny(device.device_sha256, self._now_ms())
        audit("device.deny", surface=device.surface)

    async def callback(self, *, state: str, code: str | None, error: str | None, browser: str) -> UserInfo | None:
        """The IdP sent the browser back: the device code approved with the user (returned), or denied (None).
        ``OAuthError`` for a state this browser did not start, or an IdP that refused."""
        store = await self.store()
        device = await store.device_by_state(state) if state else None
        if device is None or device.status != "verifying" or device.browser_sha256 != sha(browser):
            audit("device.callback", outcome="unknown_state")
            raise OAuthError(400, "invalid_request", "this sign-in was not started in this browser, or has ended")
        now = self._now_ms()
        if error is not None or not code:
            await store.finish(device.device_sha256, None, now)
            audit("device.callback", outcome="idp_denied", idp_error=error)
            return None
        assert device.code_verifier is not None and device.nonce is not None
        try:
            user = await self.oidc.exchange(code, code_verifier=device.code_verifier, nonce=device.nonce)
        except IdpRefused as exc:
            await store.finish(device.device_sha256, None, now)
            audit("device.callback", outcome="idp_refused", reason=str(exc))
            raise OAuthError(400, "access_denied", str(exc)) from exc
        except IdpDown as exc:
            raise OAuthError(503, "temporarily_unavailable", str(exc)) from exc
        if not await store.finish(device.device_sha256, user, self._now_ms()):
            raise OAuthError(400, "expired_token", "this code has expired; run /login again")
        audit("device.callback", outcome="approved", subject=user.subject, email=user.email)
        return user

    async def token(self, form: Mapping[str, str]) -> dict[str, Any]:
        """``POST /oauth/token``: the device grant or the refresh grant."""
        grant = form.get("grant_type", "")
        if grant == "urn:ietf:params:oauth:grant-type:device_code":
            return await self._device_grant(form.get("device_code", ""))
        if grant == "refresh_token":
            return await self._refresh_grant(form.get("refresh_token", ""))
        if not grant:
            raise OAuthError(400, "invalid_request", "grant_type is required")
        raise OAuthError(400, "unsupported_grant_type", f"grant_type {grant[:80]!r} is not supported here")

    async def _device_grant(self, device_code: str) -> dict[str, Any]:
        if not device_code:
            raise OAuthError(400, "invalid_request", "device_code is required")
        store = await self.store()
        digest = sha(device_code)
        now = self._now_ms()
        previous = await store.poll(digest, now)
        device = await store.device(digest) if previous is not None else None
        if device is None:
            raise OAuthError(400, "invalid_grant", "unknown device code")
        if device.status == "consumed":
            raise OAuthError(400, "invalid_grant", "this device code was used already")
        if device.expires_ms <= now:
            raise OAuthError(400, "expired_token", "the device code has expired; run /login again")
        if device.status == "denied":
            raise OAuthError(400, "access_denied", "the sign-in was denied")
        if device.status == "approved" and device.user is not None:
            if not await store.consume(digest):
                raise OAuthError(400, "invalid_grant", "this device code was used already")
            return await self._mint(store, device.user, device.surface, now)
        if previous and now - previous < device.interval_s * 1000 - 500:  # half a second for the clocks' jitter
            raise OAuthError(400, "slow_down", f"poll at most every {device.interval_s} s")
        raise OAuthError(400, "authorization_pending", "the sign-in has not been completed in the browser yet")

    async def _mint(self, store: SigninStore, user: UserInfo, surface: str, now: int) -> dict[str, Any]:
        ttl_ms = int(self.settings.session.ttl_s * 1000)
        session_id = "ses_" + secrets.token_hex(16)
        refresh = "mgr_" + secrets.token_urlsafe(32)
        session = Session(
            id=session_id,
            subject=user.subject,
            email=user.email,
            name=user.name,
            groups=user.groups,
            surface=surface,
            created_ms=now,
            refreshed_ms=now,
            ends_ms=now + int(self.settings.session.max_age_s * 1000),
            bearer_expires_ms=now + ttl_ms,
            refresh_sha256=sha(refresh),
            idp_refresh_token=user.idp_refresh_token,
        )
        try:
            await store.add_session(session)
        except StoreError as exc:
            raise OAuthError(503, "temporarily_unavailable", f"the sign-in store: {exc}") from exc
        audit("session.mint", subject=user.subject, email=user.email, session=session_id, groups=user.groups)
        return await self._answer(store, session, refresh, now)

    async def _answer(self, store: SigninStore, session: Session, refresh: str, now: int) -> dict[str, Any]:
        ttl = int(self.settings.session.ttl_s)
        claims = {
            "iss": self.settings.public_url,
            "aud": self.settings.public_url,
            "sub": session.subject,
            "email": session.email,
            "name": session.name,
            "groups": session.groups,
            "sid": session.id,
            "iat": now // 1000,
            "exp": now // 1000 + ttl,
        }
        bearer = jwt.encode(claims, await store.secret(), algorithm="HS256", headers={"kid": KID})
        answer: dict[str, Any] = {
            "access_token": bearer,
            "token_type": "Bearer",
            "expires_in": ttl,
            "refresh_token": refresh,
        }
        if session.email:
            answer["email"] = session.email
        return answer

    async def _refresh_grant(self, refresh: str) -> dict[str, Any]:
        if not refresh:
            raise OAuthError(400, "invalid_request", "refresh_token is required")
        store = await self.store()
        session = await store.session_by_refresh(sha(refresh))
        now = self._now_ms()
        if session is None or session.revoked_ms is not None or session.ends_ms <= now:
            audit("session.refresh", outcome="fail", reason="unknown, revoked or ended session")
            raise OAuthError(401, "invalid_grant", "this session has ended; run /login again")
        user = UserInfo(
            subject=session.subject,
            email=session.email,
            name=session.name,
            groups=session.groups,
            idp_refresh_token=session.idp_refresh_token,
        )
        if session.idp_refresh_token:
            try:
                user = await self.oidc.refresh(session.idp_refresh_token, user)
            except IdpRefused as exc:
                await self.sessions.revoke(session.id, "idp_refused", by=None, oidc=None)
                audit("session.refresh", outcome="fail", subject=session.subject, reason=str(exc))
                raise OAuthError(401, "invalid_grant", "your identity provider ended this session; run /login") from exc
            except IdpDown as exc:
                raise OAuthError(503, "temporarily_unavailable", str(exc)) from exc
        new_refresh = "mgr_" + secrets.token_urlsafe(32)
        ttl_ms = int(self.settings.session.ttl_s * 1000)
        rotated = await store.rotate(
            session.id,
            session.refresh_sha256,
            sha(new_refresh),
            idp_refresh_token=user.idp_refresh_token,
            bearer_ms=now + ttl_ms,
            now_ms=now,
        )
        if not rotated:
            audit("session.refresh", outcome="fail", subject=session.subject, reason="refresh token reused")
            raise OAuthError(401, "invalid_grant", "this refresh token was used already; run /login again")
        audit("session.refresh", outcome="success", subject=session.subject, session=session.id)
        fresh = Session(
            id=session.id,
            subject=user.subject,
            email=user.email or session.email,
            name=user.name,
            groups=user.groups,
            surface=session.surface,
            created_ms=session.created_ms,
            refreshed_ms=now,
            ends_ms=session.ends_ms,
            bearer_expires_ms=now + ttl_ms,
            refresh_sha256=sha(new_refresh),
        )
        return await self._answer(store, fresh, new_refresh, now)

    async def revoke_token(self, token: str) -> None:
        """RFC 7009: the session a refresh token or a bearer of ours belongs to is revoked; anything else is
        ignored (the endpoint answers 200 either way)."""
        store = await self.store()
        session_id: str | None = None
        if token.startswith("mgr_"):
            session = await store.session_by_refresh(sha(token))
            session_id = session.id if session is not None else None
        elif token.startswith(SESSION_PREFIX):
            with contextlib.suppress(jwt.PyJWTError):
                claims = jwt.decode(
                    token,
                    await store.secret(),
                    algorithms=["HS256"],
                    audience=self.settings.public_url,
                    options={"verify_exp": False},
                )
                session_id = str(claims.get("sid", "")) or None
        if session_id is not None:
            await self.sessions.revoke(session_id, "signed_out", by=None, oidc=self.oidc)

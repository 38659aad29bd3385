"""The organisation's OpenID Connect provider, as sign-in's relying party (issue 34).

Authlib's ``AsyncOAuth2Client`` (over httpx) does the OAuth 2.0 half: the authorization URL with PKCE (S256),
``state`` and ``nonce``, the code exchange, the refresh grant, and RFC 7009 revocation; the client authenticates
with ``client_secret_basic`` (``client_secret_post`` when the discovery document offers only that; none for a
public client). The id token is verified with PyJWT (as ``auth.jwt``'s tokens are): signature against the
issuer's JWKS (refetched for a ``kid`` it does not hold, at most once every ``REFETCH_S``), ``iss``, ``aud``,
``exp``, ``iat``, and the ``nonce`` of the flow that asked for it.

Why Authlib: it covers the client side whole (PKCE, discovery-driven endpoints, refresh, revocation, both client
authentication methods) in one well-kept package whose only dependencies are ``cryptography`` (already here for
PyJWT) and ``joserfc``; ``httpx-oauth`` has no revocation and no PKCE helper, ``oauthlib`` is synchronous. None of
it is on the request path: a sign-in or a refresh (once an hour per user) costs one or two IdP round trips, and
the bearers the gateway mints are checked without it (``gateway.governance.signin``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import httpx
import jwt
from authlib.common.security import generate_token
from authlib.integrations.httpx_client import AsyncOAuth2Client, OAuthError

from gateway.governance.signin_store import UserInfo
from gateway.settings import OidcSettings

__all__ = ["IdpDown", "IdpRefused", "OidcClient", "new_flow_secrets"]

log = logging.getLogger("gateway")

REFETCH_S = 10.0
_METADATA_S = 3600.0
_TIMEOUT_S = 10.0


class IdpRefused(Exception):
    """The identity provider refused (a code, a refresh token: ``invalid_grant``), or its token failed checks."""


class IdpDown(Exception):
    """The identity provider could not be reached, or answered what is not OAuth."""


def new_flow_secrets() -> tuple[str, str, str]:
    """``state``, ``nonce`` and a PKCE ``code_verifier`` (RFC 7636: 43-128 characters), each of 256 bits or more."""
    return generate_token(43), generate_token(43), generate_token(64)


class OidcClient:
    """One identity provider: its discovery document (held an hour), its signing keys, and the calls."""

    def __init__(self, settings: OidcSettings, redirect_uri: str) -> None:
        self.settings = settings
        self.redirect_uri = redirect_uri
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = 0.0
        self._keys: dict[str, jwt.PyJWK] = {}
        self._keys_at = -1e18
        self._lock = asyncio.Lock()

    def _client(self, metadata: dict[str, Any]) -> AsyncOAuth2Client:
        s = self.settings
        methods = metadata.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        if s.client_secret is None:
            method = "none"
        elif "client_secret_basic" in methods:
            method = "client_secret_basic"
        else:
            method = "client_secret_post"
        return AsyncOAuth2Client(
            client_id=s.client_id,
            client_secret=s.client_secret,
            token_endpoint_auth_method=method,
            revocation_endpoint_auth_method=method,
            scope=" ".join(s.scopes),
            redirect_uri=self.redirect_uri,
            code_challenge_method="S256",
            timeout=_TIMEOUT_S,
        )

    async def metadata(self) -> dict[str, Any]:
        """The issuer's OpenID discovery document (``IdpDown`` when it cannot be read, or names another issuer)."""
        if self._metadata is not None and time.monotonic() - self._metadata_at < _METADATA_S:
            return self._metadata
        url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            async with httpx.AsyncClient(timeout=_TIMEOUT_S) as http:
                answer = await http.get(url)
            answer.raise_for_status()
            document = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise IdpDown(f"the identity provider's discovery document ({url}) cannot be read: {exc}") from exc
        if not isinstance(document, dict) or document.get("issuer", "").rstrip("/") != self.settings.issuer.rstrip("/"):
            raise IdpDown(f"{url} names another issuer than login.oidc.issuer")
        for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(document.get(field), str):
                raise IdpDown(f"{url} has no {field}")
        self._metadata, self._metadata_at = document, time.monotonic()
        return document

    async def authorization_url(self, *, state: str, nonce: str, code_verifier: str) -> str:
        metadata = await self.metadata()
        client = self._client(metadata)
        try:
            url, _ = client.create_authorization_url(
                metadata["authorization_endpoint"], state=state, code_verifier=code_verifier, nonce=nonce
            )
        finally:
            await client.aclose()
        return str(url)

    async def exchange(self, code: str, *, code_verifier: str, nonce: str) -> UserInfo:
        """The authorization code for the user's identity (its id token checked) and refresh token."""
        metadata = await self.metadata()
        token = await self._token(
            metadata, "authorization_code", code=code, code_verifier=code_verifier, redirect_uri=self.redirect_uri
        )
        id_token = token.get("id_token")
        if not isinstance(id_token, str):
            raise IdpRefused("the identity provider answered without an id_token (is `openid` among the scopes?)")
        claims = await self._verify(id_token, metadata, nonce=nonce)
        return self._user(claims, token.get("refresh_token"))

    async def refresh(self, refresh_token: str, previous: UserInfo) -> UserInfo:
        """A refresh against the IdP: the user as it now stands (groups from a new id token when it sends one);
        ``IdpRefused`` when it refuses (the user deprovisioned, the grant revoked)."""
        metadata = await self.metadata()
        token = await self._token(metadata, "refresh_token", refresh_token=refresh_token)
        rotated = token.get("refresh_token") or refresh_token
        id_token = token.get("id_token")
        if isinstance(id_token, str):
            claims = await self._verify(id_token, metadata, nonce=None)
            if str(claims.get("sub")) != previous.subject:
                raise IdpRefused("the refreshed id token names another subject")
            return self._user(claims, rotated)
        return UserInfo(
            subject=previous.subject,
            email=previous.email,
            name=previous.name,
            groups=previous.groups,
            idp_refresh_token=rotated,
        )

    async def revoke(self, token: str) -> None:
        """RFC 7009 at the IdP, when it has a revocation endpoint; best effort (logged, never raised)."""
        try:
            metadata = await self.metadata()
            endpoint = metadata.get("revocation_endpoint")
            if not isinstance(endpoint, str):
                return
            client = self._client(metadata)
            try:
                await client.revoke_token(endpoint, token=token, token_type_hint="refresh_token")  # type: ignore[no-untyped-call]
            finally:
                await client.aclose()
        except Exception as exc:  # sign-out goes on whatever the IdP says
            log.info("sign-out: the identity provider's revocation failed: %s", exc)

    async def _token(self, metadata: dict[str, Any], grant: str, **params: Any) -> dict[str, Any]:
        client = self._client(metadata)
        try:
            if grant == "refresh_token":
                token = await client.refresh_token(metadata["token_endpoint"], refresh_token=params["refresh_token"])
            else:
                token = await client.fetch_token(metadata["token_endpoint"], grant_type=grant, **params)
        except OAuthError as exc:
            raise IdpRefused(f"the identity provider refused the {grant} grant: {exc.error}") from exc
        except httpx.HTTPError as exc:
            raise IdpDown(f"the identity provider's token endpoint cannot be reached: {exc}") from exc
        except ValueError as exc:  # not JSON
            raise IdpDown(f"the identity provider's token endpoint answered what is not OAuth: {exc}") from exc
        finally:
            await client.aclose()
        return dict(token)

    async def _signing_key(self, metadata: dict[str, Any], kid: str) -> jwt.PyJWK:
        async with self._lock:
            key = self._keys.get(kid)
            if key is None and time.monotonic() - self._keys_at >= REFETCH_S:
                try:
                    async with httpx.AsyncClient(timeout=_TIMEOUT_S) as http:
                        answer = await http.get(metadata["jwks_uri"])
                    answer.raise_for_status()
                    keys = jwt.PyJWKSet.from_dict(answer.json()).keys
                except (httpx.HTTPError, ValueError, jwt.PyJWTError) as exc:
                    raise IdpDown(f"the identity provider's signing keys cannot be read: {exc}") from exc
                self._keys = {k.key_id or "": k for k in keys}
                self._keys_at = time.monotonic()
                key = self._keys.get(kid)
                if key is None and not kid and len(self._keys) == 1:
                    key = next(iter(self._keys.values()))
            if key is None:
                raise IdpRefused(f"the id token's signing key {kid!r} is not in the identity provider's JWKS")
            return key

    async def _verify(self, id_token: str, metadata: dict[str, Any], *, nonce: str | None) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError as exc:
            raise IdpRefused(f"the id token is not a JWT: {exc}") from exc
        alg = str(header.get("alg", ""))
        if alg in ("", "none") or alg.startswith("HS"):  # an HMAC id token would be keyed by our client secret
            raise IdpRefused(f"the id token's algorithm {alg!r} is not accepted")
        key = await self._signing_key(metadata, str(header.get("kid", "")))
        try:
            claims: dict[str, Any] = jwt.decode(
                id_token,
                key=key,
                algorithms=[alg],
                audience=self.settings.client_id,
                issuer=metadata["issuer"],
                leeway=60,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise IdpRefused(f"the id token failed its checks: {exc}") from exc
        if nonce is not None and claims.get("nonce") != nonce:
            raise IdpRefused("the id token's nonce is not the one this sign-in sent")
        return claims

    def _user(self, claims: dict[str, Any], refresh_token: Any) -> UserInfo:
        groups = claims.get(self.settings.groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        email = claims.get(self.settings.email_claim) or ""
        return UserInfo(
            subject=str(claims["sub"]),
            email=str(email),
            name=str(claims.get("name") or claims.get("preferred_username") or email or claims["sub"]),
            groups=[str(g) for g in groups if isinstance(g, str | int)],
            idp_refresh_token=refresh_token if isinstance(refresh_token, str) else None,
        )


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()

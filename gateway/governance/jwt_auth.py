"""Bearer JWTs from the organisation's identity provider (``auth.jwt``), checked with PyJWT.

The signing keys come from the issuer's JWKS (``jwks_url``, else the ``jwks_uri`` its OpenID discovery document
names), fetched with ``PyJWKClient`` in a worker thread (its fetch blocks) and held here: a token whose ``kid``
is not held fetches the set again (at most once every ``REFETCH_S`` seconds, so random ``kid``s cannot make the
gateway hammer the issuer), which is how a rotated key is picked up; the whole set is refreshed every
``jwks_cache_s``. The algorithm must be one of ``algorithms`` (asymmetric only: ``none`` and HS256-with-the-
public-key never verify) and match the key's; ``exp``, ``iss`` and ``aud`` are required, ``nbf`` is checked
when present, with ``leeway_s`` of clock skew. A verified token is remembered until it expires (verifying a
signature costs tens of microseconds; a client sends the same token for its whole life).

The claims give the principal: ``user_claim`` its user, ``team_claim`` its team (a string, or the first of a
list that names a configured team); it is a ``ClientKey`` named ``jwt:<user>`` with its team's models, so
limits (per user: the defaults; per team: the team's) and the ledger treat it like any key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

import jwt

from gateway.governance.keys import ClientKey
from gateway.settings import JwtSettings, TeamSettings
from gateway.wire.errors import AuthenticationError, GatewayError

__all__ = ["REFETCH_S", "JwtVerifier"]

log = logging.getLogger("gateway")

REFETCH_S = 10.0  # the least time between two fetches for an unknown kid
_MAX_REMEMBERED = 10_000
_FETCH_TIMEOUT_S = 5.0


class IdentityProviderDown(GatewayError):
    """No signing key is known and the issuer's JWKS cannot be fetched: not the client's fault."""

    status_code = 503
    error_type = "api_error"


_FAMILY = {"RSA": ("RS", "PS"), "EC": ("ES",), "OKP": ("EdDSA",)}  # never "oct": an HMAC secret is not published


def _compatible(key: jwt.PyJWK, alg: str) -> bool:
    """The token's ``alg`` is the key's own ``alg`` when the JWK names one, else of the key type's family."""
    named = key._jwk_data.get("alg") if isinstance(key._jwk_data, dict) else None
    if named:
        return bool(named == alg)
    return alg.startswith(_FAMILY.get(key.key_type or "", ()))


def _refused(reason: str) -> AuthenticationError:
    return AuthenticationError(f"invalid bearer token: {reason}")


class JwtVerifier:
    def __init__(self, settings: JwtSettings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._keys: dict[str, jwt.PyJWK] = {}  # kid -> key ("" for a key without a kid)
        self._fetched_at = -1e18  # monotonic
        self._tried_at = -1e18
        self._jwks_url = settings.jwks_url
        self._lock = asyncio.Lock()
        self._remembered: dict[str, tuple[ClientKey, float]] = {}  # token -> (principal, its exp)
        self.fetches = 0

    async def principal(self, token: str, teams: Mapping[str, TeamSettings]) -> ClientKey:
        """The principal ``token`` stands for; ``AuthenticationError`` (401) when it does not verify."""
        known = self._remembered.get(token)
        if known is not None and self._clock() < known[1]:
            return known[0]
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise _refused("not a JWT") from None
        alg = header.get("alg")
        if alg not in self.settings.algorithms:
            raise _refused(f"its algorithm is not one of {', '.join(self.settings.algorithms)}")
        kid = header.get("kid")
        key = await self._key(kid if isinstance(kid, str) else "")
        if not _compatible(key, alg):
            raise _refused("its algorithm does not match its key's")
        claims = self._decode(token, key, alg)
        principal = self._principal(claims, teams)
        if len(self._remembered) >= _MAX_REMEMBERED:
            self._remembered.clear()
        self._remembered[token] = (principal, float(claims["exp"]))
        return principal

    def _decode(self, token: str, key: jwt.PyJWK, alg: str) -> dict[str, Any]:
        s = self.settings
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key.key,
                algorithms=[alg],
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise _refused("it has expired") from None
        except jwt.ImmatureSignatureError:
            raise _refused("it is not valid yet (nbf)") from None
        except jwt.InvalidAudienceError:
            raise _refused("it is not for this audience") from None
        except jwt.InvalidIssuerError:
            raise _refused("it is not from the configured issuer") from None
        except jwt.MissingRequiredClaimError as exc:
            raise _refused(f"it has no {exc.claim!r} claim") from None
        except jwt.InvalidTokenError:
            raise _refused("its signature does not verify") from None
        return claims

    def _principal(self, claims: Mapping[str, Any], teams: Mapping[str, TeamSettings]) -> ClientKey:
        s = self.settings
        user = claims.get(s.user_claim)
        if not isinstance(user, str) or not user or len(user) > 128:
            raise _refused(f"its {s.user_claim!r} claim is not a name")
        team = ""
        if s.team_claim is not None:
            value = claims.get(s.team_claim)
            if isinstance(value, str):
                team = value
            elif isinstance(value, list):
                names = [v for v in value if isinstance(v, str)]
                team = next((v for v in names if v in teams), names[0] if names else "")
        team = team[:128]
        models = teams[team].models if team in teams else None
        return ClientKey(name=f"jwt:{user}", team=team, user=user, models=None if models is None else tuple(models))

    def _fresh(self) -> bool:
        return time.monotonic() - self._fetched_at < self.settings.jwks_cache_s

    async def _key(self, kid: str) -> jwt.PyJWK:
        key = self._keys.get(kid)
        if key is not None and self._fresh():
            return key
        async with self._lock:  # one fetch at a time; the requests waiting on it then find its keys
            stale, unknown = not self._fresh(), kid not in self._keys
            if (stale or unknown) and time.monotonic() - self._tried_at >= REFETCH_S:
                await self._refresh()
        key = self._keys.get(kid)
        if key is None and not kid and len(self._keys) == 1:  # a token without a kid, a set of one key
            key = next(iter(self._keys.values()))
        if key is None:
            if not self._keys:
                raise IdentityProviderDown("the identity provider's signing keys cannot be fetched")
            raise _refused("it is signed with a key the issuer does not publish (kid)")
        return key

    async def _refresh(self) -> None:
        self._tried_at = time.monotonic()
        try:
            keys = await asyncio.to_thread(self._fetch)
        except Exception as exc:  # the issuer unreachable, or a broken document: keep what is known
            log.warning("auth.jwt: fetching the issuer's keys failed: %s", exc)
            return
        self._keys = keys
        self._fetched_at = time.monotonic()

    def _fetch(self) -> dict[str, jwt.PyJWK]:
        """The issuer's signing keys (blocking: run in a worker thread)."""
        self.fetches += 1
        if self._jwks_url is None:
            discovery = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
            with urllib.request.urlopen(discovery, timeout=_FETCH_TIMEOUT_S) as response:
                document = json.loads(response.read(1 << 20))
            uri = document.get("jwks_uri") if isinstance(document, dict) else None
            if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
                raise ValueError("the discovery document has no http(s) jwks_uri")
            self._jwks_url = uri
        client = jwt.PyJWKClient(self._jwks_url, cache_jwk_set=False, timeout=_FETCH_TIMEOUT_S)
        keys: dict[str, jwt.PyJWK] = {}
        for key in client.get_jwk_set().keys:
            if key.public_key_use in (None, "sig"):
                keys.setdefault(key.key_id or "", key)
        return keys

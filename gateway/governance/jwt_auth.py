"""Bearer JWTs from the organisation's identity provider (``auth.jwt``), checked with PyJWT.

The signing keys come from the issuer's JWKS (``jwks_url``, else the ``jwks_uri`` its OpenID discovery document
names), fetched with ``PyJWKClient`` in a worker thread (its fetch blocks) and held here: a token whose ``kid``
is not held fetches the set again (at most once every ``REFETCH_S`` seconds, so random ``kid``s cannot make the
gateway hammer the issuer), which is how a rotated key is picked up; the whole set is refreshed every
``jwks_cache_s``. The algorithm must be one of ``algorithms`` (asymmetric only: ``none`` and HS256-with-the-
public-key never verify) and match the key's; ``exp``, ``iss`` and ``aud`` are required, ``nbf`` is checked
when present, with ``leeway_s`` of clock skew.

A verified token's *claims* are remembered (verifying a signature costs tens of microseconds; a client sends the
same token for its whole life), by the token's text, beside the ``kid`` its header names and the key it verified
with, until ``min(exp, verified + jwks_cache_s)``: past that the token is verified again against the keys held
then. Every successful JWKS fetch forgets the tokens whose key the new set no longer holds (a withdrawn ``kid``,
or one whose key material changed), so a retired signing key is refused for old tokens as for new ones.

The principal is derived from the remembered claims against the teams of the running config, so a reload
applies to tokens already seen; the derivation (~4 us) is kept beside the claims and reused while the running
teams are the very mapping it was made under (a reload's settings are new objects). ``user_claim`` gives its
user, ``team_claim`` its team (a string, or the first of a list that names a configured team); it is a
``ClientKey`` named ``jwt:<user>`` with its team's models, so limits (per user: the defaults; per team: the
team's, looked up per request) and the ledger treat it like any key. With ``team_claim`` set, a token that names
no configured team is refused (403 ``permission_error``) under ``unknown_team: deny``, the default; ``allow``
lets it use every model, attributed to the first name it gives.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt

from gateway.governance.keys import ClientKey
from gateway.settings import JwtSettings, TeamSettings
from gateway.wire.errors import AuthenticationError, GatewayError, PermissionDenied

__all__ = ["REFETCH_S", "JwtVerifier"]

log = logging.getLogger("gateway")

REFETCH_S = 10.0  # the least time between two fetches for an unknown kid
_MAX_REMEMBERED = 10_000
_FETCH_TIMEOUT_S = 5.0
_NO_KEY = hashlib.sha256(b"").digest()  # a JWT principal's digest: what ClientKey would hash for it each time


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


def _lookup(keys: Mapping[str, jwt.PyJWK], kid: str) -> jwt.PyJWK | None:
    """The key a token naming ``kid`` ("" for none) verifies with: its own, or the only one of a set of one."""
    key = keys.get(kid)
    if key is None and not kid and len(keys) == 1:
        key = next(iter(keys.values()))
    return key


def _same(a: jwt.PyJWK, b: jwt.PyJWK) -> bool:
    return a is b or bool(a._jwk_data == b._jwk_data)


def _refused(reason: str) -> AuthenticationError:
    return AuthenticationError(f"invalid bearer token: {reason}")


@dataclass(slots=True)
class _Verified:
    """A token that verified: the ``kid`` its header names, the key it verified with, its claims, and until when
    (wall clock) they may be used without verifying it again. ``derived``: the principal last derived from the
    claims, and the teams mapping it was derived under (a reload's settings are new objects, so a principal is
    reused only under the very teams it came from)."""

    kid: str
    key: jwt.PyJWK
    claims: Mapping[str, Any]
    until: float
    derived: tuple[Mapping[str, TeamSettings], ClientKey] | None = None


class JwtVerifier:
    """``clock``: wall time (``exp``, and how long a verified token is remembered); ``monotonic``: the JWKS
    fetch timers."""

    def __init__(
        self,
        settings: JwtSettings,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._monotonic = monotonic
        self._keys: dict[str, jwt.PyJWK] = {}  # kid -> key ("" for a key without a kid)
        self._fetched_at = -1e18  # monotonic
        self._tried_at = -1e18
        self._jwks_url = settings.jwks_url
        self._lock = asyncio.Lock()
        self._remembered: dict[str, _Verified] = {}  # token -> its verified claims
        self.fetches = 0

    async def principal(self, token: str, teams: Mapping[str, TeamSettings]) -> ClientKey:
        """The principal ``token`` stands for under ``teams`` (the running config's); ``AuthenticationError``
        (401) when it does not verify, ``PermissionDenied`` (403) when it names no team and ``unknown_team`` is
        ``deny``."""
        known = self._remembered.get(token)
        if known is None or self._clock() >= known.until:
            known = await self._verify(token)
        derived = known.derived
        if derived is not None and derived[0] is teams:
            return derived[1]
        principal = self._principal(known.claims, teams)
        known.derived = (teams, principal)
        return principal

    async def _verify(self, token: str) -> _Verified:
        self._remembered.pop(token, None)  # past its time: verified again, or refused
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise _refused("not a JWT") from None
        alg = header.get("alg")
        if alg not in self.settings.algorithms:
            raise _refused(f"its algorithm is not one of {', '.join(self.settings.algorithms)}")
        kid = header.get("kid")
        kid = kid if isinstance(kid, str) else ""
        key = await self._key(kid)
        if not _compatible(key, alg):
            raise _refused("its algorithm does not match its key's")
        claims = self._decode(token, key, alg)
        until = min(float(claims["exp"]), self._clock() + self.settings.jwks_cache_s)
        verified = _Verified(kid=kid, key=key, claims=claims, until=until)
        if len(self._remembered) >= _MAX_REMEMBERED:
            self._remembered.clear()
        self._remembered[token] = verified
        return verified

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
            if team not in teams and s.unknown_team == "deny":
                raise PermissionDenied(
                    f"bearer token: no configured team matches its {s.team_claim!r} claim (auth.jwt.unknown_team: deny)"
                )
        team = team[:128]
        models = teams[team].models if team in teams else None
        return ClientKey(
            name=f"jwt:{user}",
            team=team,
            user=user,
            models=None if models is None else tuple(models),
            digest=_NO_KEY,
        )

    def _fresh(self) -> bool:
        return self._monotonic() - self._fetched_at < self.settings.jwks_cache_s

    async def _key(self, kid: str) -> jwt.PyJWK:
        key = self._keys.get(kid)
        if key is not None and self._fresh():
            return key
        async with self._lock:  # one fetch at a time; the requests waiting on it then find its keys
            stale, unknown = not self._fresh(), kid not in self._keys
            if (stale or unknown) and self._monotonic() - self._tried_at >= REFETCH_S:
                await self._refresh()
        key = _lookup(self._keys, kid)
        if key is None:
            if not self._keys:
                raise IdentityProviderDown("the identity provider's signing keys cannot be fetched")
            raise _refused("it is signed with a key the issuer does not publish (kid)")
        return key

    async def _refresh(self) -> None:
        self._tried_at = self._monotonic()
        try:
            keys = await asyncio.to_thread(self._fetch)
        except Exception as exc:  # the issuer unreachable, or a broken document: keep what is known
            log.warning("auth.jwt: fetching the issuer's keys failed: %s", exc)
            return
        self._keys = keys
        self._fetched_at = self._monotonic()
        self._remembered = {  # the tokens of a withdrawn (or changed) key are verified again, and refused
            token: known
            for token, known in self._remembered.items()
            if (key := _lookup(keys, known.kid)) is not None and _same(key, known.key)
        }

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

"""A fake OpenID Connect identity provider (Okta/Keycloak/Auth0-like) for tests: the relying party's side of the
authorization-code flow with PKCE, strictly on the wire.

:class:`FakeOidcIssuer` serves, on 127.0.0.1 from an aiohttp server in a background thread (``fake.base_url`` is
the issuer, ``http://127.0.0.1:PORT``, no trailing slash):

* ``GET /.well-known/openid-configuration``: the discovery document (:meth:`FakeOidcIssuer.discovery`).
* ``GET|POST /authorize``: a registered ``client_id`` and a ``redirect_uri`` registered for it (exactly), else a
  400 HTML page and no redirect, as real IdPs do. Then, as redirects ``redirect_uri?error=…&state=…``:
  ``response_type=code`` (``unsupported_response_type``), ``scope`` with ``openid`` and only scopes of
  ``fake.scopes`` (``invalid_scope``), ``state``, ``nonce`` (unless ``require_nonce`` is False), ``code_challenge``
  (43 base64url characters) with ``code_challenge_method=S256`` (plain or none refused), ``response_mode`` query
  or absent, no repeated parameter (``invalid_request``). It approves ``fake.user`` at once:
  ``302 redirect_uri?code=…&state=…``, the code single-use, valid ``code_lifetime_s`` (60 s) and bound to the
  client, redirect URI, challenge, nonce, scope and user; ``fake.deny_next_authorize = True`` answers the next
  (valid) request with ``error=access_denied`` instead (and clears itself).
* ``POST /token`` (form-encoded): client authentication by ``client_secret_basic`` (RFC 6749 §2.3.1: the
  form-urlencoded id and secret) or ``client_secret_post``, one method only (``fake.auth_methods`` lists the
  accepted ones), or for a public client (secret None) its ``client_id`` alone; a failure is 401
  ``invalid_client``. ``authorization_code``: the code (unknown, used, expired or another client's:
  ``invalid_grant``; a reused code also revokes the tokens issued from it, RFC 6749 §4.1.2), the same
  ``redirect_uri``, a ``code_verifier`` whose S256 is the challenge -> ``access_token``, ``token_type`` Bearer,
  ``expires_in``, ``refresh_token``, ``id_token``, ``scope``. ``refresh_token``: a live refresh token of this
  client and a user still in ``fake.users`` -> new access and id tokens (the user's current claims) and a rotated
  refresh token (the presented one dies; ``rotate_refresh_tokens = False`` keeps it and omits it from the answer);
  ``refuse_refresh = True`` (an IdP that deprovisioned the user) answers ``invalid_grant``. Other grants:
  ``unsupported_grant_type``. Every /token answer carries ``Cache-Control: no-store``.
* ``GET /jwks``: the public keys (``kid``, RS256); :meth:`FakeOidcIssuer.rotate_key` adds a new signing key.
* ``GET|POST /userinfo``: ``Authorization: Bearer <access token>`` -> ``sub``, ``email``, ``email_verified``,
  ``name`` and the groups claim; else 401 with ``WWW-Authenticate: Bearer …`` (RFC 6750 §3).
* ``POST /revoke`` (RFC 7009): client authentication as at ``/token``; 200 for any ``token``, revoking it when it
  is this client's (a refresh token takes its grant's access tokens along).

**id tokens** are RS256 with a ``kid``: ``iss``, ``sub``, ``aud`` (the client id), ``exp`` (``id_token_lifetime_s``),
``iat``, ``auth_time``, ``nonce`` (code grant only), ``at_hash``, ``email``/``email_verified`` (scope ``email``),
``name`` (scope ``profile``) and the user's groups as a list under ``groups_claim`` (default ``groups``, always).
``fake.id_token_claims`` overrides claims of the id tokens issued from now on (a value of None removes the claim):
a way to make the IdP send a wrong ``aud``, ``nonce`` or ``iss``; :meth:`FakeOidcIssuer.sign` signs any claims.

Recorded: ``fake.requests`` (:class:`OidcRequest`, oldest first), ``authorize_count``, ``token_count`` (a
``Counter`` by ``grant_type``, every token request), ``refresh_refused_count``; :meth:`reset` forgets them (not
the codes and tokens). Time comes from ``clock`` (``time.time``), so code and token expiry is testable.

``python -m tests.fakes.oidc --serve --port N --client-id … --client-secret … --redirect-uri …`` runs it until Ctrl-C
and prints the issuer URL.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import html
import json
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from ._server import BackgroundServer
from .claude_api import RecordedRequest

__all__ = [
    "AUTH_METHODS",
    "DEFAULT_USER",
    "SCOPES",
    "FakeOidcIssuer",
    "FakeUser",
    "OidcRequest",
    "at_hash",
    "s256",
]

SCOPES = ("openid", "profile", "email", "groups", "offline_access")
AUTH_METHODS = ("client_secret_basic", "client_secret_post")
_CHALLENGE_RE = re.compile(r"^[A-Za-z0-9_-]{43}$")  # base64url of a SHA-256, unpadded
_VERIFIER_RE = re.compile(r"^[A-Za-z0-9._~-]{43,128}$")  # RFC 7636 §4.1
_ROUTES: dict[str, tuple[str, tuple[str, ...]]] = {
    "/.well-known/openid-configuration": ("discovery", ("GET",)),
    "/authorize": ("authorize", ("GET", "POST")),
    "/token": ("token", ("POST",)),
    "/jwks": ("jwks", ("GET",)),
    "/userinfo": ("userinfo", ("GET", "POST")),
    "/revoke": ("revoke", ("POST",)),
}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def s256(code_verifier: str) -> str:
    """The PKCE S256 ``code_challenge`` of a verifier (RFC 7636 §4.2)."""
    return _b64url(hashlib.sha256(code_verifier.encode("ascii")).digest())


def at_hash(access_token: str) -> str:
    """The id token's ``at_hash`` for RS256 (OpenID Connect Core §3.1.3.6)."""
    return _b64url(hashlib.sha256(access_token.encode("ascii")).digest()[:16])


@dataclass(frozen=True)
class FakeUser:
    """The person the IdP signs in (``groups`` may be given as any sequence; it is kept as a tuple)."""

    sub: str
    email: str
    name: str
    groups: Sequence[str] = ()
    email_verified: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(self.groups))


DEFAULT_USER = FakeUser(
    sub="00u1fake0alice", email="alice@example.com", name="Alice Example", groups=("engineering", "gateway-users")
)


@dataclass
class OidcRequest(RecordedRequest):
    """A recorded request: ``endpoint`` is discovery, authorize, token, jwks, userinfo, revoke or None (404)."""

    endpoint: str | None = None
    params: dict[str, str] = field(default_factory=dict)  # the query (GET) or form (POST) parameters
    client_id: str | None = None  # as authenticated (token, revoke) or asked for (authorize)
    grant_type: str | None = None
    status: int = 0
    error: str | None = None  # "invalid_grant: …"; for /authorize also the redirected error
    location: str | None = None  # the redirect /authorize answered


@dataclass
class _Client:
    client_id: str
    client_secret: str | None  # None: a public client (PKCE only, authentication method "none")
    redirect_uris: list[str]


@dataclass
class _Code:
    client_id: str
    redirect_uri: str
    challenge: str
    nonce: str | None
    scope: str
    sub: str
    auth_time: int
    expires_at: float
    used: bool = False


@dataclass
class _Grant:
    """What a refresh token (or an access token) stands for; ``family`` is the code it descends from."""

    client_id: str
    sub: str
    scope: str
    auth_time: int
    family: str
    expires_at: float | None


@dataclass
class _Counters:
    disconnects: int = 0
    requests: list[OidcRequest] = field(default_factory=list)
    authorize_count: int = 0
    token_count: Counter[str] = field(default_factory=Counter)
    refresh_refused_count: int = 0


class _OAuthError(Exception):
    def __init__(self, status: int, error: str, description: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{error}: {description}")
        self.status, self.error, self.description, self.headers = status, error, description, headers or {}


class _PageError(Exception):
    """An /authorize request that cannot be redirected (unknown client or redirect URI): an HTML page."""


class _RedirectError(Exception):
    def __init__(self, location: str, error: str) -> None:
        super().__init__(error)
        self.location, self.error = location, error


def _with_query(uri: str, params: dict[str, str]) -> str:
    return uri + ("&" if "?" in uri else "?") + urlencode(params)


def _json(status: int, payload: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(payload, indent=2).encode(),
        headers={"Content-Type": "application/json; charset=utf-8", **(headers or {})},
    )


_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


class FakeOidcIssuer(BackgroundServer):
    """The fake identity provider. ``with FakeOidcIssuer(redirect_uris=[…]) as idp: ...`` starts and stops it."""

    thread_name = "fake-oidc"

    def __init__(
        self,
        *,
        client_id: str = "gateway",
        client_secret: str | None = "gateway-secret",
        redirect_uris: Iterable[str] = (),
        user: FakeUser = DEFAULT_USER,
        users: Iterable[FakeUser] = (),
        groups_claim: str = "groups",
        access_token_lifetime_s: int = 3600,
        id_token_lifetime_s: int = 3600,
        refresh_token_lifetime_s: int | None = None,
        code_lifetime_s: int = 60,
        auth_methods: Sequence[str] = AUTH_METHODS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client_id = client_id
        self._clients = {client_id: _Client(client_id, client_secret, list(redirect_uris))}
        #: the directory, by ``sub``: a refresh or /userinfo for a subject no longer here is refused
        self.users: dict[str, FakeUser] = {u.sub: u for u in users}
        self._user = user
        self.users[user.sub] = user
        self.groups_claim = groups_claim
        self.access_token_lifetime_s = access_token_lifetime_s
        self.id_token_lifetime_s = id_token_lifetime_s
        self.refresh_token_lifetime_s = refresh_token_lifetime_s  # None: until used, revoked or refused
        self.code_lifetime_s = code_lifetime_s
        self.auth_methods: tuple[str, ...] = tuple(auth_methods)
        self.scopes: tuple[str, ...] = SCOPES
        self.deny_next_authorize = False  # the next valid /authorize redirects error=access_denied (one-shot)
        self.refuse_refresh = False  # every refresh grant is invalid_grant while True
        self.rotate_refresh_tokens = True
        self.require_nonce = True
        self.id_token_on_refresh = True  # False: the refresh grant's answer has no id_token (as some IdPs do)
        self.id_token_claims: dict[str, Any] = {}  # overrides of id-token claims; a None value removes the claim
        self._clock = clock
        self._keys: list[tuple[str, rsa.RSAPrivateKey]] = []  # newest (the signing key) first
        self._codes: dict[str, _Code] = {}
        self._refresh: dict[str, _Grant] = {}
        self._access: dict[str, _Grant] = {}
        super().__init__()
        self.rotate_key()

    def _new_state(self) -> _Counters:
        return _Counters()

    # -- configuration --------------------------------------------------------------------------

    @property
    def user(self) -> FakeUser:
        """The user /authorize approves; assigning one also puts it in ``users`` (replacing that ``sub``)."""
        return self._user

    @user.setter
    def user(self, user: FakeUser) -> None:
        with self._cond:
            self._user = user
            self.users[user.sub] = user

    @property
    def client_secret(self) -> str | None:
        return self._clients[self.client_id].client_secret

    @client_secret.setter
    def client_secret(self, secret: str | None) -> None:
        with self._cond:
            self._clients[self.client_id].client_secret = secret

    @property
    def redirect_uris(self) -> list[str]:
        with self._cond:
            return list(self._clients[self.client_id].redirect_uris)

    def register_redirect(self, uri: str, *, client_id: str | None = None) -> None:
        """Accept ``uri`` (compared exactly) as a redirect URI of the client (default: the main one)."""
        with self._cond:
            uris = self._clients[client_id or self.client_id].redirect_uris
            if uri not in uris:
                uris.append(uri)

    def register_client(self, client_id: str, client_secret: str | None, redirect_uris: Iterable[str] = ()) -> None:
        """Another client (e.g. to check that codes and tokens are bound to theirs); None: a public client."""
        with self._cond:
            self._clients[client_id] = _Client(client_id, client_secret, list(redirect_uris))

    def rotate_key(self) -> str:
        """A new RSA key signs from now on (the old ones stay in the JWKS); returns its ``kid``."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        kid = f"fake-{secrets.token_hex(8)}"
        with self._cond:
            self._keys.insert(0, (kid, key))
        return kid

    @property
    def kid(self) -> str:
        """The ``kid`` of the signing key."""
        return self._keys[0][0]

    def sign(self, claims: dict[str, Any], *, kid: str | None = None) -> str:
        """An RS256 JWT of ``claims`` signed with the key ``kid`` (default: the signing key), header ``kid``."""
        keys = dict(self._keys)
        kid = kid or self.kid
        return jwt.encode(claims, keys[kid], algorithm="RS256", headers={"kid": kid})

    # -- URLs -------------------------------------------------------------------------------------

    @property
    def issuer(self) -> str:
        return self.base_url

    @property
    def discovery_url(self) -> str:
        return f"{self.base_url}/.well-known/openid-configuration"

    @property
    def authorization_endpoint(self) -> str:
        return f"{self.base_url}/authorize"

    @property
    def token_endpoint(self) -> str:
        return f"{self.base_url}/token"

    @property
    def jwks_uri(self) -> str:
        return f"{self.base_url}/jwks"

    @property
    def userinfo_endpoint(self) -> str:
        return f"{self.base_url}/userinfo"

    @property
    def revocation_endpoint(self) -> str:
        return f"{self.base_url}/revoke"

    def discovery(self) -> dict[str, Any]:
        """The OpenID Provider Metadata served at ``discovery_url``."""
        return {
            "issuer": self.issuer,
            "authorization_endpoint": self.authorization_endpoint,
            "token_endpoint": self.token_endpoint,
            "jwks_uri": self.jwks_uri,
            "userinfo_endpoint": self.userinfo_endpoint,
            "revocation_endpoint": self.revocation_endpoint,
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "token_endpoint_auth_methods_supported": list(self.auth_methods),
            "revocation_endpoint_auth_methods_supported": list(self.auth_methods),
            "scopes_supported": list(self.scopes),
            "subject_types_supported": ["public"],
            "claims_supported": [
                *("iss", "sub", "aud", "exp", "iat", "auth_time", "nonce", "at_hash"),
                *("email", "email_verified", "name", self.groups_claim),
            ],
        }

    def jwks(self) -> dict[str, Any]:
        """The public key set served at ``jwks_uri``."""
        keys = []
        for kid, key in list(self._keys):
            numbers = key.public_key().public_numbers()
            n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
            e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
            keys.append({"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid, "n": _b64url(n), "e": _b64url(e)})
        return {"keys": keys}

    # -- recorded state ---------------------------------------------------------------------------

    @property
    def requests(self) -> list[OidcRequest]:
        with self._cond:
            return list(self._state.requests)

    @property
    def authorize_count(self) -> int:
        """Requests to /authorize (whatever their outcome)."""
        with self._cond:
            return int(self._state.authorize_count)

    @property
    def token_count(self) -> Counter[str]:
        """Requests to /token by ``grant_type`` ("" when absent), refused ones included."""
        with self._cond:
            return Counter(self._state.token_count)

    @property
    def refresh_refused_count(self) -> int:
        """Refresh grants refused because of ``refuse_refresh`` or a user no longer in ``users``."""
        with self._cond:
            return int(self._state.refresh_refused_count)

    # -- dispatch ---------------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        endpoint, methods = _ROUTES.get(request.path, (None, ()))
        record = OidcRequest(
            method=request.method,
            path=request.path,
            query=request.query_string,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            endpoint=endpoint,
        )
        try:
            if endpoint is None:
                raise _OAuthError(404, "not_found", f"no such endpoint: {request.path}")
            if request.method not in methods:
                raise _OAuthError(405, "invalid_request", "method not allowed", {"Allow": ", ".join(methods)})
            params = self._params(request, body, record)
            match endpoint:
                case "discovery":
                    resp = _json(200, self.discovery())
                case "jwks":
                    resp = _json(200, self.jwks())
                case "authorize":
                    resp = self._authorize(params, record)
                case "token":
                    resp = self._token(request, params, record)
                case "userinfo":
                    resp = self._userinfo(request)
                case _:
                    resp = self._revoke(request, params, record)
        except _OAuthError as exc:
            record.error = str(exc)
            headers = exc.headers if endpoint in ("userinfo", None) else {**_NO_STORE, **exc.headers}
            resp = _json(exc.status, {"error": exc.error, "error_description": exc.description}, headers)
        except _PageError as exc:
            record.error = f"page: {exc}"
            page = "<!DOCTYPE html><html><head><title>Error</title></head><body><h1>Bad Request</h1>"
            page += f"<p>{html.escape(str(exc))}</p></body></html>"
            resp = web.Response(status=400, text=page, content_type="text/html")
        except _RedirectError as exc:
            record.error, record.location = exc.error, exc.location
            resp = web.Response(status=302, headers={"Location": exc.location, **_NO_STORE})
        record.status = resp.status
        self._record(record)
        return resp

    @staticmethod
    def _params(request: web.Request, body: bytes, record: OidcRequest) -> dict[str, str]:
        """The query (GET) or form body (POST) as a dict; a repeated parameter is ``invalid_request`` (RFC 6749
        §3.1), at /authorize after the client and redirect URI are known (recorded as ``__repeated``)."""
        if request.method == "GET":
            pairs = list(request.query.items())
        elif body and request.content_type != "application/x-www-form-urlencoded":
            raise _OAuthError(400, "invalid_request", "the body must be application/x-www-form-urlencoded")
        else:
            pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        params = dict(pairs)
        record.params = dict(params)
        repeated = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        if repeated:
            if record.endpoint != "authorize" or {"client_id", "redirect_uri"} & set(repeated):
                if record.endpoint == "authorize":
                    raise _PageError(f"Invalid request: parameter {repeated[0]} repeated")
                raise _OAuthError(400, "invalid_request", f"parameter {repeated[0]} repeated")
            params["__repeated"] = repeated[0]
        return params

    # -- /authorize -------------------------------------------------------------------------------

    def _authorize(self, params: dict[str, str], record: OidcRequest) -> web.Response:
        with self._cond:
            self._state.authorize_count += 1
            client = self._clients.get(params.get("client_id", ""))
            uris = list(client.redirect_uris) if client else []
        record.client_id = params.get("client_id")
        if client is None:
            raise _PageError("Invalid client_id: the client is not registered")
        redirect_uri = params.get("redirect_uri", "")
        if redirect_uri not in uris:
            raise _PageError("Invalid parameter: redirect_uri is not registered for this client")
        state = params.get("state")

        def refuse(error: str, description: str) -> _RedirectError:
            answer = {"error": error, "error_description": description}
            return _RedirectError(_with_query(redirect_uri, {**answer, **({"state": state} if state else {})}), error)

        if "__repeated" in params:
            raise refuse("invalid_request", f"parameter {params['__repeated']} repeated")
        if "response_type" not in params:
            raise refuse("invalid_request", "response_type is required")
        if params["response_type"] != "code":
            raise refuse("unsupported_response_type", "only response_type=code is supported")
        if params.get("response_mode", "query") != "query":
            raise refuse("invalid_request", "only response_mode=query is supported")
        scopes = params.get("scope", "").split()
        if "openid" not in scopes:
            raise refuse("invalid_scope", "the openid scope is required")
        unknown = [s for s in scopes if s not in self.scopes]
        if unknown:
            raise refuse("invalid_scope", f"unknown scope: {unknown[0]}")
        if not state:
            raise refuse("invalid_request", "state is required")
        nonce = params.get("nonce") or None
        if self.require_nonce and nonce is None:
            raise refuse("invalid_request", "nonce is required")
        challenge = params.get("code_challenge", "")
        if not challenge:
            raise refuse("invalid_request", "PKCE code_challenge is required")
        if params.get("code_challenge_method") != "S256":
            raise refuse("invalid_request", "code_challenge_method must be S256")
        if not _CHALLENGE_RE.match(challenge):
            raise refuse("invalid_request", "code_challenge is not an S256 challenge")
        if self.deny_next_authorize:
            self.deny_next_authorize = False
            raise refuse("access_denied", "The resource owner or authorization server denied the request.")
        code = secrets.token_urlsafe(32)
        now = self._clock()
        with self._cond:
            self._codes[code] = _Code(
                client_id=client.client_id,
                redirect_uri=redirect_uri,
                challenge=challenge,
                nonce=nonce,
                scope=" ".join(scopes),
                sub=self._user.sub,
                auth_time=int(now),
                expires_at=now + self.code_lifetime_s,
            )
        location = _with_query(redirect_uri, {"code": code, "state": state})
        record.location = location
        return web.Response(status=302, headers={"Location": location, **_NO_STORE})

    # -- client authentication --------------------------------------------------------------------

    def _authenticate(self, request: web.Request, params: dict[str, str], record: OidcRequest) -> _Client:
        """The client of a /token or /revoke request (RFC 6749 §2.3.1), or a 401 ``invalid_client``."""
        authorization = request.headers.get("Authorization", "")
        basic = authorization[:6].lower() == "basic "
        challenge = {"WWW-Authenticate": 'Basic realm="fake-oidc"'} if basic else {}

        def refuse(description: str) -> _OAuthError:
            return _OAuthError(401, "invalid_client", description, challenge)

        if basic and "client_secret" in params:
            raise _OAuthError(400, "invalid_request", "more than one client authentication method")
        if basic:
            try:
                decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
            except ValueError:
                raise refuse("malformed Basic credentials") from None
            raw_id, sep, raw_secret = decoded.partition(":")
            if not sep:
                raise refuse("malformed Basic credentials")
            method, client_id, secret = "client_secret_basic", unquote(raw_id), unquote(raw_secret)
            if params.get("client_id", client_id) != client_id:
                raise _OAuthError(400, "invalid_request", "client_id differs from the authenticated client")
        elif "client_secret" in params:
            method, client_id, secret = "client_secret_post", params.get("client_id", ""), params["client_secret"]
        else:
            method, client_id, secret = "none", params.get("client_id", ""), None
        record.client_id = client_id or None
        with self._cond:
            client = self._clients.get(client_id)
        if client is not None and client.client_secret is None:  # a public client: its id, no secret
            if method != "none":
                raise refuse("a public client has no secret")
            return client
        if method == "none":
            raise refuse("client authentication is required")
        if client is None or not secrets.compare_digest((client.client_secret or "").encode(), (secret or "").encode()):
            raise refuse("client authentication failed")
        if method not in self.auth_methods:
            raise refuse(f"{method} is not allowed for this client")
        return client

    # -- /token -----------------------------------------------------------------------------------

    def _token(self, request: web.Request, params: dict[str, str], record: OidcRequest) -> web.Response:
        grant = params.get("grant_type")
        record.grant_type = grant
        with self._cond:
            self._state.token_count[grant or ""] += 1
        client = self._authenticate(request, params, record)
        if not grant:
            raise _OAuthError(400, "invalid_request", "grant_type is required")
        if grant == "authorization_code":
            return self._code_grant(client, params)
        if grant == "refresh_token":
            return self._refresh_grant(client, params)
        raise _OAuthError(400, "unsupported_grant_type", f"grant_type {grant} is not supported")

    def _code_grant(self, client: _Client, params: dict[str, str]) -> web.Response:
        if not params.get("code"):
            raise _OAuthError(400, "invalid_request", "code is required")
        now = self._clock()
        with self._cond:
            code = self._codes.get(params["code"])
            if code is None or code.client_id != client.client_id:
                raise _OAuthError(400, "invalid_grant", "the authorization code is invalid")
            if code.used:  # RFC 6749 §4.1.2: revoke what the code gave
                self._revoke_family(params["code"])
                raise _OAuthError(400, "invalid_grant", "the authorization code was already used")
            code.used = True  # a failed exchange burns the code too
            if now >= code.expires_at:
                raise _OAuthError(400, "invalid_grant", "the authorization code expired")
            if params.get("redirect_uri") != code.redirect_uri:
                raise _OAuthError(400, "invalid_grant", "redirect_uri does not match the authorization request")
            verifier = params.get("code_verifier", "")
            if not verifier:
                raise _OAuthError(400, "invalid_grant", "PKCE code_verifier is required")
            if not _VERIFIER_RE.match(verifier) or not secrets.compare_digest(s256(verifier), code.challenge):
                raise _OAuthError(400, "invalid_grant", "PKCE verification failed")
            user = self.users.get(code.sub)
            if user is None:
                raise _OAuthError(400, "invalid_grant", "the user is no longer active")
            grant = _Grant(client.client_id, code.sub, code.scope, code.auth_time, params["code"], None)
            return self._issue(grant, user, nonce=code.nonce, with_id_token=True, with_refresh=True)

    def _refresh_grant(self, client: _Client, params: dict[str, str]) -> web.Response:
        presented = params.get("refresh_token", "")
        if not presented:
            raise _OAuthError(400, "invalid_request", "refresh_token is required")
        now = self._clock()
        with self._cond:
            grant = self._refresh.get(presented)
            if grant is None or grant.client_id != client.client_id:
                raise _OAuthError(400, "invalid_grant", "the refresh token is invalid")
            if grant.expires_at is not None and now >= grant.expires_at:
                raise _OAuthError(400, "invalid_grant", "the refresh token expired")
            user = self.users.get(grant.sub)
            if self.refuse_refresh or user is None:
                self._state.refresh_refused_count += 1
                raise _OAuthError(400, "invalid_grant", "the user is not active (refresh refused)")
            scope = params.get("scope")
            if scope is not None and not set(scope.split()) <= set(grant.scope.split()):
                raise _OAuthError(400, "invalid_scope", "the scope exceeds the one originally granted")
            if scope:
                grant = replace(grant, scope=scope)
            if self.rotate_refresh_tokens:
                del self._refresh[presented]
            return self._issue(
                grant, user, nonce=None, with_id_token=self.id_token_on_refresh, with_refresh=self.rotate_refresh_tokens
            )

    def _issue(
        self, grant: _Grant, user: FakeUser, *, nonce: str | None, with_id_token: bool, with_refresh: bool
    ) -> web.Response:
        """The token response (called with the condition held)."""
        now = self._clock()
        access = secrets.token_urlsafe(32)
        self._access[access] = replace(grant, expires_at=now + self.access_token_lifetime_s)
        payload: dict[str, Any] = {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.access_token_lifetime_s,
            "scope": grant.scope,
        }
        if with_refresh:
            refresh = secrets.token_urlsafe(48)
            lifetime = self.refresh_token_lifetime_s
            expires_at = None if lifetime is None else now + lifetime
            self._refresh[refresh] = replace(grant, expires_at=expires_at)
            payload["refresh_token"] = refresh
        if with_id_token:
            payload["id_token"] = self._id_token(grant, user, nonce=nonce, access_token=access)
        return _json(200, payload, _NO_STORE)

    def _id_token(self, grant: _Grant, user: FakeUser, *, nonce: str | None, access_token: str) -> str:
        now = int(self._clock())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": user.sub,
            "aud": grant.client_id,
            "exp": now + self.id_token_lifetime_s,
            "iat": now,
            "auth_time": grant.auth_time,
            "at_hash": at_hash(access_token),
        }
        if nonce is not None:
            claims["nonce"] = nonce
        scopes = grant.scope.split()
        if "email" in scopes:
            claims.update(email=user.email, email_verified=user.email_verified)
        if "profile" in scopes:
            claims["name"] = user.name
        claims[self.groups_claim] = list(user.groups)
        for name, value in self.id_token_claims.items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        return self.sign(claims)

    def _revoke_family(self, family: str) -> None:
        for table in (self._access, self._refresh):
            for token in [t for t, g in table.items() if g.family == family]:
                del table[token]

    # -- /userinfo and /revoke ---------------------------------------------------------------------

    def _userinfo(self, request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization", "")
        if authorization[:7].lower() != "bearer " or not authorization[7:].strip():
            raise _OAuthError(
                401, "invalid_request", "no access token", {"WWW-Authenticate": 'Bearer realm="fake-oidc"'}
            )
        with self._cond:
            grant = self._access.get(authorization[7:].strip())
            user = self.users.get(grant.sub) if grant else None
            expired = grant is not None and grant.expires_at is not None and self._clock() >= grant.expires_at
        if grant is None or user is None or expired:
            description = "The access token is invalid or expired"
            challenge = f'Bearer realm="fake-oidc", error="invalid_token", error_description="{description}"'
            raise _OAuthError(401, "invalid_token", description, {"WWW-Authenticate": challenge})
        claims: dict[str, Any] = {"sub": user.sub}
        scopes = grant.scope.split()
        if "email" in scopes:
            claims.update(email=user.email, email_verified=user.email_verified)
        if "profile" in scopes:
            claims["name"] = user.name
        claims[self.groups_claim] = list(user.groups)
        return _json(200, claims, _NO_STORE)

    def _revoke(self, request: web.Request, params: dict[str, str], record: OidcRequest) -> web.Response:
        client = self._authenticate(request, params, record)
        token = params.get("token")
        if not token:
            raise _OAuthError(400, "invalid_request", "token is required")
        with self._cond:
            refresh = self._refresh.get(token)
            if refresh is not None and refresh.client_id == client.client_id:
                self._revoke_family(refresh.family)
            access = self._access.get(token)
            if access is not None and access.client_id == client.client_id:
                del self._access[token]
        return web.Response(status=200, headers=_NO_STORE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve", action="store_true", help="run the fake until Ctrl-C and print its issuer URL")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default: a free one)")
    parser.add_argument("--client-id", default="gateway")
    parser.add_argument("--client-secret", default="gateway-secret")
    parser.add_argument("--redirect-uri", action="append", default=[], help="a registered redirect URI (repeatable)")
    parser.add_argument("--sub", default=DEFAULT_USER.sub)
    parser.add_argument("--email", default=DEFAULT_USER.email)
    parser.add_argument("--name", default=DEFAULT_USER.name)
    parser.add_argument("--group", action="append", default=None, help="a group of the user (repeatable)")
    parser.add_argument("--groups-claim", default="groups")
    args = parser.parse_args(argv)
    if not args.serve:
        parser.print_help()
        return 0
    groups = DEFAULT_USER.groups if args.group is None else args.group
    fake = FakeOidcIssuer(
        client_id=args.client_id,
        client_secret=args.client_secret,
        redirect_uris=args.redirect_uri,
        user=FakeUser(sub=args.sub, email=args.email, name=args.name, groups=groups),
        groups_claim=args.groups_claim,
    )
    fake.listen_port = args.port
    with fake:
        print(fake.base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

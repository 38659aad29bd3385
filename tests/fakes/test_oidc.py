"""Self-test of the fake OpenID Connect provider over real HTTP: the code flow with PKCE by hand (httpx, the id
token checked with PyJWT against the fake's JWKS) and through Authlib's ``AsyncOAuth2Client`` (the relying party
the gateway uses), each refusal a real IdP answers, and the ``--serve`` mode."""

from __future__ import annotations

import asyncio
import base64
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest

from .oidc import DEFAULT_USER, FakeOidcIssuer, FakeUser, at_hash, s256

CLIENT_ID = "gateway"
CLIENT_SECRET = "s3cret/with:odd+chars"
REDIRECT = "http://127.0.0.1:9/oauth/callback"
SCOPE = "openid email profile"
REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeOidcIssuer]:
    with FakeOidcIssuer(client_id=CLIENT_ID, client_secret=CLIENT_SECRET, clock=clock) as server:
        server.register_redirect(REDIRECT)  # after start, as a gateway whose port is known late does
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10, follow_redirects=False) as client:
        yield client


def _flow_params(**overrides: str | None) -> dict[str, str]:
    verifier = overrides.pop("verifier", None) or "v" * 50
    params: dict[str, str | None] = {
        "response_type": "code",
        "client_id": CLIENT_ID,
        "redirect_uri": REDIRECT,
        "scope": SCOPE,
        "state": "st-123",
        "nonce": "n-456",
        "code_challenge": s256(verifier),
        "code_challenge_method": "S256",
        **overrides,
    }
    return {k: v for k, v in params.items() if v is not None}


def _authorize(fake: FakeOidcIssuer, http: httpx.Client, **overrides: str | None) -> httpx.Response:
    return http.get(fake.authorization_endpoint, params=_flow_params(**overrides))


def _redirect_query(resp: httpx.Response, base: str = REDIRECT) -> dict[str, str]:
    assert resp.status_code == 302, resp.text
    location = resp.headers["location"]
    assert location.startswith(base + "?")
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def _code(fake: FakeOidcIssuer, http: httpx.Client, verifier: str = "v" * 50) -> str:
    query = _redirect_query(_authorize(fake, http, verifier=verifier))
    assert query["state"] == "st-123"
    return query["code"]


def _basic(client_id: str = CLIENT_ID, secret: str = CLIENT_SECRET) -> dict[str, str]:
    from urllib.parse import quote

    raw = f"{quote(client_id, safe='')}:{quote(secret, safe='')}".encode()
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


def _token(http: httpx.Client, fake: FakeOidcIssuer, form: dict[str, str], **kwargs: Any) -> httpx.Response:
    headers = kwargs.pop("headers", _basic())
    return http.post(fake.token_endpoint, data=form, headers=headers, **kwargs)


def _exchange(http: httpx.Client, fake: FakeOidcIssuer, code: str, verifier: str = "v" * 50) -> httpx.Response:
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "code_verifier": verifier}
    return _token(http, fake, form)


def _verify(fake: FakeOidcIssuer, id_token: str, **options: Any) -> dict[str, Any]:
    key = jwt.PyJWKClient(fake.jwks_uri).get_signing_key_from_jwt(id_token)
    claims: dict[str, Any] = jwt.decode(
        id_token,
        key=key,
        algorithms=["RS256"],
        issuer=fake.issuer,
        options={"require": ["exp", "iat", "iss", "aud", "sub"]},
        **{"audience": CLIENT_ID, **options},
    )
    return claims


def _error(resp: httpx.Response, status: int, error: str) -> str:
    assert resp.status_code == status, resp.text
    assert resp.headers["cache-control"] == "no-store"
    body = resp.json()
    assert body["error"] == error
    return str(body.get("error_description", ""))


# =============================================================================================
# Discovery and the whole flow
# =============================================================================================


def test_discovery(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    resp = http.get(fake.discovery_url)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/json")
    doc = resp.json()
    assert doc["issuer"] == fake.base_url == fake.issuer
    assert not doc["issuer"].endswith("/")
    assert doc["authorization_endpoint"] == f"{fake.base_url}/authorize"
    assert doc["token_endpoint"] == f"{fake.base_url}/token"
    assert doc["jwks_uri"] == f"{fake.base_url}/jwks"
    assert doc["userinfo_endpoint"] == f"{fake.base_url}/userinfo"
    assert doc["revocation_endpoint"] == f"{fake.base_url}/revoke"
    assert doc["response_types_supported"] == ["code"]
    assert doc["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert doc["code_challenge_methods_supported"] == ["S256"]
    assert doc["id_token_signing_alg_values_supported"] == ["RS256"]
    assert doc["token_endpoint_auth_methods_supported"] == ["client_secret_basic", "client_secret_post"]
    assert doc["subject_types_supported"] == ["public"]
    assert {"openid", "email", "profile"} <= set(doc["scopes_supported"])
    keys = http.get(doc["jwks_uri"]).json()["keys"]
    assert [(k["kty"], k["alg"], k["use"], k["kid"]) for k in keys] == [("RSA", "RS256", "sig", fake.kid)]
    assert http.get(f"{fake.base_url}/nowhere").status_code == 404
    assert http.get(fake.token_endpoint).status_code == 405


def test_code_flow_with_pkce(fake: FakeOidcIssuer, http: httpx.Client, clock: Clock) -> None:
    verifier = secrets.token_urlsafe(48)
    code = _code(fake, http, verifier)
    resp = _exchange(http, fake, code, verifier)
    assert resp.status_code == 200, resp.text
    assert resp.headers["cache-control"] == "no-store"
    assert resp.headers["pragma"] == "no-cache"
    token = resp.json()
    assert set(token) == {"access_token", "token_type", "expires_in", "refresh_token", "id_token", "scope"}
    assert token["token_type"] == "Bearer"
    assert token["expires_in"] == 3600
    assert token["scope"] == SCOPE

    header = jwt.get_unverified_header(token["id_token"])
    assert header["alg"] == "RS256"
    assert header["kid"] == fake.kid
    claims = _verify(fake, token["id_token"])
    assert claims["iss"] == fake.issuer
    assert claims["aud"] == CLIENT_ID
    assert claims["sub"] == DEFAULT_USER.sub
    assert claims["nonce"] == "n-456"
    assert claims["email"] == DEFAULT_USER.email
    assert claims["email_verified"] is True
    assert claims["name"] == DEFAULT_USER.name
    assert claims["groups"] == list(DEFAULT_USER.groups)
    assert claims["at_hash"] == at_hash(token["access_token"])
    assert claims["iat"] == claims["auth_time"] == int(clock.now)
    assert claims["exp"] == claims["iat"] + 3600

    info = http.get(fake.userinfo_endpoint, headers={"Authorization": f"Bearer {token['access_token']}"})
    assert info.status_code == 200
    assert info.json() == {
        "sub": DEFAULT_USER.sub,
        "email": DEFAULT_USER.email,
        "email_verified": True,
        "name": DEFAULT_USER.name,
        "groups": list(DEFAULT_USER.groups),
    }
    assert fake.authorize_count == 1
    assert fake.token_count == {"authorization_code": 1}
    assert [r.endpoint for r in fake.requests] == ["authorize", "token", "jwks", "userinfo"]
    authorize = fake.requests[0]
    assert authorize.params["code_challenge_method"] == "S256"
    assert authorize.location is not None and authorize.status == 302
    assert fake.requests[1].client_id == CLIENT_ID and fake.requests[1].grant_type == "authorization_code"


def test_client_secret_post_and_claims_options(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    fake.user = FakeUser(sub="u-2", email="bob@example.com", name="Bob", groups=["a", "b"])
    fake.groups_claim = "roles"
    query = _redirect_query(_authorize(fake, http, scope="openid"))
    form = {
        "grant_type": "authorization_code",
        "code": query["code"],
        "redirect_uri": REDIRECT,
        "code_verifier": "v" * 50,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
    }
    resp = _token(http, fake, form, headers={})
    assert resp.status_code == 200, resp.text
    claims = _verify(fake, resp.json()["id_token"])
    assert claims["sub"] == "u-2"
    assert claims["roles"] == ["a", "b"]
    assert "email" not in claims and "name" not in claims  # scope openid only
    assert "groups" not in claims


def test_redirect_uri_with_a_query_keeps_it(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    uri = "http://127.0.0.1:9/cb?tenant=x"
    fake.register_redirect(uri)
    assert uri in fake.redirect_uris
    resp = _authorize(fake, http, redirect_uri=uri)
    assert resp.headers["location"].startswith(uri + "&code=")


# =============================================================================================
# /authorize refusals
# =============================================================================================


def test_unregistered_redirect_uri_is_a_page_not_a_redirect(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    for overrides in ({"redirect_uri": "http://127.0.0.1:9/evil"}, {"redirect_uri": None}, {"client_id": "nobody"}):
        resp = _authorize(fake, http, **overrides)
        assert resp.status_code == 400
        assert "location" not in resp.headers
        assert resp.headers["content-type"].startswith("text/html")
        assert "Bad Request" in resp.text
    resp = _authorize(fake, http, redirect_uri=REDIRECT + "/")  # compared exactly
    assert resp.status_code == 400
    assert fake.authorize_count == 4
    assert all(r.error and r.error.startswith("page:") for r in fake.requests)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"code_challenge_method": "plain"}, "invalid_request"),
        ({"code_challenge_method": None}, "invalid_request"),
        ({"code_challenge": None}, "invalid_request"),
        ({"code_challenge": "short"}, "invalid_request"),
        ({"scope": "email profile"}, "invalid_scope"),
        ({"scope": "openid admin"}, "invalid_scope"),
        ({"response_type": "token"}, "unsupported_response_type"),
        ({"response_type": None}, "invalid_request"),
        ({"nonce": None}, "invalid_request"),
        ({"response_mode": "form_post"}, "invalid_request"),
    ],
)
def test_authorize_refusals_redirect(
    fake: FakeOidcIssuer, http: httpx.Client, overrides: dict[str, str | None], error: str
) -> None:
    query = _redirect_query(_authorize(fake, http, **overrides))
    assert query["error"] == error
    assert query["state"] == "st-123"
    assert "code" not in query
    assert query["error_description"]


def test_authorize_missing_state_and_repeated_parameter(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    query = _redirect_query(_authorize(fake, http, state=None))
    assert query["error"] == "invalid_request"
    assert "state" not in query
    params = [*_flow_params().items(), ("scope", "openid")]
    query = _redirect_query(http.get(fake.authorization_endpoint, params=params))
    assert query["error"] == "invalid_request"
    fake.require_nonce = False
    assert "code" in _redirect_query(_authorize(fake, http, nonce=None))


def test_deny_next_authorize(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    fake.deny_next_authorize = True
    query = _redirect_query(_authorize(fake, http))
    assert query == {
        "error": "access_denied",
        "error_description": "The resource owner or authorization server denied the request.",
        "state": "st-123",
    }
    assert fake.deny_next_authorize is False  # one-shot
    assert "code" in _redirect_query(_authorize(fake, http))


def test_authorize_by_post(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    resp = http.post(fake.authorization_endpoint, data=_flow_params())
    assert "code" in _redirect_query(resp)


# =============================================================================================
# /token refusals
# =============================================================================================


def test_pkce_mismatch(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    code = _code(fake, http, "v" * 50)
    assert "PKCE" in _error(_exchange(http, fake, code, "w" * 50), 400, "invalid_grant")
    # a failed exchange burns the code
    _error(_exchange(http, fake, code, "v" * 50), 400, "invalid_grant")
    code = _code(fake, http)
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT}
    assert "code_verifier" in _error(_token(http, fake, form), 400, "invalid_grant")


def test_reused_code_is_refused_and_revokes_its_tokens(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    code = _code(fake, http)
    first = _exchange(http, fake, code).json()
    assert "already used" in _error(_exchange(http, fake, code), 400, "invalid_grant")
    info = http.get(fake.userinfo_endpoint, headers={"Authorization": f"Bearer {first['access_token']}"})
    assert info.status_code == 401
    refresh = _token(http, fake, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]})
    _error(refresh, 400, "invalid_grant")


def test_wrong_redirect_uri_at_token(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    other = "http://127.0.0.1:9/other"
    fake.register_redirect(other)
    code = _code(fake, http)
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": other, "code_verifier": "v" * 50}
    assert "redirect_uri" in _error(_token(http, fake, form), 400, "invalid_grant")


def test_expired_and_unknown_code(fake: FakeOidcIssuer, http: httpx.Client, clock: Clock) -> None:
    code = _code(fake, http)
    clock.now += 61
    assert "expired" in _error(_exchange(http, fake, code), 400, "invalid_grant")
    _error(_exchange(http, fake, "no-such-code"), 400, "invalid_grant")


def test_code_is_bound_to_its_client(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    fake.register_client("other", "other-secret", [REDIRECT])
    code = _code(fake, http)
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "code_verifier": "v" * 50}
    _error(_token(http, fake, form, headers=_basic("other", "other-secret")), 400, "invalid_grant")


def test_client_authentication(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    code = _code(fake, http)
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "code_verifier": "v" * 50}
    resp = _token(http, fake, form, headers=_basic(secret="wrong"))
    _error(resp, 401, "invalid_client")
    assert resp.headers["www-authenticate"].startswith("Basic")
    _error(
        _token(http, fake, {**form, "client_id": CLIENT_ID, "client_secret": "wrong"}, headers={}),
        401,
        "invalid_client",
    )
    _error(_token(http, fake, form, headers=_basic("nobody", CLIENT_SECRET)), 401, "invalid_client")
    _error(_token(http, fake, form, headers={}), 401, "invalid_client")
    both = {**form, "client_secret": CLIENT_SECRET}
    _error(_token(http, fake, both), 400, "invalid_request")
    _error(_token(http, fake, {**form, "client_id": "other"}), 400, "invalid_request")
    # the code survived failed client authentication
    assert _exchange(http, fake, code).status_code == 200
    assert fake.token_count == {"authorization_code": 7}


def test_public_client(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    fake.register_client("cli-public", None, [REDIRECT])
    query = _redirect_query(_authorize(fake, http, client_id="cli-public"))
    form = {"grant_type": "authorization_code", "code": query["code"], "redirect_uri": REDIRECT}
    form |= {"code_verifier": "v" * 50, "client_id": "cli-public"}
    _error(_token(http, fake, {**form, "client_secret": "x"}, headers={}), 401, "invalid_client")
    resp = _token(http, fake, form, headers={})
    assert resp.status_code == 200, resp.text
    assert _verify(fake, resp.json()["id_token"], audience="cli-public")["aud"] == "cli-public"


def test_auth_methods_can_be_restricted(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    fake.auth_methods = ("client_secret_post",)
    assert http.get(fake.discovery_url).json()["token_endpoint_auth_methods_supported"] == ["client_secret_post"]
    _error(_exchange(http, fake, _code(fake, http)), 401, "invalid_client")


def test_grant_type_errors(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    _error(_token(http, fake, {"grant_type": "password", "username": "u"}), 400, "unsupported_grant_type")
    _error(_token(http, fake, {"grant_type": "client_credentials"}), 400, "unsupported_grant_type")
    _error(_token(http, fake, {}), 400, "invalid_request")
    resp = http.post(fake.token_endpoint, json={"grant_type": "refresh_token"}, headers=_basic())
    _error(resp, 400, "invalid_request")
    assert fake.token_count["password"] == 1
    assert fake.token_count["refresh_token"] == 0


# =============================================================================================
# Refresh
# =============================================================================================


def test_refresh_rotates(fake: FakeOidcIssuer, http: httpx.Client, clock: Clock) -> None:
    first = _exchange(http, fake, _code(fake, http)).json()
    auth_time = _verify(fake, first["id_token"])["auth_time"]
    fake.user = FakeUser(sub=DEFAULT_USER.sub, email=DEFAULT_USER.email, name="Alice", groups=["admins"])
    clock.now += 30
    resp = _token(http, fake, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]})
    assert resp.status_code == 200, resp.text
    assert resp.headers["cache-control"] == "no-store"
    second = resp.json()
    assert second["refresh_token"] != first["refresh_token"]
    assert second["access_token"] != first["access_token"]
    claims = _verify(fake, second["id_token"], leeway=60)  # the fake's clock runs 30 s ahead
    assert "nonce" not in claims
    assert claims["auth_time"] == auth_time
    assert claims["iat"] == int(clock.now)
    assert claims["groups"] == ["admins"]
    assert claims["name"] == "Alice"
    # the old refresh token died with its use, the new one works
    old = _token(http, fake, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]})
    _error(old, 400, "invalid_grant")
    third = _token(http, fake, {"grant_type": "refresh_token", "refresh_token": second["refresh_token"]})
    assert third.status_code == 200
    wider = _token(
        http,
        fake,
        {"grant_type": "refresh_token", "refresh_token": third.json()["refresh_token"], "scope": "openid groups"},
    )
    _error(wider, 400, "invalid_scope")
    assert fake.token_count == {"authorization_code": 1, "refresh_token": 4}
    assert fake.refresh_refused_count == 0


def test_refresh_of_another_client_is_refused(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    fake.register_client("other", "other-secret")
    first = _exchange(http, fake, _code(fake, http)).json()
    form = {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}
    _error(_token(http, fake, form, headers=_basic("other", "other-secret")), 400, "invalid_grant")


def test_refuse_refresh(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    first = _exchange(http, fake, _code(fake, http)).json()
    form = {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}
    fake.refuse_refresh = True
    assert _error(_token(http, fake, form), 400, "invalid_grant")
    _error(_token(http, fake, form), 400, "invalid_grant")
    assert fake.refresh_refused_count == 2
    fake.refuse_refresh = False  # an on/off switch: the token was not spent
    assert _token(http, fake, form).status_code == 200


def test_deprovisioned_user(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    first = _exchange(http, fake, _code(fake, http)).json()
    del fake.users[DEFAULT_USER.sub]
    _error(
        _token(http, fake, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}),
        400,
        "invalid_grant",
    )
    assert fake.refresh_refused_count == 1
    info = http.get(fake.userinfo_endpoint, headers={"Authorization": f"Bearer {first['access_token']}"})
    assert info.status_code == 401


def test_refresh_without_rotation_or_id_token(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    fake.rotate_refresh_tokens = False
    fake.id_token_on_refresh = False
    first = _exchange(http, fake, _code(fake, http)).json()
    form = {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}
    for _ in range(2):
        resp = _token(http, fake, form)
        assert resp.status_code == 200
        assert set(resp.json()) == {"access_token", "token_type", "expires_in", "scope"}


# =============================================================================================
# Userinfo, revocation, keys, overrides, records
# =============================================================================================


def test_userinfo_refusals(fake: FakeOidcIssuer, http: httpx.Client, clock: Clock) -> None:
    resp = http.get(fake.userinfo_endpoint)
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"] == 'Bearer realm="fake-oidc"'
    resp = http.get(fake.userinfo_endpoint, headers={"Authorization": "Bearer nope"})
    assert resp.status_code == 401
    assert 'error="invalid_token"' in resp.headers["www-authenticate"]
    token = _exchange(http, fake, _code(fake, http)).json()["access_token"]
    clock.now += 3600
    resp = http.get(fake.userinfo_endpoint, headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 401


def test_revoke(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    first = _exchange(http, fake, _code(fake, http)).json()
    resp = http.post(fake.revocation_endpoint, data={"token": "unknown"}, headers=_basic())
    assert resp.status_code == 200
    resp = http.post(
        fake.revocation_endpoint,
        data={"token": first["refresh_token"], "token_type_hint": "refresh_token"},
        headers=_basic(),
    )
    assert resp.status_code == 200
    _error(
        _token(http, fake, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}),
        400,
        "invalid_grant",
    )
    info = http.get(fake.userinfo_endpoint, headers={"Authorization": f"Bearer {first['access_token']}"})
    assert info.status_code == 401  # the grant's access token went along
    _error(http.post(fake.revocation_endpoint, data={"token": "x"}, headers=_basic(secret="no")), 401, "invalid_client")
    _error(http.post(fake.revocation_endpoint, data={}, headers=_basic()), 400, "invalid_request")


def test_rotate_key(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    old = fake.kid
    new = fake.rotate_key()
    assert fake.kid == new != old
    assert [k["kid"] for k in http.get(fake.jwks_uri).json()["keys"]] == [new, old]
    token = _exchange(http, fake, _code(fake, http)).json()["id_token"]
    assert jwt.get_unverified_header(token)["kid"] == new
    _verify(fake, token)
    _verify(fake, fake.sign({"iss": fake.issuer, "aud": CLIENT_ID, "sub": "x", "iat": 1, "exp": 2**40}, kid=old))


def test_id_token_claims_override(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    fake.id_token_claims = {"aud": "someone-else", "nonce": None, "extra": 1}
    token = _exchange(http, fake, _code(fake, http)).json()["id_token"]
    with pytest.raises(jwt.InvalidAudienceError):
        _verify(fake, token)
    claims = jwt.decode(token, options={"verify_signature": False})
    assert "nonce" not in claims and claims["extra"] == 1


def test_reset_forgets_records_not_tokens(fake: FakeOidcIssuer, http: httpx.Client) -> None:
    first = _exchange(http, fake, _code(fake, http)).json()
    assert fake.requests
    fake.reset()
    assert fake.requests == [] and fake.authorize_count == 0 and fake.token_count == {}
    resp = _token(http, fake, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]})
    assert resp.status_code == 200


def test_serve_mode() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.oidc",
            "--serve",
            "--client-id",
            "cli",
            "--client-secret",
            "cs",
            "--redirect-uri",
            REDIRECT,
            "--group",
            "g1",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().strip()
        assert base.startswith("http://127.0.0.1:")
        doc = httpx.get(f"{base}/.well-known/openid-configuration", timeout=10).json()
        assert doc["issuer"] == base
        resp = httpx.get(doc["authorization_endpoint"], params=_flow_params(client_id="cli"), timeout=10)
        assert resp.status_code == 302
        assert resp.headers["location"].startswith(REDIRECT + "?code=")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# =============================================================================================
# Authlib as the relying party
# =============================================================================================


@pytest.mark.parametrize("auth_method", ["client_secret_basic", "client_secret_post"])
def test_authlib_client_agrees(fake: FakeOidcIssuer, auth_method: str) -> None:
    httpx_client = pytest.importorskip("authlib.integrations.httpx_client", reason="authlib is not installed")
    from authlib.common.security import generate_token
    from authlib.oidc.core import CodeIDToken
    from joserfc import jwt as jose_jwt
    from joserfc.jwk import KeySet
    from joserfc.jws import JWSRegistry

    fake.user = FakeUser(sub="u-authlib", email="carol@example.com", name="Carol", groups=["ops"])

    async def run() -> None:
        async with httpx_client.AsyncOAuth2Client(
            client_id=CLIENT_ID,
            client_secret=CLIENT_SECRET,
            token_endpoint_auth_method=auth_method,
            revocation_endpoint_auth_method=auth_method,
            redirect_uri=REDIRECT,
            scope=SCOPE,
            code_challenge_method="S256",
        ) as client:
            metadata = (await client.request("GET", fake.discovery_url, withhold_token=True)).json()
            verifier, nonce = generate_token(64), generate_token(43)
            url, state = client.create_authorization_url(
                metadata["authorization_endpoint"], code_verifier=verifier, nonce=nonce
            )
            resp = await client.request("GET", url, withhold_token=True)
            assert resp.status_code == 302
            token = await client.fetch_token(
                metadata["token_endpoint"],
                authorization_response=resp.headers["location"],
                state=state,
                code_verifier=verifier,
            )
            jwks = (await client.request("GET", metadata["jwks_uri"], withhold_token=True)).json()
            key_set = KeySet.import_key_set(jwks)
            registry = JWSRegistry(algorithms=metadata["id_token_signing_alg_values_supported"])
            decoded = jose_jwt.decode(token["id_token"], key_set, registry=registry)
            claims = CodeIDToken(
                decoded.claims,
                decoded.header,
                {"iss": {"values": [metadata["issuer"]]}, "aud": {"values": [CLIENT_ID]}},
                {"nonce": nonce, "client_id": CLIENT_ID, "access_token": token["access_token"]},
            )
            claims.validate(leeway=120)  # iss, aud, exp, iat, nonce, at_hash
            assert claims["sub"] == "u-authlib"
            assert claims["groups"] == ["ops"]

            info = await client.get(metadata["userinfo_endpoint"])  # the fetched token as bearer
            assert info.status_code == 200
            assert info.json()["email"] == "carol@example.com"

            refreshed = await client.refresh_token(metadata["token_endpoint"], refresh_token=token["refresh_token"])
            assert refreshed["refresh_token"] != token["refresh_token"]
            assert jose_jwt.decode(refreshed["id_token"], key_set, registry=registry).claims["sub"] == "u-authlib"

            revoked = await client.revoke_token(
                metadata["revocation_endpoint"], token=refreshed["refresh_token"], token_type_hint="refresh_token"
            )
            assert revoked.status_code == 200

            fake.refuse_refresh = True
            with pytest.raises(httpx_client.OAuthError) as refused:
                await client.refresh_token(metadata["token_endpoint"], refresh_token=refreshed["refresh_token"])
            assert refused.value.error == "invalid_grant"

    asyncio.run(run())
    token_requests = [r for r in fake.requests if r.endpoint == "token"]
    assert all(r.client_id == CLIENT_ID for r in token_requests)
    if auth_method == "client_secret_basic":
        assert all(r.headers["authorization"].startswith("Basic ") for r in token_requests)
    else:
        assert all("client_secret" in r.params for r in token_requests)
    assert fake.token_count == {"authorization_code": 1, "refresh_token": 2}

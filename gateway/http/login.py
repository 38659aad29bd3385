"""Claude Code's ``/login`` over HTTP (issue 34; the Claude apps gateway protocol, ``docs/single-sign-on.md``).

The OAuth endpoints answer in OAuth's shape (``{"error", "error_description"}``, RFC 6749 §5.2 and RFC 8628 §3.5,
``cache-control: no-store``); the routes a signed-in CLI calls with its bearer (managed settings, telemetry) are in
``gateway/http/managed.py``; the admin's sessions routes here answer in Anthropic's envelope. The logic lives in
``gateway.governance.signin`` (the device flow) and ``gateway.governance.sessions`` (the bearers); this module is
the HTTP shape, the verification page and its CSRF guard.

The verification page (``GET /device``) is the gateway's own HTML: no script at all, the shared stylesheet, a CSP
that allows nothing else (``form-action`` names only this origin and the IdP's, where the form's redirect goes),
never framed. It shows the code from the link but never submits it by itself: the person presses Continue (or
Deny). The POST is guarded twice: the form's hidden ``csrf`` must equal the ``mgw_csrf`` cookie the page set
(``SameSite=Strict``, so another site's form cannot send it), and a browser's ``Origin`` (or ``Sec-Fetch-Site``)
must say this origin. Continue binds the flow to a second cookie (``mgw_login``, only its digest stored), which the
IdP's callback must bring back: a callback opened in another browser approves nothing.
"""

from __future__ import annotations

import hmac
import html
import json
import secrets
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from litestar import Request, Response, delete, get, post, route

from gateway.governance.audit import audit
from gateway.governance.keys import authenticate
from gateway.governance.spend_limit_store import AuditEvent, new_id
from gateway.governance.store import StoreError
from gateway.http.routes import error_response
from gateway.settings import LoginSettings
from gateway.wire.errors import (
    AuthenticationError,
    GatewayError,
    NotFound,
    RequestTooLarge,
    StoreUnavailable,
    new_request_id,
)

if TYPE_CHECKING:
    from gateway.core import Gateway
    from gateway.governance.signin import OAuthError, SignIn

__all__ = ["LOGIN_HANDLERS"]

_MAX_FORM = 8 * 1024
_NO_STORE = {"cache-control": "no-store", "pragma": "no-cache"}
_CSRF_COOKIE = "mgw_csrf"
_FLOW_COOKIE = "mgw_login"
_DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def _gateway(request: Request[Any, Any, Any]) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def _signin(request: Request[Any, Any, Any]) -> tuple[Gateway, SignIn]:
    gw = _gateway(request)
    signin = gw.signin
    if signin is None:
        raise NotFound(f"no route for {request.method} {request.url.path} (sign-in is off: no `login` in the config)")
    return gw, signin


def _oauth_json(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(
        json.dumps(body).encode(),
        status_code=status,
        media_type="application/json",
        headers={**_NO_STORE, **(headers or {})},
    )


def _oauth_error(exc: OAuthError) -> Response[bytes]:
    body = {"error": exc.error}
    if exc.description:
        body["error_description"] = exc.description
    headers = {"retry-after": "60"} if exc.status == 429 else None
    return _oauth_json(body, exc.status, headers)


async def _form(request: Request[Any, Any, Any]) -> dict[str, str]:
    """A form-encoded body (a JSON object of strings too), at most ``_MAX_FORM`` bytes; the first of a repeated
    field; unknown fields kept (and ignored by the callers)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > _MAX_FORM:
        raise RequestTooLarge(f"at most {_MAX_FORM} bytes")
    body = await request.body()
    if len(body) > _MAX_FORM:
        raise RequestTooLarge(f"at most {_MAX_FORM} bytes")
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            value = json.loads(body or b"{}")
        except ValueError:
            value = None
        if not isinstance(value, dict):
            return {}
        return {str(k): v for k, v in value.items() if isinstance(v, str)}
    fields: dict[str, str] = {}
    for name, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
        fields.setdefault(name, value)
    return fields


def _address(request: Request[Any, Any, Any]) -> str:
    client = request.client
    return client.host if client is not None else ""


# --- discovery, device authorization, token, revocation (RFC 8414, 8628, 6749, 7009) ---


@get("/.well-known/oauth-authorization-server")
async def discovery(request: Request[Any, Any, Any]) -> Response[bytes]:
    try:
        _, signin = _signin(request)
    except GatewayError as exc:
        return error_response(exc, new_request_id())
    base = signin.settings.public_url
    return _oauth_json(
        {
            "issuer": base,
            "device_authorization_endpoint": f"{base}/oauth/device_authorization",
            "token_endpoint": f"{base}/oauth/token",
            "revocation_endpoint": f"{base}/oauth/revoke",
            "grant_types_supported": [_DEVICE_GRANT, "refresh_token"],
            "token_endpoint_auth_methods_supported": ["none"],
            "revocation_endpoint_auth_methods_supported": ["none"],
            "response_types_supported": [],
            "gateway_protocol_version": 1,
        }
    )


@post("/oauth/device_authorization", status_code=200)
async def device_authorization(request: Request[Any, Any, Any]) -> Response[bytes]:
    from gateway.governance.signin import OAuthError

    try:
        _, signin = _signin(request)
        form = await _form(request)
        answer = await signin.start(form.get("surface", "") or "unknown", _address(request))
    except OAuthError as exc:
        return _oauth_error(exc)
    except GatewayError as exc:
        return error_response(exc, new_request_id())
    return _oauth_json(answer)


@post("/oauth/token", status_code=200)
async def token(request: Request[Any, Any, Any]) -> Response[bytes]:
    from gateway.governance.signin import OAuthError

    try:
        _, signin = _signin(request)
        form = await _form(request)
        answer = await signin.token(form)
    except OAuthError as exc:
        return _oauth_error(exc)
    except StoreError as exc:
        return _oauth_error(OAuthError(503, "temporarily_unavailable", f"the sign-in store: {exc}"))
    except GatewayError as exc:
        return error_response(exc, new_request_id())
    return _oauth_json(answer)


@post("/oauth/revoke", status_code=200)
async def revoke(request: Request[Any, Any, Any]) -> Response[bytes]:
    """RFC 7009: 200 whatever the token was (an unknown one included); a session's refresh token or bearer
    revokes the session."""
    from gateway.governance.signin import OAuthError

    try:
        _, signin = _signin(request)
        form = await _form(request)
        if form.get("token"):
            await signin.revoke_token(form["token"])
    except OAuthError as exc:
        return _oauth_error(exc)
    except StoreError as exc:
        return _oauth_error(OAuthError(503, "temporarily_unavailable", f"the sign-in store: {exc}"))
    except GatewayError as exc:
        return error_response(exc, new_request_id())
    return _oauth_json({})


# --- the verification page and the IdP's callback ---

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · messages-gateway</title><link rel="stylesheet" href="/ui/style.css"></head>
<body><main class="signin"><h1>{title}</h1>{body}</main></body></html>
"""


def _page(login: LoginSettings, title: str, body: str, status: int = 200, cookie: str | None = None) -> Response[bytes]:
    idp = urlsplit(login.oidc.issuer)
    headers = {
        "content-security-policy": (
            "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; frame-ancestors 'none'; "
            f"form-action 'self' {idp.scheme}://{idp.netloc}"
        ),
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
        **_NO_STORE,
    }
    if cookie is not None:
        headers["set-cookie"] = cookie
    return Response(
        _PAGE.format(title=html.escape(title), body=body).encode(),
        status_code=status,
        media_type="text/html",
        headers=headers,
    )


def _cookie(login: LoginSettings, name: str, value: str, max_age: int) -> str:
    secure = "; Secure" if login.public_url.startswith("https://") else ""
    return f"{name}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}"


def _csrf_cookie(login: LoginSettings, value: str) -> str:
    secure = "; Secure" if login.public_url.startswith("https://") else ""
    return f"{_CSRF_COOKIE}={value}; Path=/device; Max-Age=900; HttpOnly; SameSite=Strict{secure}"


def _code_form(csrf: str, user_code: str, note: str = "") -> str:
    note_html = f'<p class="notice">{html.escape(note)}</p>' if note else ""
    return (
        f"{note_html}<p>Check that this code is the one Claude Code shows, then continue to sign in with your "
        "organization's account.</p>"
        '<form method="post" action="/device">'
        f'<input type="hidden" name="csrf" value="{html.escape(csrf)}">'
        '<label for="user_code">Code</label> '
        f'<input id="user_code" name="user_code" value="{html.escape(user_code)}" autocomplete="off" '
        'spellcheck="false" maxlength="12" required> '
        '<button type="submit" name="action" value="continue">Continue</button> '
        '<button type="submit" name="action" value="deny">Deny</button>'
        "</form>"
    )


@route("/device", http_method=["GET", "POST"])
async def device_page(request: Request[Any, Any, Any]) -> Response[bytes]:
    from gateway.governance.signin import OAuthError, format_user_code

    try:
        _, signin = _signin(request)
    except GatewayError as exc:
        return error_response(exc, new_request_id())
    login = signin.settings
    if request.method == "GET":
        csrf = secrets.token_urlsafe(32)
        shown = format_user_code(request.query_params.get("user_code", "")) or ""
        return _page(login, "Sign in to Claude Code", _code_form(csrf, shown), cookie=_csrf_cookie(login, csrf))
    try:
        form = await _form(request)
    except GatewayError as exc:
        return error_response(exc, new_request_id())
    sent = request.cookies.get(_CSRF_COOKIE, "")
    given = form.get("csrf", "")
    origin = request.headers.get("origin")
    site = request.headers.get("sec-fetch-site")
    ours = urlsplit(login.public_url)
    same_origin = (origin is None or origin == f"{ours.scheme}://{ours.netloc}") and site in (
        None,
        "same-origin",
        "none",
    )
    if not sent or not hmac.compare_digest(sent, given) or not same_origin:
        audit("device.verify", outcome="csrf_rejected", ip=_address(request))
        body = "<p>This form expired or did not come from this page. Open the link Claude Code showed again.</p>"
        return _page(login, "Sign-in refused", body, 403)
    raw_code = form.get("user_code", "")
    try:
        device = await signin.pending(raw_code)
    except OAuthError as exc:
        return _page(login, "Sign-in unavailable", f"<p>{html.escape(exc.description)}</p>", exc.status)
    if device is None:
        audit("device.verify", outcome="unknown_code", ip=_address(request))
        csrf = secrets.token_urlsafe(32)
        body = _code_form(csrf, format_user_code(raw_code) or "", "That code is unknown or has expired.")
        return _page(login, "Sign in to Claude Code", body, 400, cookie=_csrf_cookie(login, csrf))
    if form.get("action") == "deny":
        await signin.deny(device)
        body = "<p>The sign-in was denied. Claude Code will say so; you can close this page.</p>"
        return _page(login, "Sign-in denied", body)
    browser = secrets.token_urlsafe(32)
    try:
        url = await signin.begin(device, browser)
    except OAuthError as exc:
        return _page(login, "Sign-in unavailable", f"<p>{html.escape(exc.description)}</p>", exc.status)
    return Response(
        b"",
        status_code=303,
        headers={"location": url, "set-cookie": _cookie(login, _FLOW_COOKIE, browser, 900), **_NO_STORE},
    )


@get("/oauth/callback")
async def callback(request: Request[Any, Any, Any]) -> Response[bytes]:
    from gateway.governance.signin import OAuthError

    try:
        _, signin = _signin(request)
    except GatewayError as exc:
        return error_response(exc, new_request_id())
    login = signin.settings
    query = request.query_params
    try:
        user = await signin.callback(
            state=query.get("state", ""),
            code=query.get("code"),
            error=query.get("error"),
            browser=request.cookies.get(_FLOW_COOKIE, ""),
        )
    except OAuthError as exc:
        return _page(login, "Sign-in failed", f"<p>{html.escape(exc.description)}</p>", exc.status)
    if user is None:
        return _page(login, "Sign-in denied", "<p>Your identity provider did not approve the sign-in.</p>")
    who = html.escape(user.email or user.name or user.subject)
    body = f"<p>You are signed in as <strong>{who}</strong>. Return to Claude Code.</p>"
    return _page(login, "Signed in", body, cookie=_cookie(login, _FLOW_COOKIE, "", 0))


# --- sessions, for an admin key ---


def _admin(request: Request[Any, Any, Any], *, write: bool) -> tuple[Gateway, str]:
    """The gateway and the admin key's name (the audit's actor); the refusal otherwise."""
    gw = _gateway(request)
    runtime = gw.runtime
    if not runtime.admin_keys:
        raise AuthenticationError(f"{request.url.path} needs admin.keys, and an admin key on the request")
    try:
        _, admin = authenticate(runtime.admin_keys, request.headers)
    except AuthenticationError:
        audit("admin.denied", path=request.url.path, write=write, reason="not_an_admin_key")
        raise AuthenticationError(f"{request.url.path} needs an admin key (admin.keys)") from None
    if gw.identity.sessions is None or runtime.settings.login is None:
        raise NotFound("sign-in is off: no `login` in the config")
    return gw, admin.name if admin is not None else "admin"


def _session_object(session: Any) -> dict[str, Any]:
    from datetime import UTC, datetime

    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    return {
        "type": "session",
        "id": session.id,
        "subject": session.subject,
        "email": session.email or None,
        "name": session.name or None,
        "groups": session.groups,
        "surface": session.surface,
        "created_at": iso(session.created_ms),
        "refreshed_at": iso(session.refreshed_ms),
        "ends_at": iso(session.ends_ms),
    }


@get("/v1/gateway/sessions")
async def list_sessions(request: Request[Any, Any, Any]) -> Response[bytes]:
    rid = new_request_id()
    try:
        gw, _ = _admin(request, write=False)
        store = await gw.signin_store()
        found = await store.sessions(subject=request.query_params.get("subject"))
    except StoreError as exc:
        return error_response(StoreUnavailable(f"the sign-in store cannot be read: {exc}"), rid)
    except GatewayError as exc:
        return error_response(exc, rid)
    data = [_session_object(s) for s in found]
    body = {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None}
    body["last_id"] = data[-1]["id"] if data else None
    return Response(json.dumps(body).encode(), media_type="application/json", headers={"request-id": rid})


@delete("/v1/gateway/sessions/{session_id:str}", status_code=200)
async def revoke_session(request: Request[Any, Any, Any], session_id: str) -> Response[bytes]:
    """Revoke a session: its bearer is refused on every replica within ``sessions.POLL_S`` plus a query, and its
    refresh token at once."""
    rid = new_request_id()
    try:
        gw, admin = _admin(request, write=True)
        sessions = gw.identity.sessions
        assert sessions is not None
        store = await gw.signin_store()
        session = await store.session(session_id)
        if session is None:
            raise NotFound(f"no session {session_id!r}")
        signin = gw.signin
        await sessions.revoke(session_id, "admin", by=admin, oidc=signin.oidc if signin is not None else None)
        if gw.spend_limits is not None:  # the admin changes' audit in the store (…/spend_limits/audit)
            now_ms = int(time.time() * 1000)
            detail = json.dumps({"subject": session.subject, "email": session.email})
            event = AuditEvent(
                id=new_id("aud_", now_ms),
                at_ms=now_ms,
                actor=admin,
                action="admin.session.revoke",
                target=session_id,
                detail=detail,
            )
            await (await gw.spend_limits.store()).record(event)
    except StoreError as exc:
        return error_response(StoreUnavailable(f"the sign-in store cannot be written: {exc}"), rid)
    except GatewayError as exc:
        return error_response(exc, rid)
    body = {"type": "session_revoked", "id": session_id}
    return Response(json.dumps(body).encode(), media_type="application/json", headers={"request-id": rid})


LOGIN_HANDLERS = [
    discovery,
    device_authorization,
    token,
    revoke,
    device_page,
    callback,
    list_sessions,
    revoke_session,
]

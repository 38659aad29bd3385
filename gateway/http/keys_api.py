"""``/v1/gateway/keys``: keys issued at run time, for an admin key (``admin.keys``).

``POST`` makes one (``name``, and optionally ``team``, ``user``, ``models``, ``limits``, ``expires_at``) and
answers ``201`` with its secret — the only time it is shown; ``GET`` lists them without secrets, by id (``limit``,
``after_id``: the Admin API's list shape); ``DELETE /v1/gateway/keys/{id}`` revokes one (every replica refuses it
within ``gateway.governance.identity.POLL_S`` plus a query): the key's ``id``, as the Admin API's paths take it, or
its name (unique among the stored keys, and never of an id's shape), which scripts that revoked by name still send.
The objects follow the Admin API's API key object (``type: api_key``; ``id``, immutable, ``apikey_…``: what the
limits, the ledger and the reports' ``api_key_id`` know the key by; ``name``, a label; ``partial_key_hint``,
``status``, ``created_at``) with the gateway's attribution and limits beside. The logic lives in
``gateway.governance.identity``; this module is the HTTP shape only.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, delete, route

from gateway.governance.identity import IssuedKeys, KeyRequest
from gateway.governance.keys import is_admin
from gateway.governance.store import IssuedKey
from gateway.http.routes import error_response
from gateway.wire.errors import (
    AuthenticationError,
    GatewayError,
    InvalidRequest,
    NotFound,
    RequestTooLarge,
    new_request_id,
)

if TYPE_CHECKING:
    from gateway.core import Gateway

__all__ = ["KEY_HANDLERS"]

_encode = msgspec.json.Encoder().encode
_JSON = "application/json"
_MAX_BODY = 64 * 1024


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def key_object(record: IssuedKey, now_ms: int, secret: str | None = None) -> dict[str, Any]:
    expired = record.expires_ms is not None and record.expires_ms <= now_ms
    out: dict[str, Any] = {
        "type": "api_key",
        "id": record.id,
        "name": record.name,
        "partial_key_hint": record.hint,
        "status": "expired" if expired else "active",
        "team": record.team or None,
        "user": record.user or None,
        "models": record.models,
        "limits": record.limits,
        "created_at": _iso(record.created_ms),
        "expires_at": _iso(record.expires_ms),
    }
    if secret is not None:
        out["key"] = secret
    return out


def _issued(request: Request[Any, Any, Any]) -> tuple[Gateway, IssuedKeys]:
    """The gateway and its issued keys, for an admin key; the refusal otherwise."""
    gw: Gateway = request.app.state.gateway
    runtime = gw.runtime
    if not runtime.admin_keys:
        raise AuthenticationError("issuing keys needs admin.keys, and an admin key on the request")
    if not is_admin(runtime.admin_keys, request.headers):
        raise AuthenticationError("/v1/gateway/keys needs an admin key (admin.keys)")
    if gw.identity.issued is None:
        raise InvalidRequest("keys issued at run time live in the store, and it is off (store.enabled: false)")
    if runtime.settings.auth.open:
        raise InvalidRequest("this gateway is open (auth.open: true): no key it issued would be checked")
    return gw, gw.identity.issued


def _json(body: Any, rid: str, status: int = 200) -> Response[bytes]:
    return Response(_encode(body), status_code=status, media_type=_JSON, headers={"request-id": rid})


@route("/v1/gateway/keys", http_method=["GET", "POST"])
async def keys(request: Request[Any, Any, Any]) -> Response[bytes]:
    """One handler for the collection's two methods (so ``OPTIONS`` and a 405's ``allow`` name both)."""
    return await (issue_key(request) if request.method == "POST" else list_keys(request))


async def issue_key(request: Request[Any, Any, Any]) -> Response[bytes]:
    rid = new_request_id()
    try:
        gw, issued = _issued(request)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > _MAX_BODY:
            raise RequestTooLarge(f"a key request is at most {_MAX_BODY} bytes")
        body = await request.body()
        if len(body) > _MAX_BODY:
            raise RequestTooLarge(f"a key request is at most {_MAX_BODY} bytes")
        try:
            wanted = msgspec.json.decode(body, type=KeyRequest)
        except msgspec.ValidationError as exc:
            raise InvalidRequest(f"invalid key request: {exc}") from None
        except msgspec.DecodeError:
            raise InvalidRequest("the body is not a JSON object") from None
        taken = {key.name for key in gw.runtime.keys}
        secret, record = await issued.issue(wanted, gw.runtime.settings, taken)
    except GatewayError as exc:
        return error_response(exc, rid)
    return _json(key_object(record, int(time.time() * 1000), secret), rid, 201)


async def list_keys(request: Request[Any, Any, Any]) -> Response[bytes]:
    rid = new_request_id()
    try:
        _, issued = _issued(request)
        params = request.query_params
        try:
            limit = int(params.get("limit", "100"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit: an integer from 1 to 1000")
        records = await issued.listed()
    except GatewayError as exc:
        return error_response(exc, rid)
    after = params.get("after_id")
    if after is not None:
        records = [r for r in records if r.id > after]  # listed by id (so by issue time: ids begin with it)
    now_ms = int(time.time() * 1000)
    page = [key_object(r, now_ms) for r in records[:limit]]
    body = {
        "data": page,
        "has_more": len(records) > limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }
    return _json(body, rid)


@delete("/v1/gateway/keys/{key_id:str}", status_code=200)
async def revoke_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    """``key_id``: the key's id, or its name."""
    rid = new_request_id()
    try:
        gw, issued = _issued(request)
        if any(key.id == key_id for key in gw.runtime.keys):
            raise InvalidRequest(f"{key_id!r} is a key of the config file: remove it there")
        revoked = await issued.revoke(key_id)
        if revoked is None:
            raise NotFound(f"no issued key has the id or the name {key_id!r}")
    except GatewayError as exc:
        return error_response(exc, rid)
    return _json({"type": "api_key_deleted", "id": revoked.id, "name": revoked.name}, rid)


KEY_HANDLERS = [keys, revoke_key]

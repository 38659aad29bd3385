"""The Messages API's other routes, in its own shapes, as Litestar handlers (``POST /v1/messages`` and
``/v1/messages/count_tokens`` are the plain ASGI edge in ``gateway/http/messages.py``). No stream logic lives here."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get
from litestar.exceptions import HTTPException

import surfaces
from gateway.governance.keys import is_admin, key_headers, may_use
from gateway.governance.store import StoreError
from gateway.observability.metrics import CONTENT_TYPE
from gateway.routing.table import Route
from gateway.wire.errors import (
    AuthenticationError,
    GatewayError,
    InvalidRequest,
    NotFound,
    error_type_for_status,
    new_request_id,
)

if TYPE_CHECKING:
    from gateway.core import Gateway

__all__ = ["HANDLERS", "error_response", "exception_handlers"]

log = logging.getLogger("gateway")
_encode = msgspec.json.Encoder().encode
_JSON = "application/json"


def _gateway(request: Request[Any, Any, Any]) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def error_response(exc: GatewayError, request_id: str) -> Response[bytes]:
    """``exc`` in the Anthropic envelope with its status and ``GatewayError.response_headers``."""
    headers = exc.response_headers(request_id)
    return Response(exc.render(request_id), status_code=exc.status_code, media_type=_JSON, headers=headers)


def _model_info(route: Route, model_id: str | None = None) -> dict[str, Any]:
    model = model_id or route.alias
    return {
        "type": "model",
        "id": model,
        "display_name": route.display_name if model_id is None else model,
        "description": route.description or f"{route.display_name}, served by messages-gateway",
        "created_at": "2025-01-01T00:00:00Z",
    }


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
    gw = _gateway(request)
    runtime = gw.runtime
    rid = new_request_id()
    try:
        _, key = await gw.identity.authenticate(runtime, request.headers)
    except GatewayError as exc:
        return error_response(exc, rid)
    params = request.query_params
    data = [_model_info(route) for route in runtime.routes.aliases() if may_use(key, route, route.alias)]
    ids = [m["id"] for m in data]
    if params.get("after_id") in ids:
        data = data[ids.index(params["after_id"]) + 1 :]
    elif params.get("before_id") in ids:
        data = data[: ids.index(params["before_id"])]
    try:
        limit = int(params.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 1000:
        return error_response(InvalidRequest("limit: must be an integer from 1 to 1000"), rid)
    page, has_more = data[:limit], len(data) > limit
    body = {
        "data": page,
        "has_more": has_more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }
    return Response(_encode(body), media_type=_JSON, headers={"request-id": rid})


@get("/v1/models/{model_id:path}")
async def get_model(request: Request[Any, Any, Any], model_id: str) -> Response[bytes]:
    gw = _gateway(request)
    runtime = gw.runtime
    rid = new_request_id()
    model_id = model_id.lstrip("/")
    try:
        _, key = await gw.identity.authenticate(runtime, request.headers)
        route = runtime.routes.resolve(model_id)
        if not may_use(key, route, model_id):  # as if it did not exist: the key cannot list it either
            raise NotFound(f"model {model_id!r} is not served by this gateway (see GET /v1/models)")
    except GatewayError as exc:
        return error_response(exc, rid)
    info = _model_info(route, None if model_id == route.alias else model_id)
    return Response(_encode(info), media_type=_JSON, headers={"request-id": rid})


@get("/inference-profiles")
async def inference_profiles(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Bedrock's ``ListInferenceProfiles`` over the aliases a key may use (an ``APPLICATION`` list is empty).
    Claude Code's Bedrock mode asks for ``?type=SYSTEM_DEFINED`` at start-up through the AWS SDK, which sends no
    key when AWS auth is skipped: a request without any key gets an empty list (not a 401, and not the
    aliases); a wrong key is a 401."""
    gw = _gateway(request)
    runtime = gw.runtime
    rid = new_request_id()
    anonymous = not runtime.settings.auth.open and not key_headers(request.headers)
    try:
        key = None if anonymous else (await gw.identity.authenticate(runtime, request.headers))[1]
    except GatewayError as exc:
        return error_response(exc, rid)
    kind = request.query_params.get("type", "SYSTEM_DEFINED")
    listed = kind == "SYSTEM_DEFINED" and not anonymous
    routes = [r for r in runtime.routes.aliases() if may_use(key, r, r.alias)] if listed else []
    body = surfaces.inference_profiles([(r.alias, r.display_name) for r in routes], "us-east-1")
    return Response(_encode(body), media_type=_JSON, headers={"request-id": rid, "x-amzn-requestid": rid})


@get("/healthz")
async def healthz() -> Response[bytes]:
    return Response(b'{"status":"ok"}', media_type=_JSON)


@get("/readyz")
async def readyz(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Readiness: 503 while draining, or while the store (the ledger, issued keys, sign-in's sessions) cannot be
    opened within a second; 200 otherwise. ``/healthz`` stays liveness only."""
    gw = _gateway(request)
    problem = "draining" if gw.draining else ""
    if not problem and gw.ledger is not None:
        try:
            await asyncio.wait_for(gw.ledger.ready(), 1.0)
        except (TimeoutError, StoreError) as exc:
            problem = f"the store cannot be opened: {exc or 'timed out'}"
    if problem:
        return Response(
            json.dumps({"status": "unavailable", "reason": problem}).encode(), status_code=503, media_type=_JSON
        )
    return Response(b'{"status":"ready"}', media_type=_JSON)


@get("/metrics")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus text; with ``admin.keys``, only for an admin key."""
    gw = _gateway(request)
    if gw.admin_keys and not is_admin(gw.admin_keys, request.headers):
        return error_response(AuthenticationError("GET /metrics needs an admin key (admin.keys)"), new_request_id())
    return Response(gw.metrics.render(), media_type=CONTENT_TYPE)


def _http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    message = exc.detail if status != 404 else f"no route for {request.method} {request.url.path}"
    if status == 404:
        error: GatewayError = NotFound(message)
    else:
        error = GatewayError(message, headers=exc.headers)  # a 405 keeps its `allow` (RFC 9110)
        error.status_code, error.error_type = status, error_type_for_status(status)
    return error_response(error, new_request_id())


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    rid = new_request_id()
    log.exception("unhandled error on %s %s (request %s)", request.method, request.url.path, rid)
    return error_response(GatewayError("internal gateway error"), rid)


HANDLERS = [readyz, list_models, get_model, healthz, metrics, inference_profiles]
exception_handlers: dict[int | type[Exception], Any] = {HTTPException: _http_exception, Exception: _unexpected}

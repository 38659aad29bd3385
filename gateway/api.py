"""The HTTP edge: the Messages API's own routes, in its own shapes. No stream logic lives here."""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.response import Stream

from gateway import pipeline
from gateway.errors import (
    AuthenticationError,
    GatewayError,
    NotFound,
    RequestTooLarge,
    envelope,
    error_type_for_status,
    new_request_id,
)
from gateway.metrics import CONTENT_TYPE
from gateway.request import ProxyRequest, parse_count_tokens, parse_messages
from gateway.routing import Route
from gateway.usage import Outcome, UsageTally

if TYPE_CHECKING:
    from gateway.app import Gateway

__all__ = ["HANDLERS", "exception_handlers"]

log = logging.getLogger("gateway")
_encode = msgspec.json.Encoder().encode
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_JSON = "application/json"
_CLIENT_KEY_HEADERS = ("x-api-key", "authorization")


def _gateway(request: Request[Any, Any, Any]) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def _error_response(exc: GatewayError, request_id: str) -> Response[bytes]:
    headers = dict(exc.headers)
    headers.setdefault("request-id", request_id)
    return Response(exc.render(request_id), status_code=exc.status_code, media_type=_JSON, headers=headers)


def _authenticate(gw: Gateway, request: Request[Any, Any, Any]) -> dict[str, str]:
    """Check the client's key (``x-api-key`` or ``Authorization: Bearer``); return the key headers sent."""
    headers = request.headers
    sent = {name: headers[name] for name in _CLIENT_KEY_HEADERS if name in headers}
    if not gw.keys:
        return sent
    candidates = [sent.get("x-api-key", "").encode()]
    auth = sent.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        candidates.append(auth[7:].strip().encode())
    if not any(candidates):
        raise AuthenticationError("missing API key: send it as x-api-key or Authorization: Bearer")
    ok = False
    for key in gw.keys:  # every comparison runs, in constant time each
        for candidate in candidates:
            ok |= hmac.compare_digest(key, candidate)
    if not ok:
        raise AuthenticationError("invalid API key")
    return sent


async def _read_body(gw: Gateway, request: Request[Any, Any, Any]) -> bytes:
    limit = gw.settings.server.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _proxy_request(
    request: Request[Any, Any, Any], body: bytes, model: str, stream: bool, client_auth: dict[str, str], rid: str
) -> ProxyRequest:
    headers = request.headers
    return ProxyRequest(
        body=body,
        model=model,
        stream=stream,
        request_id=rid,
        anthropic_version=headers.get("anthropic-version"),
        anthropic_beta=headers.get("anthropic-beta"),
        client_auth=client_auth,
        beta=request.query_params.get("beta") == "true",
    )


@post("/v1/messages", status_code=200)
async def create_message(request: Request[Any, Any, Any]) -> Response[Any]:
    gw = _gateway(request)
    rid = new_request_id()
    tally = UsageTally(gw.metrics, alias="")
    route: Route | None = None
    try:
        client_auth = _authenticate(gw, request)
        body = await _read_body(gw, request)
        head = parse_messages(body)
        route = gw.routes.resolve(head.model)
    except GatewayError as exc:
        tally.record(Outcome.REJECTED)
        return _error_response(exc, rid)
    tally.alias = route.alias
    proxied = _proxy_request(request, body, head.model, bool(head.stream), client_auth, rid)
    tally.begin()
    try:
        if not head.stream:
            reply = await pipeline.complete(route, proxied, gw.metrics, tally)
            headers = {"request-id": rid, **reply.headers, "x-gateway-provider": tally.provider}
            return Response(reply.body, status_code=reply.status, media_type=_JSON, headers=headers)
        opened = await pipeline.open_stream(route, proxied, gw.metrics, tally)
    except GatewayError as exc:
        tally.record(Outcome.TIMEOUT if exc.error_type == "timeout_error" else Outcome.UPSTREAM_ERROR)
        return _error_response(exc, rid)
    except BaseException:
        tally.record(Outcome.CLIENT_CANCELLED)
        raise
    headers = {"request-id": rid, **_SSE_HEADERS, **opened.stream.headers, "x-gateway-provider": tally.provider}
    return Stream(
        pipeline.stream_body(opened, gw.metrics, tally),
        media_type="text/event-stream",
        headers=headers,
    )


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(request: Request[Any, Any, Any]) -> Response[bytes]:
    gw = _gateway(request)
    rid = new_request_id()
    try:
        client_auth = _authenticate(gw, request)
        body = await _read_body(gw, request)
        head = parse_count_tokens(body)
        route = gw.routes.resolve(head.model)
        proxied = _proxy_request(request, body, head.model, False, client_auth, rid)
        tally = UsageTally(gw.metrics, alias=route.alias)
        reply = await pipeline.count_tokens(route, proxied, gw.metrics, tally)
    except GatewayError as exc:
        return _error_response(exc, rid)
    return Response(
        reply.body, status_code=reply.status, media_type=_JSON, headers={"request-id": rid, **reply.headers}
    )


def _model_info(route: Route, model_id: str | None = None) -> dict[str, Any]:
    model = model_id or route.alias
    return {
        "type": "model",
        "id": model,
        "display_name": route.display_name if model_id is None else model,
        "created_at": "2025-01-01T00:00:00Z",
    }


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
    gw = _gateway(request)
    rid = new_request_id()
    try:
        _authenticate(gw, request)
    except GatewayError as exc:
        return _error_response(exc, rid)
    params = request.query_params
    data = [_model_info(route) for route in gw.routes.aliases()]
    ids = [m["id"] for m in data]
    if params.get("after_id") in ids:
        data = data[ids.index(params["after_id"]) + 1 :]
    elif params.get("before_id") in ids:
        data = data[: ids.index(params["before_id"])]
    try:
        limit = max(1, min(1000, int(params.get("limit", "20"))))
    except ValueError:
        return _error_response(GatewayError("limit must be an integer"), rid)
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
    rid = new_request_id()
    model_id = model_id.lstrip("/")
    try:
        _authenticate(gw, request)
        route = gw.routes.resolve(model_id)
    except GatewayError as exc:
        return _error_response(exc, rid)
    info = _model_info(route, None if model_id == route.alias else model_id)
    return Response(_encode(info), media_type=_JSON, headers={"request-id": rid})


@get("/healthz")
async def healthz() -> Response[bytes]:
    return Response(b'{"status":"ok"}', media_type=_JSON)


@get("/metrics")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    return Response(_gateway(request).metrics.render(), media_type=CONTENT_TYPE)


def _http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    message = exc.detail if status != 404 else f"no route for {request.method} {request.url.path}"
    if status == 404:
        error: GatewayError = NotFound(message)
    else:
        error = GatewayError(message)
        error.status_code, error.error_type = status, error_type_for_status(status)
    return _error_response(error, new_request_id())


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    rid = new_request_id()
    return Response(
        envelope("api_error", "internal gateway error", rid),
        status_code=500,
        media_type=_JSON,
        headers={"request-id": rid},
    )


HANDLERS = [create_message, count_tokens, list_models, get_model, healthz, metrics]
exception_handlers: dict[int | type[Exception], Any] = {HTTPException: _http_exception, Exception: _unexpected}

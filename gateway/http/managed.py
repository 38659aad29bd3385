"""What a signed-in Claude Code asks with its bearer besides the Messages API (issue 34): its managed settings
(``GET /managed/settings``) and its telemetry (``POST /v1/metrics``, ``/v1/logs``, ``/v1/traces``), in Anthropic's
error envelope as every API route. The policies are ``managed.policies`` (the first whose groups match the user's
wins, ``gateway.governance.sessions.policy_for``); the relay is ``gateway.observability.otlp_relay``."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import TYPE_CHECKING, Any

from litestar import Request, Response, get, post

from gateway.governance.audit import audit
from gateway.governance.keys import ClientKey
from gateway.governance.sessions import policy_for
from gateway.http.routes import error_response
from gateway.observability.otlp_relay import Signal
from gateway.settings import Settings
from gateway.wire.errors import AuthenticationError, GatewayError, NotFound, RequestTooLarge, new_request_id

if TYPE_CHECKING:
    from gateway.core import Gateway

__all__ = ["MANAGED_HANDLERS", "managed_env", "settings_checksum"]


def _gateway(request: Request[Any, Any, Any]) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def settings_checksum(settings: dict[str, Any]) -> str:
    """``sha256:`` and the hex SHA-256 of the settings as JSON with keys sorted at every level, no whitespace
    (and characters as they are, as JavaScript's ``JSON.stringify`` writes them)."""
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def managed_env(settings: Settings) -> dict[str, str]:
    """What the protocol adds to a policy's ``env`` when the CLI's telemetry is relayed: the OTLP exporter
    pointed at this gateway (which relays it to ``telemetry.forward_to``)."""
    login = settings.login
    targets = settings.telemetry.forward_to
    if login is None or not targets:
        return {}
    signals = {signal for target in targets for signal in target.signals}
    env = {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": login.public_url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_RESOURCE_ATTRIBUTES": f"gateway.url={login.public_url}",
    }
    for signal in ("metrics", "logs", "traces"):
        env[f"OTEL_{signal.upper()}_EXPORTER"] = "otlp" if signal in signals else "none"
    return env


async def _principal(gw: Gateway, request: Request[Any, Any, Any]) -> ClientKey | None:
    runtime = gw.runtime
    try:
        _, key = await gw.identity.authenticate(runtime, request.headers)
    except AuthenticationError:
        audit("auth.denied", reason="invalid_token", path=request.url.path)
        raise
    return key


@get("/managed/settings")
async def managed_settings(request: Request[Any, Any, Any]) -> Response[bytes]:
    rid = new_request_id()
    gw = _gateway(request)
    try:
        key = await _principal(gw, request)
        settings = gw.runtime.settings
        groups = key.groups if key is not None else ()
        found = policy_for(settings, groups)
        if found is None:
            raise NotFound("no managed settings apply to you")
        index, policy = found
        chosen = dict(policy.settings)
        extra = managed_env(settings)
        if extra:
            env = chosen.get("env")
            chosen["env"] = {**extra, **(env if isinstance(env, dict) else {})}
        checksum = settings_checksum(chosen)
    except GatewayError as exc:
        return error_response(exc, rid)
    etag = f'"{checksum}"'
    subject = key.user if key is not None else ""
    audit("managed.serve", subject=subject, email=key.email if key else None, policy=index, checksum=checksum)
    if request.headers.get("if-none-match") == etag:
        return Response(b"", status_code=304, headers={"etag": etag, "request-id": rid})
    base = settings.login.public_url if settings.login is not None else "messages-gateway"
    body = {
        "uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{base}#managed-policy-{index}")),
        "checksum": checksum,
        "settings": chosen,
    }
    return Response(
        json.dumps(body, ensure_ascii=False).encode(),
        media_type="application/json",
        headers={"etag": etag, "cache-control": "private, no-cache", "request-id": rid},
    )


# --- the CLI's telemetry (OTLP/HTTP): answered at once, relayed off the request path ---


async def _telemetry(request: Request[Any, Any, Any], signal: Signal) -> Response[bytes]:
    rid = new_request_id()
    gw = _gateway(request)
    try:
        key = await _principal(gw, request)
        declared = request.headers.get("content-length", "")
        limit = gw.runtime.settings.server.max_request_bytes
        if declared.isdigit() and int(declared) > limit:
            raise RequestTooLarge(f"a telemetry body is at most {limit} bytes")
        body = await request.body()
    except GatewayError as exc:
        return error_response(exc, rid)
    content_type = request.headers.get("content-type", "application/x-protobuf")
    gw.relay.submit(
        signal,
        body,
        content_type,
        request.headers.get("content-encoding"),
        key.user if key is not None else "",
        key.team if key is not None else "",
    )
    # OTLP/HTTP's success answer: an empty Export*ServiceResponse, in the encoding asked with
    answer, media = (b"{}", "application/json") if content_type.startswith("application/json") else (b"", content_type)
    return Response(answer, media_type=media.split(";")[0], headers={"request-id": rid})


@post("/v1/metrics", status_code=200)
async def otlp_metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    return await _telemetry(request, "metrics")


@post("/v1/logs", status_code=200)
async def otlp_logs(request: Request[Any, Any, Any]) -> Response[bytes]:
    return await _telemetry(request, "logs")


@post("/v1/traces", status_code=200)
async def otlp_traces(request: Request[Any, Any, Any]) -> Response[bytes]:
    return await _telemetry(request, "traces")


MANAGED_HANDLERS = [managed_settings, otlp_metrics, otlp_logs, otlp_traces]

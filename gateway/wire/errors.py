"""Gateway errors: each class declares its wire meaning; all render as the Anthropic error envelope."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import msgspec

from gateway.wire.events import ErrorDetail, ErrorEvent, encode_event
from gateway.wire.sse import encode_frame

__all__ = [
    "RETRYABLE_STATUSES",
    "AuthenticationError",
    "GatewayError",
    "InvalidRequest",
    "NotFound",
    "NotSupported",
    "PermissionDenied",
    "RequestTooLarge",
    "StoreUnavailable",
    "UpstreamConnectionError",
    "UpstreamStatusError",
    "UpstreamTimeout",
    "envelope",
    "error_frame",
    "error_headers",
    "error_type_for_status",
    "new_request_id",
    "status_for_error_type",
]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})
"""The statuses that say "try again": the gateway retries and falls over on them (``RetryPolicy``), counts them as
a provider's failure (``UpstreamStatusError.retryable``), and a client may retry them. The Anthropic SDKs retry
the same set (408, 409 and 429 and every 5xx; 409 and 501 are the request's own fault here)."""


def _fixable_only_by_the_client(status: int) -> bool:
    """A 4xx that the same request will get again: 400-499 except 408 (timeout), 409 (conflict), 429 (rate)."""
    return 400 <= status < 500 and status not in (408, 409, 429)


def error_headers(status: int, headers: Mapping[str, str], request_id: str) -> dict[str, str]:
    """The response headers of an error: ``request-id``, the error's own (an upstream's retry hints, ``allow``…)
    and, on an error that retrying cannot fix, ``x-should-retry: false`` — without it Claude Code retries a 401
    with back-off for minutes; with it, it fails at once. An upstream's own ``x-should-retry`` wins."""
    out = {"request-id": request_id, **headers}
    if _fixable_only_by_the_client(status) and "x-should-retry" not in out:
        out["x-should-retry"] = "false"
    return out


_STATUS_FOR_TYPE = {error_type: status for status, error_type in _ERROR_TYPES.items()}  # timeout_error: 504


def status_for_error_type(error_type: str) -> int:
    """The HTTP status that carries an Anthropic error type (500 for types this gateway does not know)."""
    return _STATUS_FOR_TYPE.get(error_type, 500)


def error_type_for_status(status: int) -> str:
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def new_request_id() -> str:
    return "req_gw_" + secrets.token_hex(12)


class _Envelope(msgspec.Struct, kw_only=True):
    type: str = "error"
    error: ErrorDetail
    request_id: str | None = None


_encode = msgspec.json.Encoder().encode


def envelope(error_type: str, message: str, request_id: str | None = None) -> bytes:
    """``{"type":"error","error":{"type":…,"message":…},"request_id":…}``"""
    return _encode(_Envelope(error=ErrorDetail(type=error_type, message=message), request_id=request_id))


def error_frame(error_type: str, message: str) -> bytes:
    """The terminal ``error`` event of a stream that failed after it started, as an SSE frame."""
    return encode_frame("error", encode_event(ErrorEvent(error=ErrorDetail(type=error_type, message=message))))


class GatewayError(Exception):
    """An error answered before the response started: real HTTP status plus the envelope."""

    status_code = 500
    error_type = "api_error"
    retryable = False
    upstream_request_id = ""  # the provider's own id of the failed request, when a provider answered

    def __init__(
        self,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})
        self.body = body  # an upstream's own Anthropic envelope, forwarded as it came

    def render(self, request_id: str) -> bytes:
        return self.body if self.body is not None else envelope(self.error_type, self.message, request_id)

    def response_headers(self, request_id: str) -> dict[str, str]:
        """``error_headers`` for this error."""
        return error_headers(self.status_code, self.headers, request_id)


class InvalidRequest(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class AuthenticationError(GatewayError):
    status_code = 401
    error_type = "authentication_error"


class PermissionDenied(GatewayError):
    status_code = 403
    error_type = "permission_error"


class NotFound(GatewayError):
    status_code = 404
    error_type = "not_found_error"


class NotSupported(GatewayError):
    """501 ``not_supported`` with ``x-should-retry: false``: what the provider cannot do for this request (a token
    count Bedrock cannot make), as Claude Code's gateway contract answers it; the client falls back on its own."""

    status_code = 501
    error_type = "not_supported"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"x-should-retry": "false"})


class StoreUnavailable(GatewayError):
    """The gateway's own store (the ledger, the issued keys) cannot be reached."""

    status_code = 503
    error_type = "api_error"


class RequestTooLarge(GatewayError):
    status_code = 413
    error_type = "request_too_large"


class UpstreamConnectionError(GatewayError):
    status_code = 502
    error_type = "api_error"
    retryable = True


class UpstreamTimeout(GatewayError):
    status_code = 504
    error_type = "timeout_error"
    retryable = True


class UpstreamStatusError(GatewayError):
    """A non-2xx answer from a provider, carried to the client with the same status and type."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        request_id: str = "",
    ) -> None:
        super().__init__(message, headers=headers, body=body)
        self.upstream_request_id = request_id or self.headers.get("request-id", "")
        self.status_code = status
        self.error_type = error_type
        self.retryable = status in RETRYABLE_STATUSES

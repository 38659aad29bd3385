"""Provider error bodies of every shape become the Anthropic envelope with the right status and type."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.base import raise_for_upstream
from gateway.wire.errors import UpstreamStatusError


class Resp:
    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.headers = headers or {}

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.body

    async def read(self, limit: int | None = None) -> bytes:
        return self.body

    async def aclose(self) -> None:
        return None


def raised(status: int, body: Any, headers: dict[str, str] | None = None) -> UpstreamStatusError:
    with pytest.raises(UpstreamStatusError) as info:
        asyncio.run(raise_for_upstream(Resp(status, body, headers), "p"))  # type: ignore[arg-type]
    return info.value


def test_anthropic_envelope_kept_as_it_came() -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "request_id": "r"}
    err = raised(529, body, {"x-should-retry": "true", "x-other": "no"})
    assert (err.status_code, err.error_type, err.message) == (529, "overloaded_error", "Overloaded")
    assert err.body == json.dumps(body).encode() and err.headers == {"x-should-retry": "true"}


QUOTA = {
    "error": {
        "code": 429,
        "message": "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model",
        "status": "RESOURCE_EXHAUSTED",
    }
}


@pytest.mark.parametrize("body", [QUOTA, [QUOTA]])
def test_google_shape_plain_or_in_a_list(body: Any) -> None:
    err = raised(429, body)
    assert (err.status_code, err.error_type) == (429, "rate_limit_error")
    assert err.message.startswith("Quota exceeded") and err.body is None
    assert json.loads(err.render("req_1"))["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize(
    ("status", "google", "want"),
    [
        (400, "FAILED_PRECONDITION", (400, "invalid_request_error")),
        (400, "INVALID_ARGUMENT", (400, "invalid_request_error")),
        (401, "UNAUTHENTICATED", (401, "authentication_error")),
        (403, "PERMISSION_DENIED", (403, "permission_error")),
        (404, "NOT_FOUND", (404, "not_found_error")),
        (503, "UNAVAILABLE", (529, "overloaded_error")),
        (504, "DEADLINE_EXCEEDED", (504, "timeout_error")),
        (500, "INTERNAL", (500, "api_error")),
    ],
)
def test_google_statuses(status: int, google: str, want: tuple[int, str]) -> None:
    err = raised(status, {"error": {"code": status, "message": "m", "status": google}})
    assert (err.status_code, err.error_type) == want


@pytest.mark.parametrize(
    ("status", "code", "want"),
    [
        (401, "401", (401, "authentication_error")),
        (429, "429", (429, "rate_limit_error")),
        (500, "InternalServerError", (500, "api_error")),
        (400, "content_filter", (400, "invalid_request_error")),
        (503, "ServiceUnavailable", (529, "overloaded_error")),
    ],
)
def test_azure_shape(status: int, code: str, want: tuple[int, str]) -> None:
    err = raised(status, {"error": {"code": code, "message": "Access denied"}}, {"retry-after": "5"})
    assert (err.status_code, err.error_type, err.message) == (*want, "Access denied")
    assert err.headers == {"retry-after": "5"}


def test_unknown_body_is_named_with_the_status() -> None:
    err = raised(502, b"<html>Bad gateway</html>")
    assert (err.status_code, err.error_type) == (502, "api_error")
    assert "HTTP 502" in err.message and "Bad gateway" in err.message

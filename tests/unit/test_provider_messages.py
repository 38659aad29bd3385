"""What a client is told of a provider's error (issue 32, item 6): the messages a client's recovery matches are kept
exactly (Bedrock's ``Input is too long.``, the API's ``prompt is too long: …``), Vertex's request-size 400 becomes
``Input is too long.``, and a message naming the operator's cloud account is logged and replaced, its type kept —
through the adapters' own error mapping, fed real provider answers."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Mapping

import pytest

from adapters._bedrock_stream import raise_for_bedrock
from adapters._provider_messages import INPUT_TOO_LONG, client_message
from adapters.base import raise_for_upstream
from gateway.wire.errors import UpstreamStatusError


class Answer:
    """A non-2xx provider answer, as the upstream seam hands it over."""

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        self._body = body
        self.headers = {"content-type": "application/json", **(headers or {})}

    async def chunks(self) -> AsyncGenerator[bytes]:
        yield self._body

    async def read(self, limit: int | None = None) -> bytes:
        return self._body

    def at_eof(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def raised(check: object, answer: Answer) -> UpstreamStatusError:
    with pytest.raises(UpstreamStatusError) as caught:
        asyncio.run(check(answer, "cloud"))  # type: ignore[operator]
    return caught.value


def test_bedrocks_input_is_too_long_is_relayed_exactly() -> None:
    answer = Answer(
        400, json.dumps({"message": "Input is too long."}).encode(), {"x-amzn-errortype": "ValidationException"}
    )
    error = raised(raise_for_bedrock, answer)
    assert (error.status_code, error.error_type, error.message) == (400, "invalid_request_error", INPUT_TOO_LONG)


def test_vertexs_request_size_refusal_is_answered_input_is_too_long() -> None:
    google = {
        "error": {
            "code": 400,
            "message": "The request size (31457281 bytes) exceeds 30.000MB limit.",
            "status": "INVALID_ARGUMENT",
        }
    }
    error = raised(raise_for_upstream, Answer(400, json.dumps(google).encode()))
    assert (error.status_code, error.error_type, error.message) == (400, "invalid_request_error", INPUT_TOO_LONG)


def test_the_apis_prompt_is_too_long_keeps_its_message() -> None:
    message = "prompt is too long: 210000 tokens > 200000 maximum"
    body = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": message}}).encode()
    error = raised(raise_for_upstream, Answer(400, body))
    assert error.message == message and error.body == body  # relayed as it came


@pytest.mark.parametrize(
    ("check", "answer"),
    [
        (
            raise_for_bedrock,
            Answer(
                403,
                json.dumps(
                    {
                        "message": "User: arn:aws:sts::123456789012:assumed-role/gw/x is not authorized to perform: "
                        "bedrock:InvokeModel"
                    }
                ).encode(),
                {"x-amzn-errortype": "AccessDeniedException"},
            ),
        ),
        (
            raise_for_upstream,
            Answer(
                403,
                json.dumps(
                    {
                        "error": {
                            "code": 403,
                            "message": "Permission denied on resource projects/acme-prod-4711/locations/us-east5",
                            "status": "PERMISSION_DENIED",
                        }
                    }
                ).encode(),
            ),
        ),
    ],
)
def test_a_message_naming_the_operators_account_is_logged_and_replaced(
    check: object, answer: Answer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway")
    error = raised(check, answer)
    assert error.error_type == "permission_error" and error.status_code == 403
    assert "123456789012" not in error.message and "acme-prod-4711" not in error.message
    assert "refused the request (permission_error)" in error.message
    assert "123456789012" in caplog.text or "acme-prod-4711" in caplog.text  # the operator still reads it


def test_messages_without_account_ids_pass() -> None:
    for message in ("Too many tokens, please wait before trying again.", "max_tokens: 99999999 > 64000", ""):
        assert client_message(message, provider="p", error_type="x") == message

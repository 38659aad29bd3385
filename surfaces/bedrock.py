"""Bedrock InvokeModel, inbound: ``POST /model/{modelId}/invoke``, ``/invoke-with-response-stream``,
``/count-tokens``, and ``GET /inference-profiles`` (``gateway.http.routes``), as ``AnthropicBedrock`` and Claude Code's
Bedrock mode send them.

Requests: the model from the path (``:`` raw or ``%3A``, ARNs with ``%2F``), mapped onto an alias
(``surfaces.base.resolve_cloud_model``); the body has ``anthropic_version`` (dropped: the target's adapter
sets its own) and ``anthropic_beta`` (a list, merged into the ``anthropic-beta`` header, which every adapter
honours), and no ``model`` / ``stream`` (set from the path).

Answers: ``invoke`` is the Messages JSON with Bedrock's ``x-amzn-bedrock-*-token-count`` and latency headers;
a stream is ``application/vnd.amazon.eventstream`` — each canonical event one ``chunk`` frame
(``{"bytes": base64}``, both CRCs; ``adapters._eventstream.encode_chunks``), ``amazon-bedrock-invocationMetrics``
added to the ``message_stop`` chunk from the stream's own usage, and an ``error`` event sent as the exception
frame Bedrock would send. Errors before the stream are Bedrock's shape: ``x-amzn-errortype`` and
``{"message": …}`` with Bedrock's statuses (``529`` is Bedrock's ``503 ServiceUnavailableException``), so
``AnthropicBedrock`` raises the error classes it raises against Bedrock — but for the gateway's own key, which is
refused ``401`` (Bedrock says 403 to a bad AWS credential, which Claude Code retries for minutes).
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import unquote

import msgspec

from adapters._eventstream import HeaderValue, encode_chunks, encode_message
from gateway.wire.errors import InvalidRequest
from gateway.wire.events import Batch, EventView, Usage, UsageView, decode_view
from gateway.wire.request import BETA_NAME, MAX_BETAS
from gateway.wire.sse import split_block
from gateway.wire.usage_fold import fold_usage
from surfaces.base import PathCall, Routes, Send, Wire, canonical_body, resolve_cloud_model

__all__ = ["BEDROCK_PREFIX", "BedrockCall", "bedrock_error", "inference_profiles", "match_bedrock"]

BEDROCK_PREFIX = "/model/"
_ACTIONS = {"invoke": (False, False), "invoke-with-response-stream": (True, False), "count-tokens": (False, True)}
_NAMESPACE = "http://internal.amazon.com/coral/com.amazon.bedrock/"
_EVENTSTREAM = b"application/vnd.amazon.eventstream"

# Anthropic error type -> (Bedrock exception, HTTP status; None keeps the status) before the stream
_ERRORS: dict[str, tuple[str, int | None]] = {
    "invalid_request_error": ("ValidationException", None),
    "request_too_large": ("ValidationException", 400),
    # 401, not Bedrock's 403 for a bad credential: Claude Code's Bedrock mode takes a 403 for expired AWS
    # credentials and retries for minutes, while a 401 with x-should-retry: false fails at once (tested)
    "authentication_error": ("UnrecognizedClientException", None),
    "permission_error": ("AccessDeniedException", None),
    "not_found_error": ("ResourceNotFoundException", None),
    "rate_limit_error": ("ThrottlingException", None),
    "billing_error": ("ServiceQuotaExceededException", None),
    "timeout_error": ("ModelTimeoutException", 408),
    "overloaded_error": ("ServiceUnavailableException", 503),
    "api_error": ("InternalServerException", None),
}
# ... and mid-stream, as the ResponseStream exception members
_STREAM_ERRORS = {
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
    "timeout_error": "modelTimeoutException",
    "invalid_request_error": "validationException",
}


class _Envelope(msgspec.Struct):
    class Detail(msgspec.Struct):
        type: str = "api_error"
        message: str = ""

    error: Detail = msgspec.field(default_factory=Detail)


class _Usage(msgspec.Struct):
    usage: UsageView | None = None


_decode_envelope = msgspec.json.Decoder(_Envelope).decode
_decode_usage = msgspec.json.Decoder(_Usage).decode
_encode = msgspec.json.Encoder().encode


def match_bedrock(method: str, path: str) -> BedrockCall | None:
    rest = path[len(BEDROCK_PREFIX) :]
    model, _, action = rest.rpartition("/")
    if action not in _ACTIONS or not model:
        return None
    stream, count = _ACTIONS[action]
    return BedrockCall(unquote(model), stream=stream, count=count, route=f"{BEDROCK_PREFIX}{{modelId}}/{action}")


def bedrock_error(status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, list[Any], bytes]:
    """An error answer in the Anthropic envelope, in Bedrock's shape."""
    try:
        detail = _decode_envelope(body).error
    except msgspec.DecodeError:
        detail = _Envelope.Detail(message=body.decode("utf-8", "replace"))
    name, fixed = _ERRORS.get(detail.type, ("InternalServerException", None))
    out = [(k, v) for k, v in headers if k not in (b"content-length", b"content-type")]
    request_id = next((v for k, v in headers if k == b"request-id"), b"")
    payload = _encode({"message": detail.message})
    out += [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"x-amzn-errortype", f"{name}:{_NAMESPACE}".encode()),
        (b"x-amzn-requestid", request_id),
    ]
    return fixed or status, out, payload


def _exception_frame(error_data: bytes) -> bytes:
    try:
        detail = _decode_envelope(error_data).error
    except msgspec.DecodeError:
        detail = _Envelope.Detail(message="the stream failed")
    name = _STREAM_ERRORS.get(detail.type, "internalServerException")
    headers: dict[str, HeaderValue] = {
        ":message-type": "exception",
        ":exception-type": name,
        ":content-type": "application/json",
    }
    return encode_message(headers, _encode({"message": detail.message}))


def _split(block: bytes) -> tuple[list[bytes], list[bytes]]:
    """Event names and data of a block of complete SSE frames (the gateway's canonical frames: by line; any
    other shape through the SSE parser)."""
    lines = block.split(b"\n")
    n = len(lines) // 3
    if len(lines) == 3 * n + 1 and not lines[-1] and not any(lines[2::3]):
        names, datas = lines[0:-1:3], lines[1::3]
        if all(x.startswith(b"event: ") for x in names) and all(d.startswith(b"data: ") for d in datas):
            return [x[7:] for x in names], [d[6:] for d in datas]
    events, datas = split_block(block)
    return [e or b"message" for e in events], datas


_COUNTED = frozenset({"message_start", "message_delta"})
_LAST = frozenset({"message_stop", "error"})


class _Stream:
    """The eventstream body of one answer: frames for the SSE blocks the edge sends, and the usage they
    carry (for the invocation metrics)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.first_byte: float | None = None
        self.usage = Usage()

    def encode(self, block: bytes, sent: tuple[bytes, Batch] | None) -> bytes:
        """The frames of ``block``: a Bedrock target's own (``Batch.wire``), byte for byte; else each event a
        chunk, from the batch's decoded events when ``block`` is one (``sent``), else split here."""
        if not block:
            return b""
        if self.first_byte is None:
            self.first_byte = time.monotonic()
        if sent is not None and sent[0] is block:
            batch = sent[1]
            wire = batch.wire
            if wire is not None:
                return wire
            names = [view.type for view in batch.views]
            views: list[EventView] | None = batch.views
            datas = batch.datas
        else:
            raw, datas = _split(block)
            names, views = [name.decode("latin-1") for name in raw], None
        return self._frames(names, views, datas)

    def _frames(self, names: list[str], views: list[EventView] | None, datas: list[bytes]) -> bytes:
        out: list[bytes] = []
        start = 0
        for i, name in enumerate(names):
            if name in _COUNTED:
                self.usage = fold_usage(self.usage, views[i] if views is not None else decode_view(datas[i]))
            elif name in _LAST:
                out.append(encode_chunks(datas[start:i]))
                out.append(self._stop(datas[i]) if name == "message_stop" else _exception_frame(datas[i]))
                start = i + 1
        if not out:
            return encode_chunks(datas)
        out.append(encode_chunks(datas[start:]))
        return b"".join(out)

    def _stop(self, data: bytes) -> bytes:
        event: dict[str, Any] = msgspec.json.decode(data)
        usage, now = self.usage, time.monotonic()
        event["amazon-bedrock-invocationMetrics"] = {
            "inputTokenCount": usage.input_tokens or 0,
            "outputTokenCount": usage.output_tokens or 0,
            "invocationLatency": round((now - self.started) * 1000),
            "firstByteLatency": round(((self.first_byte or now) - self.started) * 1000),
            "cacheReadInputTokenCount": usage.cache_read_input_tokens or 0,
            "cacheWriteInputTokenCount": usage.cache_creation_input_tokens or 0,
        }
        return encode_chunks([_encode(event)])


class _Count(msgspec.Struct):
    input_tokens: int


class _BedrockSend:
    """The ASGI ``send`` of one Bedrock-shaped answer."""

    def __init__(self, send: Send, stream: bool, count: bool, context: Wire) -> None:
        self._send = send
        self._count = count
        self._context = context
        self._held: dict[str, Any] | None = None  # a head waiting for its body (errors, JSON answers)
        self._body: _Stream | None = None
        self._stream = stream
        self._started = time.monotonic()

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            if message["status"] == 200 and self._stream:
                headers = [(k, v) for k, v in message["headers"] if k != b"content-type"]
                headers += [(b"content-type", _EVENTSTREAM), (b"x-amzn-bedrock-content-type", b"application/json")]
                self._body = _Stream()
                await self._send({**message, "headers": headers})
            else:
                self._held = message
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        if self._held is not None:
            await self._answer(self._held, message)
            self._held = None
            return
        if self._body is not None:
            message = {**message, "body": self._body.encode(message.get("body", b""), self._context.sent)}
        await self._send(message)

    async def _answer(self, head: dict[str, Any], message: dict[str, Any]) -> None:
        body: bytes = message.get("body", b"")
        status, headers = head["status"], list(head["headers"])
        if status >= 400:
            status, headers, body = bedrock_error(status, body, headers)
        elif self._count:  # CountTokens answers {"inputTokens": N}
            with contextlib.suppress(msgspec.DecodeError):  # else passed on as it came
                body = _encode({"inputTokens": msgspec.json.decode(body, type=_Count).input_tokens})
            headers = [(k, v) for k, v in headers if k != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
        else:
            headers += _json_headers(body, head["headers"], time.monotonic() - self._started)
        await self._send({**head, "status": status, "headers": headers})
        await self._send({**message, "body": body})


def _json_headers(body: bytes, headers: list[tuple[bytes, bytes]], elapsed: float) -> list[tuple[bytes, bytes]]:
    """InvokeModel's own headers on a JSON answer: the token counts, the latency, the request id."""
    out = [(b"x-amzn-requestid", next((v for k, v in headers if k == b"request-id"), b""))]
    try:
        usage = _decode_usage(body).usage
    except msgspec.DecodeError:
        usage = None
    if usage is not None:
        out.append((b"x-amzn-bedrock-input-token-count", str(usage.input_tokens or 0).encode()))
        out.append((b"x-amzn-bedrock-output-token-count", str(usage.output_tokens or 0).encode()))
        out.append((b"x-amzn-bedrock-invocation-latency", str(round(elapsed * 1000)).encode()))
    return out


class BedrockCall(PathCall):
    kind = "bedrock"

    def canonical(self, body: bytes, headers: MutableMapping[str, str], routes: Routes) -> bytes:
        model = resolve_cloud_model("bedrock", self.model_id, routes)
        if self.count:  # CountTokens wraps the request: {"input": {"invokeModel": {"body": "<JSON text>"}}}
            body = _count_body(body)
        drop: tuple[str, ...] = ("anthropic_version", "anthropic_beta")
        if self.count:  # an InvokeModel body, counted: what the Messages count_tokens body does not take goes
            drop += _NOT_COUNTED
        out, fields = canonical_body(body, model=model, stream=None if self.count else self.stream, drop=drop)
        betas = fields.get("anthropic_beta")
        if betas is not None:
            try:
                listed = msgspec.json.decode(betas, type=list[str])
            except msgspec.ValidationError:
                raise InvalidRequest("anthropic_beta: a list of beta names") from None
            if len(listed) > MAX_BETAS:
                raise InvalidRequest(f"anthropic_beta: more than {MAX_BETAS} beta names")
            for name in listed:  # each a token: a JSON string may hold CR, LF, or what latin-1 cannot encode
                if BETA_NAME.fullmatch(name) is None:
                    shown = name if len(name) <= 40 else name[:40] + "…"
                    raise InvalidRequest(f"anthropic_beta: {shown!r} is not a beta name")
            header = [b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()]
            merged = list(dict.fromkeys([*header, *listed]))
            if merged:
                headers["anthropic-beta"] = ",".join(merged)
        return out

    def wrap(self, send: Send, context: Wire) -> Send:
        return _BedrockSend(send, self.stream, self.count, context)


# InvokeModel's answer-shaping fields, which Messages count_tokens refuses ("Extra inputs are not permitted")
_NOT_COUNTED = ("max_tokens", "stream", "temperature", "top_p", "top_k", "stop_sequences", "metadata", "service_tier")


class _CountInput(msgspec.Struct):
    class Input(msgspec.Struct):
        class Invoke(msgspec.Struct):
            body: str

        invokeModel: Invoke | None = None

    input: Input | None = None


def _count_body(body: bytes) -> bytes:
    """Bedrock CountTokens' ``{"input": {"invokeModel": {"body": "…"}}}`` unwrapped (a body that is not wrapped
    is taken as the Messages body itself); ``body`` may also be base64, as botocore's blob encoding sends it."""
    try:
        wrapped = msgspec.json.decode(body, type=_CountInput)
    except msgspec.DecodeError:
        return body
    if wrapped.input is None or wrapped.input.invokeModel is None:
        return body
    inner = wrapped.input.invokeModel.body
    if inner.lstrip().startswith("{"):
        return inner.encode()
    try:
        return base64.b64decode(inner, validate=True)
    except ValueError:
        raise InvalidRequest("input.invokeModel.body: the request body, as JSON text or base64") from None


def inference_profiles(aliases: list[tuple[str, str]], region: str) -> dict[str, Any]:
    """``ListInferenceProfiles``' answer for the gateway's aliases ``(alias, display name)``: one
    SYSTEM_DEFINED profile each, named by its alias (Claude Code lists them at start-up)."""
    summaries = []
    for alias, display in aliases:
        arn = f"arn:aws:bedrock:{region}:000000000000:inference-profile/{alias}"
        summaries.append(
            {
                "inferenceProfileName": display,
                "inferenceProfileId": alias,
                "inferenceProfileArn": arn,
                "description": f"{display} through messages-gateway",
                "models": [{"modelArn": f"arn:aws:bedrock:{region}::foundation-model/{alias}"}],
                "status": "ACTIVE",
                "type": "SYSTEM_DEFINED",
                "createdAt": "2025-01-01T00:00:00Z",
                "updatedAt": "2025-01-01T00:00:00Z",
            }
        )
    return {"inferenceProfileSummaries": summaries}

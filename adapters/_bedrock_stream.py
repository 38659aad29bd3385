"""Bedrock's response streams as canonical batches: InvokeModelWithResponseStream (``chunk`` frames carrying
first-party events) and ConverseStream (through the sans-IO ``ConverseTranscoder``); and Bedrock's errors
as Anthropic ones (docs/wire-formats.md §3.5, §6.2)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.wire.errors import UpstreamStatusError, error_frame, error_type_for_status
from gateway.wire.events import Batch, ErrorDetail, ErrorEvent, EventView, Usage, decode_views, encode_event
from gateway.wire.sse import encode_frames, frame_header
from gateway.wire.upstream import StreamInterrupted, UpstreamResponse
from gateway.wire.usage_fold import fold_usage

from ._converse import STREAM_EXCEPTIONS, ConverseTranscoder
from ._eventstream import EventStreamDecoder, EventStreamError, EventStreamMessage, parse_headers
from ._provider_messages import client_message
from .base import batch_of_block, forwardable_headers, provider_request_id, raise_for_redirect, read_error_body

if TYPE_CHECKING:
    from ._eventstream_c import ChunkBatch

__all__ = [
    "BEDROCK_ERRORS",
    "STREAM_EXCEPTIONS",
    "BedrockEventStream",
    "ConverseEventStream",
    "bedrock_error",
    "decode_json",
    "error_batch",
    "raise_for_bedrock",
]

# docs/wire-formats.md §3.5: Bedrock exception name -> (HTTP status, Anthropic error type) for the client.
BEDROCK_ERRORS: dict[str, tuple[int, str]] = {
    "ValidationException": (400, "invalid_request_error"),
    "ServiceQuotaExceededException": (429, "rate_limit_error"),
    "AccessDeniedException": (403, "permission_error"),
    "ResourceNotFoundException": (404, "not_found_error"),
    "ModelTimeoutException": (504, "timeout_error"),
    "ThrottlingException": (429, "rate_limit_error"),
    "ModelNotReadyException": (529, "overloaded_error"),
    "ModelErrorException": (500, "api_error"),
    "ModelStreamErrorException": (500, "api_error"),
    "InternalServerException": (500, "api_error"),
    "ServiceUnavailableException": (529, "overloaded_error"),
}


_METRICS_KEY = "amazon-bedrock-invocationMetrics"
_METRICS_BYTES = _METRICS_KEY.encode()


class _Chunk(msgspec.Struct):
    data: bytes = msgspec.field(default=b"", name="bytes")  # base64 in the JSON; padding ("p") is ignored


class _InvocationMetrics(msgspec.Struct, rename="camel"):
    input_token_count: int | None = None
    output_token_count: int | None = None
    cache_read_input_token_count: int | None = None
    cache_write_input_token_count: int | None = None


class _AwsErrorBody(msgspec.Struct):
    message: str | None = None
    Message: str | None = None
    type_: str | None = msgspec.field(default=None, name="__type")


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_chunks = msgspec.json.Decoder(list[_Chunk]).decode
_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_metrics = msgspec.json.Decoder(_InvocationMetrics).decode
_decode_error_body = msgspec.json.Decoder(_AwsErrorBody).decode
decode_json = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode

_chunk_events: Callable[[list[bytes]], list[bytes] | None] | None
_chunk_batch: Callable[[list[bytes]], ChunkBatch | None] | None
try:  # the chunks of Bedrock's exact shape decoded in C (adapters/_eventstream_c.c); msgspec for the rest
    from ._eventstream_c import chunk_batch as _chunk_batch
    from ._eventstream_c import chunk_events as _chunk_events
except ImportError:  # pragma: no cover - no compiler where it was installed
    _chunk_events = _chunk_batch = None


def _error_data(error_type: str, message: str) -> bytes:
    return encode_event(ErrorEvent(error=ErrorDetail(type=error_type, message=message)))


def error_batch(error_type: str, message: str) -> Batch:
    data = _error_data(error_type, message)
    return Batch(decode_views([data]), [data])


def bedrock_error(
    status: int,
    error_code: str | None,
    message: str,
    provider: str,
    headers: Mapping[str, str] | None = None,
    request_id: str = "",
) -> UpstreamStatusError:
    """A pre-stream Bedrock failure as the Anthropic error the client's SDK understands (§3.5)."""
    name = (error_code or "").split(":", 1)[0].rsplit("#", 1)[-1]
    mapped = BEDROCK_ERRORS.get(name)
    client_status, error_type = mapped if mapped else (status, error_type_for_status(status))
    if not message:
        message = f"provider {provider!r} answered HTTP {status}" + (f" ({name})" if name else "")
    message = client_message(message, provider=provider, error_type=error_type, request_id=request_id)
    return UpstreamStatusError(client_status, error_type, message, headers=headers, request_id=request_id)


async def raise_for_bedrock(resp: UpstreamResponse, provider: str) -> None:
    status = resp.status
    if 200 <= status < 300:
        return
    raise_for_redirect(status, provider, provider_request_id(resp.headers))
    body = await read_error_body(resp, provider)
    try:
        parsed = _decode_error_body(body)
    except msgspec.DecodeError:
        parsed = _AwsErrorBody(message=body[:300].decode("utf-8", "replace").strip() or None)
    code = resp.headers.get("x-amzn-errortype") or parsed.type_
    message = parsed.message or parsed.Message or ""
    headers = resp.headers
    raise bedrock_error(status, code, message, provider, forwardable_headers(headers), provider_request_id(headers))


class BedrockEventStream:
    """InvokeModelWithResponseStream's event-stream → batches of first-party events."""

    __slots__ = ("_chunk_headers", "_name", "_on_mismatch", "_previous", "_resp", "_start", "headers", "request_id")

    def __init__(self, resp: UpstreamResponse, provider: str, on_mismatch: Callable[[], None] | None) -> None:
        self._resp = resp
        self._name = provider
        self._on_mismatch = on_mismatch
        self.headers = forwardable_headers(resp.headers)
        self.request_id = provider_request_id(resp.headers)
        self._chunk_headers = b""  # the header block of this stream's chunk frames, once seen
        # message_start, and the batch before the current one: what Bedrock's metrics are checked against
        self._start: EventView | None = None
        self._previous: list[EventView] = []

    async def batches(self) -> AsyncGenerator[Batch]:
        """One batch per read: the chunks' events, built in C when they have Bedrock's shape (``_fast_batch``),
        else decoded and checked event by event (``_general_batch``); a damaged stream or an exception frame
        ends the stream with an ``error`` event after what arrived intact before it."""
        decoder = EventStreamDecoder()
        chunks = self._resp.chunks()
        try:
            async for received in chunks:
                payloads, failure = self._payloads(decoder, received)
                batch = None
                if failure is None and payloads and _chunk_batch is not None:
                    batch = self._fast_batch(payloads)
                if batch is None:
                    batch = self._general_batch(payloads, failure)
                if batch is not None:
                    self._previous = batch.views
                    if failure is None:  # Bedrock's own frames, for a client that speaks Bedrock too
                        batch.wire_span = decoder.last_span()  # sliced only if such a client asks
                    yield batch
                if failure is not None:
                    return
            decoder.close()
        except EventStreamError as exc:
            yield error_batch("api_error", f"provider {self._name!r}: damaged event stream: {exc}")
        except StreamInterrupted as exc:
            if decoder.pending:  # the connection broke inside a frame
                message = f"provider {self._name!r}: connection lost inside an event-stream frame"
                raise StreamInterrupted(message) from exc
            raise
        finally:
            await chunks.aclose()  # the response's own generator ends with this one, not at garbage collection

    def _payloads(self, decoder: EventStreamDecoder, received: bytes) -> tuple[list[bytes], bytes | None]:
        """The chunk payloads of one read, and the ``error`` event's data when the read ends the stream (damage,
        or an exception frame; what arrived intact before it is kept). Frames of other event types are skipped."""
        failure: bytes | None = None
        chunk_headers = self._chunk_headers
        try:  # the chunks' payloads directly, as long as their header block is the known one
            payloads, frames = decoder.feed_payloads(received, chunk_headers)
        except EventStreamError as exc:
            payloads, frames = [], exc.decoded
            failure = _error_data("api_error", f"provider {self._name!r}: damaged event stream: {exc}")
        for raw_headers, payload in frames:  # the first chunk, other event types, an exception
            if raw_headers == chunk_headers:
                payloads.append(payload)
                continue
            headers = parse_headers(raw_headers)
            if headers.get(":message-type") != "event":
                failure = self._failure(EventStreamMessage(headers, payload))
                break
            if headers.get(":event-type") == "chunk":
                self._chunk_headers = chunk_headers = raw_headers
                payloads.append(payload)
        return payloads, failure

    def _note_start(self, views: list[EventView]) -> EventView | None:
        """The stream's ``message_start``: the first event of the first batch that has one."""
        if self._start is None and views and views[0].type == "message_start":
            self._start = views[0]
        return self._start

    def _general_batch(self, payloads: list[bytes], failure: bytes | None) -> Batch | None:
        """The batch of any read: each chunk decoded, the ``error`` event (if any) last; None when nothing to send."""
        datas = self._chunk_datas(payloads) if payloads else []
        if failure is None and len(datas) < len(payloads):
            failure = _error_data("api_error", f"provider {self._name!r}: undecodable event-stream chunk")
        if failure is not None:
            datas.append(failure)
        if not datas:
            return None
        joined = b",".join(datas)  # one buffer for the partial decode and the checks below
        views = decode_views(datas, b"[" + joined + b"]")
        start = self._note_start(views)
        slow = b"\n" in joined or b"\r" in joined  # multi-line JSON: re-encoded on one line
        metrics_at = joined.find(_METRICS_BYTES)
        if metrics_at >= 0:
            if metrics_at >= len(joined) - len(datas[-1]) and views[-1].type == "message_stop":
                datas[-1] = self._strip_metrics(datas[-1], start, self._previous + views[:-1])  # as a rule
                slow = slow or _METRICS_BYTES in datas[-1]
            else:
                slow = True  # metrics anywhere else
        raw = self._rewrite(views, datas, start) if slow else encode_frames(views, datas)
        return Batch(views, datas, raw)

    def _fast_batch(self, payloads: list[bytes]) -> Batch | None:
        """The batch of a read of chunk frames only, built in C without an object per event
        (``_eventstream_c.chunk_batch``) when the events are in the shape Bedrock sends: each begins with
        its ``type``, is on one line, and the metrics, if any, are in the final ``message_stop`` alone.
        None for anything else: the general path handles it (and counts a metrics mismatch once)."""
        assert _chunk_batch is not None
        built = _chunk_batch(payloads)
        if built is None:
            return None
        array = built.array
        views = decode_views([], array)  # [] when an event is malformed
        if len(views) != len(payloads) or built.names != "\n".join([v.type for v in views]).encode():
            return None
        metrics_at = array.find(_METRICS_BYTES)
        if metrics_at < 0:
            self._note_start(views)
            return Batch(views, None, built.sse)
        last_at = built.last_at
        if metrics_at < last_at or views[-1].type != "message_stop" or array.find(_METRICS_BYTES, metrics_at + 1) >= 0:
            return None
        start = self._note_start(views)
        data = self._strip_metrics(array[last_at:-1], start, self._previous + views[:-1])
        return Batch(views, None, built.sse[: built.last_frame_at] + frame_header("message_stop") + data + b"\n\n")

    def _rewrite(self, views: list[EventView], datas: list[bytes], start: EventView | None) -> bytes:
        """The slow path of a batch: events put on one line, Bedrock's metrics removed wherever they are.
        ``datas`` is changed in place; returns the batch's SSE."""
        for i, view in enumerate(views):
            data = datas[i]
            if b"\n" in data or b"\r" in data:
                datas[i] = data = msgspec.json.format(data, indent=-1)  # the same JSON on one line
            if view.type == "message_stop" and _METRICS_BYTES in data:
                datas[i] = self._strip_metrics(data, start, self._previous + views[:i])
        return encode_frames(views, datas)

    @staticmethod
    def _chunk_datas(payloads: list[bytes]) -> list[bytes]:
        """Each chunk's event bytes (``{"bytes": <base64>, "p": <padding>}``), all decoded in one call; when one
        is malformed, the ones before it (fewer than ``payloads``). In C when every payload has Bedrock's exact
        shape (``_eventstream_c.chunk_events``, the same bytes), else by msgspec."""
        if _chunk_events is not None:
            datas = _chunk_events(payloads)
            if datas is not None:
                return datas
        try:
            return [c.data for c in _decode_chunks(b"[" + b",".join(payloads) + b"]")]
        except msgspec.DecodeError:
            datas = []
            for payload in payloads:
                try:
                    datas.append(_decode_chunk(payload).data)
                except msgspec.DecodeError:
                    break
            return datas

    def _failure(self, message: EventStreamMessage) -> bytes:
        headers = message.headers
        if headers.get(":message-type") == "exception":
            name = str(headers.get(":exception-type", ""))
            try:
                body = _decode_error_body(message.payload)
                text = body.message or body.Message or ""
            except msgspec.DecodeError:
                text = ""
            error_type = STREAM_EXCEPTIONS.get(name, "api_error")
            return _error_data(error_type, text or f"provider {self._name!r}: {name or 'exception'} mid-stream")
        code = _text(headers.get(":error-code"))
        text = _text(headers.get(":error-message")) or "error"
        return _error_data("api_error", f"provider {self._name!r}: {code}: {text}" if code else text)

    def _strip_metrics(self, data: bytes, start: EventView | None, before: list[EventView]) -> bytes:
        """``message_stop`` without Bedrock's metrics, which are checked against the stream's usage: the
        ``message_start`` and the last ``message_delta`` before the stop (in ``before``)."""
        fields = _decode_fields(data)
        raw = fields.pop(_METRICS_KEY, None)
        if raw is not None and self._on_mismatch is not None:
            usage = fold_usage(Usage(), start) if start is not None else Usage()
            delta = next((v for v in reversed(before) if v.type == "message_delta"), None)
            if delta is not None:
                usage = fold_usage(usage, delta)
            if _mismatch(_decode_metrics(raw), usage):
                self._on_mismatch()
        return _encode(fields)

    def at_eof(self) -> bool:
        return self._resp.at_eof()

    async def aclose(self) -> None:
        await self._resp.aclose()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _mismatch(metrics: _InvocationMetrics, usage: Usage) -> bool:
    pairs = (
        (metrics.input_token_count, usage.input_tokens),
        (metrics.output_token_count, usage.output_tokens),
        (metrics.cache_read_input_token_count, usage.cache_read_input_tokens),
        (metrics.cache_write_input_token_count, usage.cache_creation_input_tokens),
    )
    return any(reported is not None and reported != (ours or 0) for reported, ours in pairs)


class ConverseEventStream:
    """ConverseStream's event-stream → the canonical sequence, through the sans-IO ``ConverseTranscoder``."""

    __slots__ = ("_message_id", "_model", "_name", "_resp", "headers", "request_id")

    def __init__(self, resp: UpstreamResponse, provider: str, *, model: str, message_id: str) -> None:
        self._resp = resp
        self._name = provider
        self._model = model
        self._message_id = message_id
        self.headers = forwardable_headers(resp.headers)
        self.request_id = provider_request_id(resp.headers)

    async def batches(self) -> AsyncGenerator[Batch]:
        transcoder = ConverseTranscoder(model=self._model, message_id=self._message_id)
        decoder = EventStreamDecoder()
        chunks = self._resp.chunks()
        try:
            async for chunk in chunks:
                out: list[bytes] = []
                failed = False
                for message in decoder.feed(chunk):
                    headers = message.headers
                    kind = headers.get(":message-type")
                    payload = decode_json(message.payload) if message.payload else {}
                    if kind == "event":
                        out.append(transcoder.feed(str(headers.get(":event-type", "")), payload))
                    elif kind == "exception":
                        out.append(transcoder.exception(str(headers.get(":exception-type", "")), payload))
                        failed = True
                        break
                    else:
                        text = f"{_text(headers.get(':error-code')) or 'error'}: {_text(headers.get(':error-message'))}"
                        out.append(error_frame("api_error", f"provider {self._name!r}: {text}"))
                        failed = True
                        break
                block = b"".join(out)
                if block:
                    yield batch_of_block(block)
                if failed:
                    return
            decoder.close()
            tail = transcoder.close()
            if tail:
                yield batch_of_block(tail)
        except EventStreamError as exc:
            yield error_batch("api_error", f"provider {self._name!r}: damaged event stream: {exc}")
        except (msgspec.DecodeError, TypeError, KeyError) as exc:
            yield error_batch("api_error", f"provider {self._name!r}: undecodable Converse event: {exc}")
        finally:
            await chunks.aclose()

    def at_eof(self) -> bool:
        return self._resp.at_eof()

    async def aclose(self) -> None:
        await self._resp.aclose()

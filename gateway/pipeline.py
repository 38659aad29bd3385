"""From a routed request to the client's bytes: open a target (falling over to the next one only while
nothing has been sent), then validate → tally → frame every event on its way out.

The response starts only once the provider's first events are in hand, so failures before that keep
their real HTTP status. After that a failure can only end the stream with one ``error`` event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import msgspec

from adapters.base import EventStream, JsonReply
from gateway.errors import GatewayError, UpstreamConnectionError, UpstreamStatusError, UpstreamTimeout, error_event
from gateway.events import UsageView, WireEvent
from gateway.metrics import Metrics
from gateway.request import ProxyRequest
from gateway.routing import Route, Target
from gateway.sse import frame_header
from gateway.upstream import StreamInterrupted
from gateway.usage import Outcome, UsageTally, usage_of
from gateway.validate import KNOWN_EVENTS, StreamValidator, Violation

__all__ = ["OpenStream", "complete", "count_tokens", "open_stream", "stream_body"]

_KNOWN = frozenset(KNOWN_EVENTS)
_STATUS_FOR_ERROR_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


class OpenStream:
    """A provider stream whose first events have arrived and not yet been sent."""

    __slots__ = ("batches", "first", "stream", "target")

    def __init__(
        self, target: Target, stream: EventStream, batches: AsyncGenerator[list[WireEvent]], first: list[WireEvent]
    ) -> None:
        self.target = target
        self.stream = stream
        self.batches = batches
        self.first = first


def _outcome_of(exc: GatewayError) -> str:
    return Outcome.TIMEOUT if isinstance(exc, UpstreamTimeout) else Outcome.UPSTREAM_ERROR


async def open_stream(route: Route, request: ProxyRequest, metrics: Metrics, tally: UsageTally) -> OpenStream:
    """Try the route's targets in order until one yields its first events. Raises the last error."""
    last: GatewayError | None = None
    for position, target in enumerate(route.targets):
        tally.provider, tally.model = target.provider, target.upstream_model(request.model)
        more = position + 1 < len(route.targets)
        try:
            stream = await target.adapter.open_stream(request, tally.model)
        except GatewayError as exc:
            metrics.upstream_errors.labels(target.provider, exc.error_type).inc()
            last = exc
            if exc.retryable and more:
                continue
            raise
        batches = stream.batches()
        try:
            first: list[WireEvent] = await anext(batches, [])
            failure = _early_error(first)
        except StreamInterrupted as exc:
            failure = UpstreamConnectionError(f"provider {target.provider!r}: {exc}")
        except BaseException:
            await _close(batches, stream)
            raise
        if failure is None:
            return OpenStream(target, stream, batches, first)
        await _close(batches, stream)
        metrics.upstream_errors.labels(target.provider, failure.error_type).inc()
        last = failure
        if not (failure.retryable and more):
            raise failure
    assert last is not None
    raise last


def _early_error(first: list[WireEvent]) -> GatewayError | None:
    """A stream that fails before its first real event can still get a proper HTTP status."""
    if not first:
        return UpstreamConnectionError("provider closed the stream before its first event")
    head = first[0]
    if head.type == "error" and head.view.error is not None:
        etype = head.view.error.type
        status = _STATUS_FOR_ERROR_TYPE.get(etype, 500)
        body = b'{"type":"error","error":' + _error_json(head.data) + b"}"
        return UpstreamStatusError(status, etype, head.view.error.message, body=body)
    return None


class _ErrorOnly(msgspec.Struct):
    error: msgspec.Raw = msgspec.Raw(b"{}")


_decode_error_only = msgspec.json.Decoder(_ErrorOnly).decode


def _error_json(data: bytes) -> bytes:
    return bytes(_decode_error_only(data).error)


async def stream_body(opened: OpenStream, metrics: Metrics, tally: UsageTally) -> AsyncIterator[bytes]:
    """The client's SSE body: one write per upstream read; ``error`` (never ``message_stop``) on failure."""
    validator = StreamValidator()
    provider = opened.target.provider
    outcome = Outcome.CLIENT_CANCELLED
    batch = opened.first
    try:
        while True:
            parts: list[bytes] = []
            for event in batch:
                view = event.view
                try:
                    validator.check(view)
                except Violation as violation:
                    metrics.violations.labels(provider, violation.rule).inc()
                    parts.append(_error_frame("api_error", f"invalid stream from provider: {violation.message}"))
                    validator.fail()
                    outcome = Outcome.INVALID_STREAM
                    break
                if event.type not in _KNOWN:
                    metrics.unknown_events.labels(provider, event.type).inc()
                parts += (frame_header(event.type), event.data, b"\n\n")
                tally.observe(view)
                if validator.terminal:
                    outcome = Outcome.COMPLETED if event.type == "message_stop" else Outcome.UPSTREAM_ERROR
                    break
            if parts:
                yield b"".join(parts)
            if validator.terminal:
                return
            try:
                batch = await anext(opened.batches)
            except StopAsyncIteration:
                try:
                    validator.finish()
                except Violation as violation:
                    metrics.violations.labels(provider, violation.rule).inc()
                    outcome = Outcome.UPSTREAM_ERROR
                    yield _error_frame("api_error", f"provider {provider!r}: {violation.message}")
                return
            except StreamInterrupted as exc:
                outcome = Outcome.TIMEOUT if exc.timeout else Outcome.UPSTREAM_ERROR
                metrics.upstream_errors.labels(provider, "timeout_error" if exc.timeout else "api_error").inc()
                kind = "timeout_error" if exc.timeout else "api_error"
                yield _error_frame(kind, f"provider {provider!r}: {exc}")
                return
    except (asyncio.CancelledError, GeneratorExit):
        outcome = Outcome.CLIENT_CANCELLED
        raise
    finally:
        tally.record(outcome)
        await _close(opened.batches, opened.stream)


async def _close(batches: AsyncGenerator[list[WireEvent]], stream: EventStream) -> None:
    try:
        await batches.aclose()
    finally:
        await stream.aclose()


def _error_frame(error_type: str, message: str) -> bytes:
    event = error_event(error_type, message)
    return frame_header(event.type) + event.data + b"\n\n"


class _UsageOnly(msgspec.Struct):
    usage: UsageView | None = None


_decode_usage_only = msgspec.json.Decoder(_UsageOnly).decode


async def _first_answer(
    route: Route, request: ProxyRequest, metrics: Metrics, tally: UsageTally, *, count: bool
) -> JsonReply:
    last: GatewayError | None = None
    for position, target in enumerate(route.targets):
        tally.provider, tally.model = target.provider, target.upstream_model(request.model)
        try:
            if count:
                return await target.adapter.count_tokens(request, tally.model)
            return await target.adapter.complete(request, tally.model)
        except GatewayError as exc:
            metrics.upstream_errors.labels(target.provider, exc.error_type).inc()
            last = exc
            if not (exc.retryable and position + 1 < len(route.targets)):
                raise
    assert last is not None
    raise last


async def complete(route: Route, request: ProxyRequest, metrics: Metrics, tally: UsageTally) -> JsonReply:
    """A non-streamed message: the provider's JSON, forwarded as it came; usage read from it."""
    try:
        reply = await _first_answer(route, request, metrics, tally, count=False)
    except GatewayError as exc:
        tally.record(_outcome_of(exc))
        raise
    except (asyncio.CancelledError, GeneratorExit):
        tally.record(Outcome.CLIENT_CANCELLED)
        raise
    try:
        usage = _decode_usage_only(reply.body).usage
    except msgspec.DecodeError:
        usage = None
    if usage is not None:
        tally.usage = usage_of(usage)
    tally.record(Outcome.COMPLETED)
    return reply


async def count_tokens(route: Route, request: ProxyRequest, metrics: Metrics, tally: UsageTally) -> JsonReply:
    return await _first_answer(route, request, metrics, tally, count=True)

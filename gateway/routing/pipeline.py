"""From a routed request to the client's bytes: open a target (falling over to the next one only while
nothing has been sent), then validate → tally → frame every event on its way out.

The response starts only once the provider's first events are in hand, so failures before that keep
their real HTTP status. After that a failure can only end the stream with one ``error`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from adapters.base import NOT_JSON, EventStream, JsonReply
from gateway.observability.metrics import Metrics
from gateway.observability.tracing import new_attempt
from gateway.observability.usage import Outcome, UsageTally
from gateway.routing.balance import TargetHealth, hinted_delay
from gateway.routing.resilience import Resilience
from gateway.routing.table import Route, Target
from gateway.wire.errors import (
    GatewayError,
    UpstreamConnectionError,
    UpstreamStatusError,
    UpstreamTimeout,
    error_frame,
    status_for_error_type,
)
from gateway.wire.events import Batch, EventView, UsageView
from gateway.wire.request import ProxyRequest
from gateway.wire.sse import encode_frames, is_ascii
from gateway.wire.upstream import StreamInterrupted
from gateway.wire.usage_fold import usage_of
from gateway.wire.validate import KNOWN_EVENTS, State, StreamValidator, Violation

__all__ = [
    "OpenStream",
    "Resilience",
    "complete",
    "count_tokens",
    "open_stream",
    "outcome_of",
    "stream_body",
]

if TYPE_CHECKING:
    from gateway.context import RequestContext
    from gateway.observability.tracing import AttemptSpan, RequestTrace

_KNOWN = frozenset(KNOWN_EVENTS)


class OpenStream:
    """A provider stream whose first events have arrived and not yet been sent."""

    __slots__ = ("batches", "clock", "first", "stream", "target")

    def __init__(
        self,
        target: Target,
        stream: EventStream,
        batches: AsyncGenerator[Batch],
        first: Batch,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.stream = stream
        self.batches = batches
        self.first = first
        self.clock = clock  # the clock the target's breaker runs on


def outcome_of(exc: GatewayError) -> str:
    """The metrics outcome of a request that failed before its response started."""
    return Outcome.TIMEOUT if exc.error_type == "timeout_error" else Outcome.UPSTREAM_ERROR


T = TypeVar("T")


async def _attempts(
    route: Route,
    request: ProxyRequest,
    metrics: Metrics,
    tally: UsageTally,
    res: Resilience,
    attempt: Callable[[Target, str, float], Awaitable[T]],
    *,
    hold: bool = False,
    panic: bool = False,
) -> T:
    """Try the route's targets in the order its balancer gives, within the attempt budget and the request's
    ``total_s``: a retryable failure moves to the next target at once; a second try of the same target waits as
    the retry policy says (``retry-after``, ``x-should-retry``, backoff). A non-retryable failure ends the
    request. ``attempt(target, model, seconds_left)`` makes one try.

    When no target is available the panic rule applies (``gateway.routing.balance``): every target, the one free
    soonest first, and the client gets what the provider answers — never an answer made up in its place."""
    context = tally.context
    if context.deadline is None:
        context.deadline = res.clock() + res.total_s
    deadline = context.deadline
    order = [] if panic else route.plan(res.clock())
    trace = context.trace
    if not order:
        panic = True
        order = route.panic_order(res.clock())
        metrics.panics.labels(route.alias).inc()
        context.panic = True
    budget = res.policy.max_attempts
    last: GatewayError | None = None
    tried = 0
    previous: Target | None = None
    for n in range(budget * len(order)):
        if tried >= budget:
            break
        target = order[n % len(order)]
        if last is not None and not await _before_next(
            route,
            metrics,
            res,
            last,
            tried,
            previous,
            target,
            again=target is previous or n >= len(order),
            deadline=deadline,
        ):
            break
        health = target.health
        lease = health.acquire(res.clock(), force=panic)
        if lease is None:
            continue
        tried += 1
        context.attempts += 1
        previous = target
        tally.provider, tally.model = target.provider, target.upstream_model(request.model)
        tally.model_label = target.model or ""  # never the client's own name: it would be a label value
        span = _attempt_span(trace, request, target, tally.model)
        started = res.clock()
        health.begin()
        try:
            result = await attempt(target, tally.model, deadline - started)
        except GatewayError as exc:
            health.end()
            metrics.upstream_errors.labels(target.provider, exc.error_type).inc()
            last = exc
            if span is not None:
                _failed_span(span, exc, tally.context)
            if not exc.retryable:
                raise
            _record_retryable(health, exc, res.clock())
            continue
        except BaseException:
            health.end()
            raise
        finally:
            health.release(lease)
            tally.context.dropped = request.dropped  # what this attempt's provider was not sent
        waited = res.clock() - started
        tally.upstream_wait = waited
        context.failed("")  # (traced) an earlier attempt's failure is not the request's
        health.record_success(res.clock(), ttft_s=waited)
        if not hold:  # a stream stays in flight on its target until stream_body ends it
            health.end()
        return result
    if last is None:  # every planned target lost its probe slot to another request meanwhile: go anyway
        return await _attempts(route, request, metrics, tally, res, attempt, hold=hold, panic=True)
    if tried > 1:
        last.headers["x-should-retry"] = "false"  # the gateway spent its attempts: the SDK should not multiply them
    raise last


def _attempt_span(trace: RequestTrace | None, request: ProxyRequest, target: Target, model: str) -> AttemptSpan | None:
    """A traced attempt's CLIENT span, its ``traceparent`` set for the provider (None: not traced)."""
    if trace is None:
        return None
    span = request.span = new_attempt(trace, target.provider, target.adapter.kind, model)
    request.traceparent = span.traceparent
    return span


def _failed_span(span: AttemptSpan, exc: GatewayError, context: RequestContext) -> None:
    span.fail(exc.error_type, exc.status_code if isinstance(exc, UpstreamStatusError) else 0)
    if context.trace is not None:
        context.trace.error_type = exc.error_type  # the request's, unless a later attempt answers


async def _before_next(
    route: Route,
    metrics: Metrics,
    res: Resilience,
    last: GatewayError,
    tried: int,
    previous: Target | None,
    target: Target,
    *,
    again: bool,
    deadline: float,
) -> bool:
    """Between two attempts: trying a target ``again`` waits as the retry policy says, if that ends before
    the request's deadline; another target is tried at once (a fallback, counted). False: stop here."""
    if again:
        delay = res.policy.decide(_status_of(last), last.headers, tried, rng=res.rng)
        if delay is None or res.clock() + delay >= deadline:
            return False
        await res.sleep(delay)
    elif res.clock() >= deadline:
        return False
    if previous is not None and previous is not target:
        metrics.fallbacks.labels(route.alias, previous.provider, target.provider, last.error_type).inc()
    return True


def _record_retryable(health: TargetHealth, exc: GatewayError, now: float) -> None:
    """A 429 is the provider asking for time, not failing: the target is throttled for its ``retry-after``.
    Every other retryable failure counts against the target's breaker."""
    if exc.status_code == 429:
        health.throttle(now, hinted_delay(exc.headers))
    else:
        health.record_failure(now)


def _status_of(exc: GatewayError) -> int | None:
    if isinstance(exc, UpstreamConnectionError | UpstreamTimeout):
        return None  # no answer at all: retryable as a connect error or timeout
    return exc.status_code


async def open_stream(
    route: Route, request: ProxyRequest, metrics: Metrics, tally: UsageTally, res: Resilience | None = None
) -> OpenStream:
    """A started stream from the first target that yields its first events within the first-event timeout."""
    res = res or _DEFAULT

    async def attempt(target: Target, model: str, left: float) -> OpenStream:
        stream: EventStream | None = None
        batches: AsyncGenerator[Batch] | None = None
        try:
            async with asyncio.timeout(min(res.first_event_s, left)):
                stream = await target.adapter.open_stream(request, model)
                batches = stream.batches()
                first: Batch = await anext(batches, _EMPTY)
            failure = _early_error(first)
        except TimeoutError:
            failure = UpstreamTimeout(
                f"provider {target.provider!r} sent no event within {res.first_event_s:g} s"
                if res.first_event_s <= left
                else f"the request exceeded the gateway's total timeout of {res.total_s:g} s"
            )
        except StreamInterrupted as exc:
            failure = UpstreamConnectionError(f"provider {target.provider!r}: {exc}")
        except BaseException:
            if stream is not None:
                await _close(batches, stream)
            raise
        if failure is None:
            assert stream is not None and batches is not None
            return OpenStream(target, stream, batches, first, res.clock)
        if stream is not None:
            await _close(batches, stream)
        raise failure

    return await _attempts(route, request, metrics, tally, res, attempt, hold=True)


_EMPTY = Batch([], [])


def _early_error(first: Batch) -> GatewayError | None:
    """A stream that fails before its first real event can still get a proper HTTP status."""
    if not first.views:
        return UpstreamConnectionError("provider closed the stream before its first event")
    head = first.views[0]
    if head.type == "error" and head.error is not None:
        etype = head.error.type
        status = status_for_error_type(etype)
        body = b'{"type":"error","error":' + _error_json(first.datas[0]) + b"}"
        return UpstreamStatusError(status, etype, head.error.message, body=body)
    return None


class _ErrorOnly(msgspec.Struct):
    error: msgspec.Raw = msgspec.Raw(b"{}")


_decode_error_only = msgspec.json.Decoder(_ErrorOnly).decode


def _error_json(data: bytes) -> bytes:
    return bytes(_decode_error_only(data).error)


def check_utf8(batch: Batch, sent: int) -> None:
    """``Violation`` (rule ``utf8``) at the first of the batch's first ``sent`` events whose bytes are not UTF-8: a
    client's SDK would fail to decode it, so it never goes out. Its ``at`` stops the batch there, as the
    validator's violations do."""
    for i, data in enumerate(batch.datas[:sent]):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            violation = Violation("utf8", "an event that is not valid UTF-8")
            violation.at = i
            raise violation from None


async def stream_body(opened: OpenStream, metrics: Metrics, tally: UsageTally) -> AsyncIterator[bytes]:
    """The client's SSE body: one write per upstream read; ``error`` (never ``message_stop``) on failure. Each
    batch is checked (``_check``), folded into the tally (``_track``) and forwarded (``_forward``); the stream
    ends at its last event, or with ``error`` when the provider's body ends early or breaks (``_next``)."""
    validator = StreamValidator()
    provider = opened.target.provider
    context = tally.context
    outcome: str | None = None  # set when the stream ends; still None if the client went away first
    batch: Batch | None = opened.first
    output = context.trace.output if context.trace is not None else None  # (capture_content) the answer's text
    try:
        while batch is not None:
            sent, failure = _check(batch, validator, metrics, provider)
            if failure:
                outcome = Outcome.INVALID_STREAM
            _track(batch.views, sent, tally, metrics, provider)
            if output is not None:
                output.feed(batch.datas[:sent])
            if validator.state >= State.DONE:
                context.last_chunk = True  # the client's response can end with this chunk
                if outcome is None:
                    outcome = Outcome.COMPLETED if validator.state is State.DONE else Outcome.UPSTREAM_ERROR
            out = _forward(batch, sent, failure)
            if out:
                context.sent = (out, batch) if out is batch.raw else None  # the chunk is the whole batch
                yield out
            if validator.state >= State.DONE:
                return
            batch, ended, tail = await _next(opened, validator, metrics, provider)
            if ended is not None:
                outcome = ended
            if tail:
                yield tail
    except Exception:
        outcome = Outcome.INTERNAL_ERROR  # a bug: the edge's error boundary logs it and ends the stream
        raise
    finally:
        await _settle(opened, validator, outcome, tally)


def _check(batch: Batch, validator: StreamValidator, metrics: Metrics, provider: str) -> tuple[int, bytes]:
    """How many of the batch's events may go out, and the ``error`` frame that replaces the rest (b"" if none)."""
    views = batch.views
    try:
        sent = validator.check_all(views)
        raw = batch.raw
        if not (is_ascii(raw) if raw is not None else all(d.isascii() for d in batch.datas)):
            check_utf8(batch, sent)  # rare: only a batch with non-ASCII bytes is decoded
    except Violation as violation:
        metrics.violations.labels(provider, violation.rule).inc()
        validator.fail()
        return violation.at, error_frame("api_error", f"invalid stream from provider: {violation.message}")
    return sent, b""


def _track(views: list[EventView], sent: int, tally: UsageTally, metrics: Metrics, provider: str) -> None:
    """Fold the events that go out into the tally (cheap: only the first delta and the usage-bearing events are
    observed); count event types the gateway does not know."""
    seen = None  # a delta already handled: the same view again (the decode's cache shares them) needs nothing
    for view in views if sent == len(views) else views[:sent]:
        if view is seen:
            continue
        etype = view.type
        if etype == "content_block_delta":
            if tally.first_token_at is None:
                tally.observe(view)
            seen = view
        elif etype in _KNOWN:
            tally.observe(view)
        else:
            metrics.unknown_events.labels(provider, etype).inc()


def _forward(batch: Batch, sent: int, failure: bytes) -> bytes:
    """The bytes that go to the client for a batch: its own when all of it goes out, else the events that may go
    out re-framed, then the ``error`` frame."""
    if sent == len(batch.views) and batch.raw is not None:
        return batch.raw
    if sent or failure:
        return (encode_frames(batch.views[:sent], batch.datas[:sent]) if sent else b"") + failure
    return b""


async def _next(
    opened: OpenStream, validator: StreamValidator, metrics: Metrics, provider: str
) -> tuple[Batch | None, str | None, bytes]:
    """The provider's next batch; or, at its end, ``(None, outcome, error frame)``: a body that ended before the
    stream was complete, or broke, ends the client's stream with ``error``."""
    try:
        return await anext(opened.batches), None, b""
    except StopAsyncIteration:
        try:
            validator.finish()
        except Violation as violation:
            metrics.violations.labels(provider, violation.rule).inc()
            return None, Outcome.UPSTREAM_ERROR, error_frame("api_error", f"provider {provider!r}: {violation.message}")
        return None, None, b""
    except StreamInterrupted as exc:
        kind = "timeout_error" if exc.timeout else "api_error"
        metrics.upstream_errors.labels(provider, kind).inc()
        outcome = Outcome.TIMEOUT if exc.timeout else Outcome.UPSTREAM_ERROR
        return None, outcome, error_frame(kind, f"provider {provider!r}: {exc}")


async def _settle(opened: OpenStream, validator: StreamValidator, outcome: str | None, tally: UsageTally) -> None:
    """However the stream ended: the target's health, the tally's outcome, the provider's body closed (or read to
    its end, in the background when it is not all here yet, so the connection goes back to the pool)."""
    health = opened.target.health
    health.end()
    if outcome in (Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT, Outcome.INVALID_STREAM):
        health.record_failure(opened.clock())
    tally.record(outcome or tally.context.cancel_outcome)  # None: the client went away (or was let go) first
    if validator.state is not State.DONE:
        await _close(opened.batches, opened.stream)
    elif opened.stream.at_eof():  # the provider's body is all here: finishing it waits for nothing
        await _finish(opened)
    else:
        _drain_later(opened)


_DRAINS: set[asyncio.Task[None]] = set()
DRAIN_SECONDS = 2.0


def _drain_later(opened: OpenStream) -> None:
    """After ``message_stop`` the provider's body is all but over (the chunked terminator is often in
    the next read). Read it to its end in the background, so the connection goes back to the pool
    instead of being dropped, without holding the client's response open for it."""
    task = asyncio.get_running_loop().create_task(_drain(opened))
    _DRAINS.add(task)
    task.add_done_callback(_DRAINS.discard)


async def _drain(opened: OpenStream) -> None:
    with contextlib.suppress(TimeoutError):  # _finish closes however it ends
        async with asyncio.timeout(DRAIN_SECONDS):
            await _finish(opened)


async def _finish(opened: OpenStream) -> None:
    """Read the provider's body to its end (the connection goes back to the pool), then close."""
    try:
        async for _ in opened.batches:
            pass
    except (StreamInterrupted, GatewayError):
        pass
    finally:
        await _close(opened.batches, opened.stream)


async def _close(batches: AsyncGenerator[Batch] | None, stream: EventStream) -> None:
    try:
        if batches is not None:
            await batches.aclose()
    finally:
        await stream.aclose()


class _UsageOnly(msgspec.Struct):
    usage: UsageView | None = None
    # the message's id, model and stop reason (the span's gen_ai.response.*): any JSON, so a provider's odd value
    # is not an error here (it reaches the span only when it is a string)
    id: Any = ""
    model: Any = ""
    stop_reason: Any = None


_decode_usage_only = msgspec.json.Decoder(_UsageOnly).decode


async def _first_answer(
    route: Route, request: ProxyRequest, metrics: Metrics, tally: UsageTally, res: Resilience, *, count: bool
) -> JsonReply:
    async def attempt(target: Target, model: str, left: float) -> JsonReply:
        try:
            async with asyncio.timeout(left):
                if count:
                    return await target.adapter.count_tokens(request, model)
                return await target.adapter.complete(request, model)
        except TimeoutError:
            raise UpstreamTimeout(
                f"provider {target.provider!r} did not answer within the gateway's total timeout of {res.total_s:g} s"
            ) from None

    return await _attempts(route, request, metrics, tally, res, attempt)


async def complete(
    route: Route, request: ProxyRequest, metrics: Metrics, tally: UsageTally, res: Resilience | None = None
) -> JsonReply:
    """A non-streamed message: the provider's JSON, forwarded as it came; usage read from it."""
    try:
        reply = await _first_answer(route, request, metrics, tally, res or _DEFAULT, count=False)
    except GatewayError as exc:
        tally.status = exc.status_code
        tally.upstream_request_id = exc.upstream_request_id
        tally.record(outcome_of(exc))
        raise
    except (asyncio.CancelledError, GeneratorExit):
        tally.record(Outcome.CLIENT_CANCELLED)
        raise
    try:
        answer = _decode_usage_only(reply.body)  # (a whole parse: the answer's JSON is checked here)
    except msgspec.DecodeError:
        tally.status = 502
        tally.record(Outcome.UPSTREAM_ERROR)
        raise UpstreamStatusError(
            502, "api_error", f"provider {tally.provider!r} {NOT_JSON}", request_id=reply.request_id
        ) from None
    trace = tally.context.trace
    if trace is not None and trace.output is not None:  # (telemetry.otlp.capture_content) the answer, for the span
        trace.output.message(reply.body)
    usage = answer.usage
    if usage is not None:
        tally.usage = usage_of(usage)
    if answer.id or answer.model or answer.stop_reason:
        tally.response_id, tally.response_model, tally.finish_reason = (
            v if isinstance(v, str) else "" for v in (answer.id, answer.model, answer.stop_reason)
        )
    tally.status = reply.status
    tally.upstream_request_id = reply.request_id
    tally.record(Outcome.COMPLETED)
    return reply


async def count_tokens(
    route: Route, request: ProxyRequest, metrics: Metrics, tally: UsageTally, res: Resilience | None = None
) -> JsonReply:
    return await _first_answer(route, request, metrics, tally, res or _DEFAULT, count=True)


_DEFAULT = Resilience()

"""The Messages-shaped routes — ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` — as one plain ASGI
edge.

Every token a company streams passes here, so these routes skip the framework's request and response
machinery (Litestar's per-request task group, handler signature and response objects measured ~0.15-0.3 ms
per stream, a large share of the whole per-stream budget; see docs/benchmarks.md). The other routes stay
Litestar handlers (``gateway/http/routes.py``). One edge function serves both: authenticate, read the body, parse,
authorise, route, record — so both leave one access line and one outcome, and share one error boundary.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from adapters.base import JsonReply
from gateway.context import DRAIN_CANCEL, Reply, RequestContext
from gateway.governance import overage
from gateway.governance.keys import authorize
from gateway.governance.limits import BudgetExceeded, RateLimited, check_priced
from gateway.http.server import BODY_RECEIVED, DISCONNECT_HOOK, DisconnectHook
from gateway.observability.usage import Outcome, UsageTally
from gateway.routing import pipeline
from gateway.wire.errors import GatewayError, RequestTooLarge, error_frame, new_request_id
from gateway.wire.request import (
    check_betas,
    check_max_tokens,
    check_model_name,
    client_id,
    parse_count_tokens,
    parse_messages,
    proxy_request,
    read_body,
)

if TYPE_CHECKING:
    from gateway.core import Gateway
    from gateway.routing.table import Route
    from gateway.runtime import Runtime
    from surfaces import Call

__all__ = [
    "DRAIN_CANCEL",
    "ClientTimeout",
    "Overloaded",
    "messages_endpoint",
    "method_not_allowed",
    "send_error",
    "send_internal_error",
]

log = logging.getLogger("gateway")


Scope = dict[str, Any]
Receive = Any
Send = Any

_JSON_TYPE = (b"content-type", b"application/json")
_ROUTES = {False: "/v1/messages", True: "/v1/messages/count_tokens"}
_NOSNIFF = (b"x-content-type-options", b"nosniff")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    _NOSNIFF,
]


class ClientTimeout(GatewayError):
    """The client went silent for ``server.client_timeout_s`` while sending its body (nginx's
    ``client_body_timeout``): answered 408, and the connection is closed."""

    status_code = 408
    error_type = "timeout_error"


class Overloaded(GatewayError):
    """``server.max_inflight`` requests are in flight in this process: the excess is shed at once."""

    status_code = 529
    error_type = "overloaded_error"


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


def _encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


async def _send_json(send: Send, status: int, body: bytes, headers: Mapping[str, str], reply: Reply) -> None:
    raw = [_JSON_TYPE, _NOSNIFF, (b"content-length", str(len(body)).encode()), *_encode_headers(headers)]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    reply.started = True
    await send({"type": "http.response.body", "body": body, "more_body": False})
    reply.ended = True


async def send_error(send: Send, exc: GatewayError, request_id: str, reply: Reply | None = None) -> None:
    """``exc`` in the Anthropic envelope, with its status and ``GatewayError.response_headers``."""
    await _send_json(send, exc.status_code, exc.render(request_id), exc.response_headers(request_id), reply or Reply())


_INTERNAL = "internal gateway error"


async def send_internal_error(send: Send, request_id: str, reply: Reply) -> None:
    """The error boundary's answer to an exception nothing else handled: ``500 api_error`` in the envelope
    before the response started; after it, the stream's one ``error`` event and its end."""
    if reply.ended:
        return
    if not reply.started:
        await send_error(send, GatewayError(_INTERNAL), request_id, reply)
        return
    await send({"type": "http.response.body", "body": error_frame("api_error", _INTERNAL), "more_body": False})
    reply.ended = True


class _ClientGone(Exception):
    """The client disconnected before its request body was complete."""


async def method_not_allowed(gw: Gateway, scope: Scope, send: Send, *, allow: str, call: Call | None = None) -> None:
    tally = _tally(gw, gw.runtime, scope, _headers(scope))
    if call is not None:  # in the surface's shape
        send = call.wrap(send, tally.context)
    error = GatewayError(f"{scope['method']} is not allowed on {scope['path']}; use {allow}")
    error.status_code, error.error_type = 405, "invalid_request_error"
    error.headers["allow"] = allow
    tally.status = 405
    tally.record(Outcome.REJECTED)
    await send_error(send, error, tally.context.request_id)


async def _body_chunks(receive: Receive, silence_s: float) -> AsyncIterator[bytes]:
    """The request body's chunks; ``ClientTimeout`` once nothing arrived for ``silence_s``."""
    while True:
        try:
            async with asyncio.timeout(silence_s):
                message = await receive()
        except TimeoutError:
            raise ClientTimeout(
                f"the request body stalled: nothing arrived for {silence_s:g} s", headers={"connection": "close"}
            ) from None
        if message["type"] == "http.disconnect":
            raise _ClientGone
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def _read(scope: Scope, receive: Receive, headers: Mapping[str, str], silence_s: float, limit: int) -> bytes:
    """The request body. When the server says it has all arrived (``gateway.http.server.BODY_RECEIVED``, the usual
    case) one ``receive`` returns it, with no timer; otherwise each read may wait at most ``silence_s``."""
    if scope.get(BODY_RECEIVED):
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        body: bytes = message.get("body", b"")
        if len(body) > limit:
            raise RequestTooLarge(f"request body is {len(body)} bytes; the limit is {limit}")
        return body
    return await read_body(_body_chunks(receive, silence_s), headers.get("content-length"), limit)


def _tally(gw: Gateway, runtime: Runtime, scope: Scope, headers: Mapping[str, str]) -> UsageTally:
    """The request's context (ids, the runtime it is served by) and the tally that records its usage."""
    context = RequestContext(
        request_id=new_request_id(),
        method=scope["method"],
        path=scope["path"],
        session_id=_client_id(gw, headers, "x-claude-code-session-id"),
        agent_id=_client_id(gw, headers, "x-claude-code-agent-id"),
        runtime=runtime,
    )
    tracer = gw.tracer
    if tracer is not None:  # its trace: the caller's (traceparent) or a new one
        context.trace = tracer.start(headers)
    return UsageTally(gw.metrics, alias="", context=context, recorder=gw.recorder)


def _client_id(gw: Gateway, headers: Mapping[str, str], name: str) -> str:
    """A session or agent id as the ledger keeps it; a value that is no id is dropped and counted."""
    value = client_id(headers.get(name, ""))
    if value is None:
        gw.metrics.client_ids_dropped.labels(name).inc()
        return ""
    return value


async def messages_endpoint(
    gw: Gateway, scope: Scope, receive: Receive, send: Send, *, count: bool = False, call: Call | None = None
) -> None:
    """``POST /v1/messages`` (``count=False``) or ``POST /v1/messages/count_tokens``; or a Bedrock- or
    Vertex-shaped ``call`` (``surfaces``), whose body is made canonical once read and whose answer goes out
    through its own ``send``. Sheds the request at once when ``server.max_inflight`` are already in flight;
    everything that escapes is answered ``500 api_error``."""
    headers = _headers(scope)
    runtime = gw.runtime  # taken once: this request's keys, routes and settings, whatever reloads meanwhile
    tally = _tally(gw, runtime, scope, headers)
    context = tally.context
    if call is not None:
        send, count = call.wrap(send, context), call.count
    context.count = count
    if context.trace is not None:  # the SERVER span's http.route: the route's template, never a model id
        context.trace.route = call.route if call is not None else _ROUTES[count]
    if count:
        tally.timed = False  # a token count is not a message: no latency histograms
    limit = runtime.settings.server.max_inflight
    if limit is not None and gw.active >= limit:
        tally.status = 529
        context.limit = "server max_inflight"
        tally.record(Outcome.SHED)
        overloaded = Overloaded(
            f"the gateway is at its limit of {limit} requests in flight; retry shortly", headers={"retry-after": "1"}
        )
        await send_error(send, overloaded, context.request_id)
        return
    gw.active += 1
    runtime.enter()
    try:
        await _serve(gw, runtime, scope, receive, send, headers, tally, count=count, call=call)
    except Exception:
        log.exception("unhandled error on %s %s (request %s)", scope["method"], scope["path"], context.request_id)
        tally.status = tally.status or 500
        tally.record(Outcome.INTERNAL_ERROR)
        await send_internal_error(send, context.request_id, context.reply)
    finally:
        runtime.leave()
        gw.active -= 1


async def _admit(gw: Gateway, runtime: Runtime, context: RequestContext, route: Route, model: str) -> None:
    """The request's lease on its limits and budgets, and their headers; a budget holds only what can be priced."""
    key = context.key
    if gw.limiter.budgeted(runtime.settings, key):
        check_priced(route, model, gw.metrics.price_of)
    try:
        context.lease, limit_headers = await gw.limiter.admit(runtime.settings, key)
    except (RateLimited, BudgetExceeded) as exc:
        context.limit = exc.limit  # named on the access line
        raise
    context.response_headers.update(limit_headers)


async def _standing(gw: Gateway, runtime: Runtime, context: RequestContext) -> None:
    """A token count spends nothing and is never refused, but a signed-in person's answer still says where they
    stand under their spend caps (``gateway.governance.overage``)."""
    key = context.key
    if key is not None and key.session:
        caps = await gw.limiter.caps(runtime.settings, key)
        context.response_headers.update(overage.allowed_headers(caps or []))


async def _serve(
    gw: Gateway,
    runtime: Runtime,
    scope: Scope,
    receive: Receive,
    send: Send,
    headers: dict[str, str],
    tally: UsageTally,
    *,
    count: bool,
    call: Call | None = None,
) -> None:
    context = tally.context
    rid, reply = context.request_id, context.reply
    try:
        client_auth, key = await gw.identity.authenticate(runtime, headers)
        context.key = key
        server = runtime.settings.server
        body = await _read(scope, receive, headers, server.client_timeout_s, server.max_request_bytes)
        check_betas(headers.get("anthropic-beta"))  # the client's header (a Bedrock body's list: the surface checks it)
        if call is not None:  # a Bedrock- or Vertex-shaped request: the Messages body it stands for
            body = call.canonical(body, headers, runtime.routes)
        head = None
        if count:
            model, stream, max_tokens = parse_count_tokens(body).model, False, None
        else:
            head = parse_messages(body)
            model, stream, max_tokens = head.model, bool(head.stream), head.max_tokens
        check_model_name(model)
        context.stream = stream
        context.traced(model, body, head)
        route = runtime.routes.resolve(model)
        tally.alias = route.alias  # routed: from here the request has a ledger row, whatever its outcome
        authorize(key, route, model)
        clamped = max_tokens is not None and route.max_tokens is not None and max_tokens > route.max_tokens
        if clamped and route.max_tokens_policy == "clamp":
            context.response_headers["x-gateway-max-tokens-clamped"] = f"{max_tokens} -> {route.max_tokens}"
        elif max_tokens is not None:
            check_max_tokens(max_tokens, route.max_tokens, model)
        if not count:  # a token count is never limited: it is how clients stay under a limit
            await _admit(gw, runtime, context, route, model)
        else:
            await _standing(gw, runtime, context)
    except GatewayError as exc:
        tally.status = exc.status_code
        context.failed(exc.error_type)
        tally.record(Outcome.CLIENT_TIMEOUT if isinstance(exc, ClientTimeout) else Outcome.REJECTED)
        await send_error(send, exc, rid, reply)
        return
    except _ClientGone:
        tally.record(Outcome.CLIENT_CANCELLED)
        return
    tally.alias = route.alias
    query = scope.get("query_string", b"").decode("latin-1")
    request = proxy_request(
        headers,
        query,
        body=body,
        model=model,
        stream=stream,
        client_auth=client_auth,
        request_id=rid,
        forward=server.forward_headers,
    )
    if "x-gateway-max-tokens-clamped" in context.response_headers:  # max_tokens_policy: clamp
        request.rewrite({"max_tokens": route.max_tokens})
    tally.begin()
    task = asyncio.current_task()
    assert task is not None
    # From here a client that goes away cancels the work, whatever it is waiting for: the provider's JSON,
    # its first event, or the next one. Cancelling closes the upstream request (and records the usage so far).
    # The gateway's server protocol calls the hook when the connection is lost; under another server a task
    # waits on receive() for the disconnect.
    watch = _Watch(scope, receive, task)
    try:
        gw.streams[task] = context  # the drain deadline ends what is still waiting: a JSON answer, a first event
        try:
            if not stream:
                answer = await (pipeline.count_tokens if count else pipeline.complete)(
                    route, request, gw.metrics, tally, runtime.resilience
                )
                await _send_answer(send, answer, tally, reply, recorded=not count)
                return
            opened = await pipeline.open_stream(route, request, gw.metrics, tally, runtime.resilience)
        except GatewayError as exc:
            tally.status = exc.status_code
            tally.upstream_request_id = exc.upstream_request_id
            tally.record(pipeline.outcome_of(exc))
            await send_error(send, exc, rid, reply)
            return
        except asyncio.CancelledError as exc:
            if exc.args and exc.args[0] == DRAIN_CANCEL and not reply.started and not watch.client_left():
                task.uncancel()  # still waiting for the provider at the drain's deadline: answered, never cut
                shutting = Overloaded("the gateway is shutting down; retry the request")
                tally.status = shutting.status_code
                tally.record(Outcome.TIMEOUT)
                await send_error(send, shutting, rid, reply)
                return
            tally.record(Outcome.CLIENT_CANCELLED)
            raise
        finally:
            gw.streams.pop(task, None)
        extra = {
            "request-id": rid,
            **_provider_headers(opened.stream.headers, context),
            "x-gateway-provider": tally.provider,
            **context.response_headers,
        }
        tally.upstream_request_id = opened.stream.request_id
        ping_s = route.ping_interval_s or server.ping_interval_s
        deadline = tally.started + runtime.resilience.total_s
        body_iter = pipeline.stream_body(opened, gw.metrics, tally)
        gw.streams[task] = context
        try:
            await _stream(
                send, body_iter, _SSE_HEADERS + _encode_headers(extra), tally, ping_s=ping_s, deadline=deadline
            )
        finally:
            gw.streams.pop(task, None)
    except asyncio.CancelledError:
        if not watch.client_left():
            raise  # cancelled from elsewhere (server shutdown): not ours to swallow
        task.uncancel()
    finally:
        watch.stop()


_UNIFIED_STATUS = overage.PREFIX + "status"


def _provider_headers(headers: Mapping[str, str], context: RequestContext) -> Mapping[str, str]:
    """The provider's response headers for the client. A signed-in person under a spend cap gets the gateway's
    usage-limit headers (``gateway.governance.overage``) and none of the provider's own ``anthropic-ratelimit-*``:
    an organisation's quota must not reach them as theirs."""
    if _UNIFIED_STATUS not in context.response_headers:
        return headers
    return {name: value for name, value in headers.items() if not name.lower().startswith("anthropic-ratelimit-")}


async def _send_answer(send: Send, answer: JsonReply, tally: UsageTally, reply: Reply, *, recorded: bool) -> None:
    """A JSON answer (a message, a token count) as the provider gave it. ``recorded``: the pipeline has
    recorded it already (a message's usage); a token count is recorded here, with no usage (what it counts
    was not spent)."""
    if not recorded:
        tally.status = answer.status
        tally.upstream_request_id = answer.request_id
        tally.record(Outcome.COMPLETED)
    tally.first_byte()
    context = tally.context
    headers = {
        "request-id": context.request_id,
        **_provider_headers(answer.headers, context),
        "x-gateway-provider": tally.provider,
        **context.response_headers,
    }
    await _send_json(send, answer.status, answer.body, headers, reply)


class _Watch:
    """Cancels the request's task when its client goes away: called by the gateway's server protocol through
    the scope's ``DisconnectHook``, or, under another server, by a task waiting on ``receive()``."""

    __slots__ = ("_hook", "_task", "_watcher", "happened")

    def __init__(self, scope: Scope, receive: Receive, task: asyncio.Task[Any]) -> None:
        self._task = task
        self.happened = False
        self._hook: DisconnectHook | None = scope.get(DISCONNECT_HOOK)
        self._watcher: asyncio.Future[bool] | None = None
        if self._hook is not None:
            self._hook.callback = self._gone
        else:
            self._watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, task))

    def _gone(self) -> None:
        self.happened = True
        self._task.cancel()

    def client_left(self) -> bool:
        return self.happened if self._watcher is None else _client_left(self._watcher)

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self._hook is not None:
            self._hook.callback = None


def _client_left(watcher: asyncio.Future[bool]) -> bool:
    return watcher.done() and not watcher.cancelled() and watcher.result()


_PING = b'event: ping\ndata: {"type": "ping"}\n\n'


class _Keepalive:
    """One timer per stream (not per event): while nothing has been written for ``interval`` seconds it sends
    a ``ping``; at the request's deadline it cancels the stream, which then ends with a ``timeout_error``."""

    __slots__ = (
        "deadline",
        "done",
        "handle",
        "interval",
        "last",
        "loop",
        "pinging",
        "send",
        "sending",
        "tally",
        "task",
        "timed_out",
    )

    def __init__(
        self, send: Send, task: asyncio.Task[Any], interval: float, deadline: float, tally: UsageTally
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.tally = tally
        self.send = send
        self.task = task
        self.interval = interval
        self.deadline = deadline  # time.monotonic() based, as the tally's clock
        self.last = self.loop.time()
        self.sending = False
        self.done = False
        self.timed_out = False
        self.pinging: asyncio.Task[None] | None = None  # the ping being written, referenced until it ends
        self.handle = self.loop.call_later(self._next_delay(), self._tick)

    def _next_delay(self) -> float:
        due = self.last + self.interval - self.loop.time()
        left = self.deadline - time.monotonic()
        return max(0.0, min(due, left))

    def _tick(self) -> None:
        if self.done:
            return
        if time.monotonic() >= self.deadline:
            self.timed_out = True
            self.tally.context.cancel_outcome = Outcome.TIMEOUT
            self.task.cancel()
            return
        if self.loop.time() - self.last >= self.interval * 0.999 and not self.sending:
            self.sending = True
            self.pinging = self.loop.create_task(self._ping())
            self.last = self.loop.time()
        self.handle = self.loop.call_later(self._next_delay() or self.interval, self._tick)

    async def _ping(self) -> None:
        try:
            if not self.done:
                await self.send({"type": "http.response.body", "body": _PING, "more_body": True})
        except (OSError, RuntimeError):
            # the client is gone (OSError), or the stream's last write went out while this ping waited for the
            # socket (the server refuses a body message after the end): the stream's own path ends it
            pass
        finally:
            self.sending = False
            self.pinging = None

    def wrote(self) -> None:
        self.last = self.loop.time()

    def stop(self) -> None:
        self.done = True
        self.handle.cancel()


async def _stream(
    send: Send,
    body: Any,
    headers: list[tuple[bytes, bytes]],
    tally: UsageTally,
    *,
    ping_s: float,
    deadline: float,
) -> None:
    """Send the SSE body, one ASGI message per chunk, with pings while the provider is silent."""
    task = asyncio.current_task()
    assert task is not None
    context = tally.context
    reply = context.reply
    keepalive: _Keepalive | None = None
    try:
        # The first chunk is made before the head goes out: from here on the body generator has started,
        # so its `finally` (close the upstream, record usage) runs however the response ends.
        first = await anext(body, b"")
        tally.status = 200
        tally.first_byte()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        reply.started = True  # (an ASGI send either writes its message or, cancelled, writes nothing)
        if context.last_chunk:  # the whole stream came in one read: one write, the body's end included
            await body.aclose()  # usage and outcome recorded before the client sees the end
            await send({"type": "http.response.body", "body": first, "more_body": False})
            reply.ended = True
            return
        keepalive = _Keepalive(send, task, ping_s, deadline, tally)
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
        async for chunk in body:
            keepalive.wrote()
            if context.last_chunk:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        else:
            chunk = b""
        keepalive.stop()
        await body.aclose()  # usage and outcome recorded before the client sees the end
        await send({"type": "http.response.body", "body": chunk, "more_body": False})
        reply.ended = True
    except asyncio.CancelledError as exc:
        if keepalive is not None and keepalive.timed_out:
            error_type, message = (
                "timeout_error",
                f"the request exceeded the gateway's total timeout of {deadline - tally.started:g} s",
            )
        elif exc.args and exc.args[0] == DRAIN_CANCEL:
            error_type, message = "overloaded_error", "the gateway is shutting down; retry the request"
        else:
            raise
        task.uncancel()
        await body.aclose()  # records the usage so far
        if reply.ended:
            return
        if not reply.started:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            reply.started = True
        await send({"type": "http.response.body", "body": error_frame(error_type, message), "more_body": False})
        reply.ended = True
    finally:
        if keepalive is not None:
            keepalive.stop()
        await body.aclose()


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any]) -> bool:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return True

"""``POST /v1/messages`` as a plain ASGI endpoint.

Every token a company streams passes here, so this one route skips the framework's request and
response machinery (Litestar's per-request task group, handler signature and response objects
measured ~0.15-0.3 ms per stream, a large share of the whole per-stream budget; see
docs/benchmarks.md). The other routes stay Litestar handlers (``gateway/api.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from gateway import pipeline
from gateway.edge import authenticate, authorize, check_max_tokens, proxy_request, read_body
from gateway.errors import GatewayError, error_frame, new_request_id
from gateway.request import parse_messages
from gateway.usage import Outcome, UsageTally

if TYPE_CHECKING:
    from gateway.app import Gateway

__all__ = ["DRAIN_CANCEL", "messages_endpoint", "method_not_allowed"]

DRAIN_CANCEL = "gateway shutting down"  # the cancel message of streams ended by the shutdown drain

Scope = dict[str, Any]
Receive = Any
Send = Any

_JSON_TYPE = (b"content-type", b"application/json")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


def _encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


async def _send_json(send: Send, status: int, body: bytes, headers: Mapping[str, str]) -> None:
    raw = [_JSON_TYPE, (b"content-length", str(len(body)).encode()), *_encode_headers(headers)]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_error(send: Send, exc: GatewayError, request_id: str) -> None:
    headers = {"request-id": request_id, **exc.headers}
    await _send_json(send, exc.status_code, exc.render(request_id), headers)


class _ClientGone(Exception):
    """The client disconnected before its request body was complete."""


async def method_not_allowed(scope: Scope, send: Send, *, allow: str) -> None:
    rid = new_request_id()
    error = GatewayError(f"{scope['method']} is not allowed on {scope['path']}; use {allow}")
    error.status_code, error.error_type = 405, "invalid_request_error"
    error.headers["allow"] = allow
    await _send_error(send, error, rid)


async def _body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def messages_endpoint(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    headers = _headers(scope)
    rid = new_request_id()
    tally = UsageTally(gw.metrics, alias="")
    tally.request_id = rid
    try:
        client_auth, key = authenticate(gw.keys, headers)
        limit = gw.settings.server.max_request_bytes
        body = await read_body(_body_chunks(receive), headers.get("content-length"), limit)
        head = parse_messages(body)
        route = gw.routes.resolve(head.model)
        authorize(key, route, head.model)
        check_max_tokens(head.max_tokens, route.max_tokens, head.model)
    except GatewayError as exc:
        tally.status = exc.status_code
        tally.record(Outcome.REJECTED)
        await _send_error(send, exc, rid)
        return
    except _ClientGone:
        tally.record(Outcome.CLIENT_CANCELLED)
        return
    tally.alias = route.alias
    stream = bool(head.stream)
    query = scope.get("query_string", b"").decode("latin-1")
    request = proxy_request(
        headers,
        query,
        body=body,
        model=head.model,
        stream=stream,
        client_auth=client_auth,
        request_id=rid,
        forward=gw.settings.server.forward_headers,
    )
    tally.begin()
    task = asyncio.current_task()
    assert task is not None
    # From here a client that goes away cancels the work, whatever it is waiting for: the provider's JSON,
    # its first event, or the next one. Cancelling closes the upstream request (and records the usage so far).
    watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, task))
    try:
        try:
            if not stream:
                reply = await pipeline.complete(route, request, gw.metrics, tally, gw.resilience)
                tally.first_byte()
                await _send_json(
                    send,
                    reply.status,
                    reply.body,
                    {"request-id": rid, **reply.headers, "x-gateway-provider": tally.provider},
                )
                return
            opened = await pipeline.open_stream(route, request, gw.metrics, tally, gw.resilience)
        except GatewayError as exc:
            tally.status = exc.status_code
            tally.upstream_request_id = exc.headers.get("request-id", "")
            tally.record(pipeline.outcome_of(exc))
            await _send_error(send, exc, rid)
            return
        except BaseException:
            tally.record(Outcome.CLIENT_CANCELLED)
            raise
        extra = {"request-id": rid, **opened.stream.headers, "x-gateway-provider": tally.provider}
        tally.upstream_request_id = opened.stream.headers.get("request-id", "")
        ping_s = route.ping_interval_s or gw.settings.server.ping_interval_s
        deadline = tally.started + gw.resilience.total_s
        body_iter = pipeline.stream_body(opened, gw.metrics, tally)
        gw.streams[task] = tally
        try:
            await _stream(
                send, body_iter, _SSE_HEADERS + _encode_headers(extra), tally, ping_s=ping_s, deadline=deadline
            )
        finally:
            gw.streams.pop(task, None)
    except asyncio.CancelledError:
        if not _client_left(watcher):
            raise  # cancelled from elsewhere (server shutdown): not ours to swallow
        task.uncancel()
    finally:
        watcher.cancel()


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
            self.tally.cancel_outcome = Outcome.TIMEOUT
            self.task.cancel()
            return
        if self.loop.time() - self.last >= self.interval * 0.999 and not self.sending:
            self.sending = True
            self.loop.create_task(self._ping())
            self.last = self.loop.time()
        self.handle = self.loop.call_later(self._next_delay() or self.interval, self._tick)

    async def _ping(self) -> None:
        try:
            if not self.done:
                await self.send({"type": "http.response.body", "body": _PING, "more_body": True})
        except Exception:
            pass
        finally:
            self.sending = False

    def wrote(self) -> None:
        self.last = self.loop.time()

    def stop(self) -> None:
        self.done = True
        self.handle.cancel()


async def _stream(
    send: Send, body: Any, headers: list[tuple[bytes, bytes]], tally: UsageTally, *, ping_s: float, deadline: float
) -> None:
    """Send the SSE body, one ASGI message per chunk, with pings while the provider is silent."""
    task = asyncio.current_task()
    assert task is not None
    keepalive: _Keepalive | None = None
    try:
        # The first chunk is made before the head goes out: from here on the body generator has started,
        # so its `finally` (close the upstream, record usage) runs however the response ends.
        first = await anext(body, b"")
        tally.status = 200
        tally.first_byte()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if tally.last_chunk:  # the whole stream came in one read: one write, the body's end included
            await body.aclose()  # usage and outcome recorded before the client sees the end
            await send({"type": "http.response.body", "body": first, "more_body": False})
            return
        keepalive = _Keepalive(send, task, ping_s, deadline, tally)
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
        async for chunk in body:
            keepalive.wrote()
            if tally.last_chunk:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        else:
            chunk = b""
        keepalive.stop()
        await body.aclose()  # usage and outcome recorded before the client sees the end
        await send({"type": "http.response.body", "body": chunk, "more_body": False})
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
        if keepalive is None:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": error_frame(error_type, message), "more_body": False})
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

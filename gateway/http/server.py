"""uvicorn's httptools protocol with the limits a hostile client needs and httptools does not have.

httptools (llhttp) buffers a request head of any size — 100,000 headers, a 256 MiB header (accumulated by
repeated concatenation: quadratic) — and uvicorn waits for a head for ever: a client that opens a connection
and sends half a request line holds it until it closes it. ``GuardedHttpToolsProtocol`` adds, before anything
else reads the head:

- ``server.max_header_bytes`` (request line and headers) and ``server.max_headers`` (header fields): over either,
  ``431`` in the Anthropic envelope and the connection closed. The size is counted on the bytes received while
  a head is being read, so a head that never ends is cut off within one socket read of the limit.
- ``server.client_timeout_s``: the longest silence while a head is being received (nginx's
  ``client_header_timeout``): then the connection is closed (the head is incomplete: no request to answer). The
  same silence while the body is being received is the Messages edge's 408 (``gateway.http.messages``). The timer
  never runs while a response is in flight (the client is silent then because it waits for it).
- ``server.keep_alive_timeout_s``: how long an idle connection is kept between requests (nginx's
  ``keepalive_timeout``, 75 s), longer than the clients' own idle expiry (httpx 5 s, undici 4 s) and a load
  balancer's (ALB 60 s), so that the client, not the gateway, closes an idle connection: no request is sent
  into a close.
- a malformed request gets its ``400`` in the envelope too, not uvicorn's plain text.

The limits are read from the running gateway's settings (``GatewayApp``) at each connection, so a reload
applies to new connections. Every rejection leaves an access line, as every request does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from gateway.observability.usage import Outcome, access_line, access_log
from gateway.wire.errors import envelope, error_headers, new_request_id

__all__ = [
    "BODY_RECEIVED",
    "DISCONNECT_HOOK",
    "PROTOCOL",
    "DisconnectHook",
    "GatewayCycle",
    "GuardedHttpToolsProtocol",
    "HeaderLimits",
]

log = logging.getLogger("gateway")

PROTOCOL = "gateway.http.server:GuardedHttpToolsProtocol"  # uvicorn's `http=` setting for this protocol
BODY_RECEIVED = "gateway.body_received"
DISCONNECT_HOOK = "gateway.disconnect_hook"
"""A scope key this protocol sets to a ``DisconnectHook``: the edge puts a callback in it that the protocol calls
when the connection is lost while the request is served — instead of a task per request waiting on
``receive()`` for ``http.disconnect`` (what the edge still does under another server)."""
"""A scope key this protocol sets when the whole request body has arrived before the app reads it (the usual
case: head and body in one read): the edge then reads it without a silence timer. A hint only: without it
(another server) the edge times every read."""


class HeaderLimits:
    __slots__ = ("head_timeout_s", "keep_alive_timeout_s", "max_header_bytes", "max_headers")

    def __init__(
        self,
        max_header_bytes: int = 64 * 1024,
        max_headers: int = 100,
        head_timeout_s: float = 60.0,
        keep_alive_timeout_s: float = 75.0,
    ) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.head_timeout_s = head_timeout_s
        self.keep_alive_timeout_s = keep_alive_timeout_s


_DEFAULT_LIMITS = HeaderLimits()


def _limits_of(app: Any) -> HeaderLimits:
    """The limits of the gateway behind uvicorn's middleware (``ProxyHeadersMiddleware`` wraps the app)."""
    for _ in range(8):
        limits = getattr(app, "header_limits", None)
        if callable(limits):
            found: HeaderLimits = limits()
            return found
        app = getattr(app, "app", None)
        if app is None:
            break
    return _DEFAULT_LIMITS


_LINGER_S = 2.0  # how long a refused client's remaining bytes are read and dropped before the close


class _HeadTooLarge(Exception):
    pass


def _head_size(url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """The request line and header fields, about as sent (method and separators approximated)."""
    return len(url) + 16 + sum(len(name) + len(value) + 4 for name, value in headers)


class DisconnectHook:
    __slots__ = ("callback",)

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None  # set by the edge while it serves the request


class GatewayCycle(RequestResponseCycle):
    """uvicorn's request/response cycle with one write where uvicorn makes two: the response head is kept until
    the first body message and written with it (a JSON answer is one ``write``, a stream's head goes out with
    its first events), or at the end of the loop turn if no body follows at once — so the head never waits
    for the app. The head's fields are checked as uvicorn checks them (the same two expressions), over all
    names and all values at once instead of one search per field. Everything else is uvicorn's: the framing
    (content-length or chunked), ``connection: close``, ``HEAD``, flow control, completion."""

    _head: bytes | None = None
    _head_flush: asyncio.Handle | None = None

    async def send(self, message: Any) -> None:
        if self.response_started and not self.response_complete and message["type"] == "http.response.body":
            await self._send_body(message)
            return
        if self.response_started or message["type"] != "http.response.start":
            await super().send(message)  # uvicorn's own errors for a message out of order
            return
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        status_code = message["status"]
        headers = self.default_headers + list(message.get("headers", []))
        names = [name for name, _ in headers]
        values = [value for _, value in headers]
        if HEADER_RE.search(b"-".join(names)):  # '-' is a token character: the join adds none to find
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"\t".join(values)):  # and a tab is allowed in a value
            raise RuntimeError("Invalid HTTP header value.")
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [token.lower().strip() for token in value.split(b",")]:
                self.keep_alive = False
                has_connection_close = True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status_code not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self._head = b"".join(content)
        self._head_flush = asyncio.get_running_loop().call_soon(self._write_head)

    def _write_head(self) -> None:
        head = self._take_head()
        if head and not self.disconnected and not self.transport.is_closing():
            self.transport.write(head)

    async def _send_body(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        head = self._take_head()
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            body = b""
        elif self.chunked_encoding:
            body = b"".join((b"%x\r\n" % len(body), body, b"\r\n")) if body else b""
            if not more_body:
                body += b"0\r\n\r\n"
        elif len(body) > self.expected_content_length:
            self.transport.write(head)
            raise RuntimeError("Response content longer than Content-Length")
        else:
            self.expected_content_length -= len(body)
        if head or body:
            self.transport.write(head + body if head else body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    def _take_head(self) -> bytes:
        head, self._head = self._head, None
        if self._head_flush is not None:
            self._head_flush.cancel()
            self._head_flush = None
        return head or b""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._hook: DisconnectHook | None = None
        self._limits = _limits_of(self.app)
        # the idle time between requests before uvicorn closes the connection (server.keep_alive_timeout_s): the
        # gateway's, whatever uvicorn was configured with
        self.timeout_keep_alive = self._limits.keep_alive_timeout_s  # type: ignore[assignment]  # (uvicorn: int; any number works)
        self._in_head = True  # the next bytes belong to a request head
        self._head_bytes = 0  # bytes received while in the head
        self._header_count = 0
        self._rejection: str | None = None
        self._discarding = False  # answered and closing: what the client still sends is dropped
        self._last_read = self.loop.time()
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(
            self._limits.head_timeout_s, self._head_timeout
        )

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        cycle.__class__ = GatewayCycle  # uvicorn makes the cycle; its send is the gateway's (one write, above)
        super()._start_asgi_task(cycle, app)

    # -- the head's size and count ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._discarding:  # the parser refused the head in this read: answered once, already closing
            return
        if self._in_head and not self.transport.is_closing():  # a head still incomplete after this read
            if self._head_bytes > self._limits.max_header_bytes:
                self._reject_head(f"the request head exceeds {self._limits.max_header_bytes} bytes")
                return
            # the silence is counted from here; a head that completed in one read (the usual case) never
            # arms a timer, and neither does a read while a response is in flight: the client is silent
            # because it waits for that response (issue 29: every answer longer than the timeout was cut)
            self._last_read = self.loop.time()
            if self._head_timer is None and self._between_requests():
                self._head_timer = self.loop.call_later(self._limits.head_timeout_s, self._head_timeout)

    def on_header(self, name: bytes, value: bytes) -> None:
        # the count checked, then what uvicorn's on_header does (0.54), without an extra call per header
        self._header_count += 1
        if self._header_count > self._limits.max_headers:
            self._rejection = f"the request has more than {self._limits.max_headers} header fields"
            raise _HeadTooLarge
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        limit = self._limits.max_header_bytes
        if self._head_bytes > limit and _head_size(self.url, self.headers) > limit:
            # (only a head whose reads passed the limit can be over it: its bytes are a prefix of theirs)
            self._rejection = f"the request head exceeds {limit} bytes"
            raise _HeadTooLarge
        self._in_head = False
        self._head_bytes = self._header_count = 0  # the next head counts from 0
        if self._head_timer is not None:
            self._cancel_head_timer()
        super().on_headers_complete()
        self._hook = self.scope[DISCONNECT_HOOK] = DisconnectHook()  # type: ignore[literal-required]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.scope[BODY_RECEIVED] = True  # type: ignore[literal-required]
        self._in_head = True  # what comes next on this connection is the next request's head

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what the parser refused: a head over the limits (431) or a malformed one (400)."""
        if self._rejection is not None:
            self._reject_head(self._rejection)
        else:
            self._write_error(400, "invalid_request_error", "the request is not valid HTTP/1.1")

    def _reject_head(self, message: str) -> None:
        self._write_error(431, "invalid_request_error", f"{message}; the gateway refuses it")

    def _write_error(self, status: int, error_type: str, message: str) -> None:
        rid = new_request_id()
        body = envelope(error_type, message, rid)
        headers = error_headers(status, {}, rid)
        reason = {400: b"Bad Request", 431: b"Request Header Fields Too Large"}[status]
        head = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
        head += [b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items()]
        head += [
            b"content-type: application/json\r\n",
            b"x-content-type-options: nosniff\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self._cancel_head_timer()
        self._linger()
        self._log(rid, status, Outcome.REJECTED)

    def _linger(self) -> None:
        """Close after the answer, as nginx's lingering close does: stop writing, then read and drop what the
        client still sends for a moment. Closing at once with its bytes unread would make the kernel send a
        reset, and the client could lose the answer."""
        self._discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)

    # -- the head's silence -------------------------------------------------------------------------------------

    def _between_requests(self) -> bool:
        """No response is in flight on this connection (none started yet, or the last one is complete)."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A next head that began arriving while the response was in flight (pipelined) is timed from now;
        # otherwise uvicorn's keep-alive timer bounds the idle connection.
        if self._in_head and self._head_bytes and self._head_timer is None and not self.transport.is_closing():
            self._last_read = self.loop.time()
            self._head_timer = self.loop.call_later(self._limits.head_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing() or not self._between_requests():
            return
        silent = self.loop.time() - self._last_read
        left = self._limits.head_timeout_s - silent
        if left > 0:  # bytes arrived since the timer was set: wait for the rest of the silence
            self._head_timer = self.loop.call_later(left, self._head_timeout)
            return
        started = self._head_bytes > 0
        self.transport.close()
        if started:  # a request that stopped half-way through its head
            self._log(new_request_id(), 0, Outcome.CLIENT_TIMEOUT)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        hook = self._hook
        if hook is not None and hook.callback is not None:
            hook.callback()  # the request being served learns at once that its client is gone
        super().connection_lost(exc)

    def _log(self, request_id: str, status: int, outcome: str) -> None:
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "%s",
                access_line(request_id=request_id, method="", path="", status=status, outcome=outcome, duration=0.0),
            )

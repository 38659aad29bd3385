"""The one seam between adapters and the HTTP client that talks to providers.

Adapters call ``HttpClient.send`` and get an ``UpstreamResponse`` once the status line and headers
are in; the body is then read whole (``read``) or as it arrives (``chunks``). The client library is
the largest per-stream cost of a gateway (docs/performance-model.md §1), so it is swappable here and nowhere
else: ``AiohttpClient`` (it yields one chunk per socket read, coalescing events that arrive together),
``H1Client`` (``asyncio.Protocol`` + ``httptools``, one Python layer per read; issue 21) and
``HttpxClient`` (httpx's default transport, kept for comparison and for
environments that prefer it). Foreign exceptions become gateway errors at this boundary.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import select
import socket
import ssl
import urllib.request
import zlib
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, ItemsView, Iterator, Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from urllib.parse import unquote, urlsplit

import httptools

from gateway.wire.errors import GatewayError, UpstreamConnectionError, UpstreamTimeout

if TYPE_CHECKING:  # imported when their client is made: the default (h1) needs neither (~20 MB each)
    import aiohttp
    import httpx

__all__ = [
    "DEFAULT_CLIENT",
    "MAX_ANSWER_BYTES",
    "MAX_ERROR_BYTES",
    "AiohttpClient",
    "BodyTooLarge",
    "H1Client",
    "HttpClient",
    "HttpxClient",
    "StreamInterrupted",
    "Timeouts",
    "UnsafeHeader",
    "UpstreamResponse",
    "check_headers",
    "make_client",
]


MAX_ANSWER_BYTES = 32 * 1024 * 1024
"""The largest JSON answer read from a provider, decompressed (the API's own request limit; a message is
far smaller). A gzip that inflates past it is refused as it inflates, never held whole."""
MAX_ERROR_BYTES = 1024 * 1024
"""The largest error body read from a provider, decompressed."""


class BodyTooLarge(Exception):
    """A provider's body passed the limit ``read`` was given."""


class UnsafeHeader(GatewayError):
    """A header the gateway was about to send upstream is not one header line: its name is not an HTTP token, or
    its value holds CR, LF, NUL (or another control character but HTAB) or a character outside latin-1. Raised by
    every client behind the seam before a byte is sent (a request smuggled into the provider's connection would
    carry its key); the client gets 500 ``api_error`` (the gateway's own fault: the edge lets no such value
    through), never retried, never counted against the target's breaker."""

    status_code = 500
    error_type = "api_error"


# RFC 9110 §5.1 and §5.5: a field name is a token; a field value is VCHAR, obs-text (latin-1), SP and HTAB.
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_FIELD_VALUE = r"[\t\x20-\x7e\x80-\xff]*"
_NAME_RE = re.compile(_TOKEN)
_VALUE_RE = re.compile(_FIELD_VALUE)
_CONTROLS = bytes([*range(0x09), *range(0x0A, 0x20), 0x7F])
"""The bytes no header line holds: every control character but HTAB (CR, LF and NUL among them)."""
_SAFE_NAMES: set[str] = set()
"""Header names already seen to be tokens (a small vocabulary: the adapters' own and ``forward_headers``)."""
_MAX_SAFE_NAMES = 1024


def _unsafe(name: str) -> UnsafeHeader:
    """The error for a header ``name`` (or its value) that cannot be sent; the value is never repeated."""
    if _NAME_RE.fullmatch(name) is None:
        log.warning("refused to send an upstream header whose name is not an HTTP token")
        return UnsafeHeader("the gateway refused to send an upstream header whose name is not an HTTP token")
    log.warning("refused to send upstream header %s: its value is not one latin-1 line", name)
    return UnsafeHeader(
        f"the gateway refused to send upstream header {name!r}: its value holds a line break, a control character "
        "or a character outside latin-1"
    )


def _safe_name(name: str) -> bool:
    if name in _SAFE_NAMES:
        return True
    if _NAME_RE.fullmatch(name) is None:
        return False
    if len(_SAFE_NAMES) < _MAX_SAFE_NAMES:
        _SAFE_NAMES.add(name)
    return True


def check_headers(headers: Mapping[str, str]) -> None:
    """``UnsafeHeader`` unless every header is one line a server reads back as the same name and value; the check
    of the aiohttp and httpx clients (``_request_head`` makes the same one over the whole head at once)."""
    for name, value in headers.items():
        if not _safe_name(name) or _VALUE_RE.fullmatch(value) is None:
            raise _unsafe(name)


log = logging.getLogger("gateway")


class StreamInterrupted(Exception):
    """The provider's response body broke off after it started (reset, truncated, read timeout)."""

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class Timeouts:
    """A provider's connection settings, passed with each of its requests: the connect and read timeouts, and (the
    h1 client's pool) how many idle connections to its origin are kept (None: the client's default, sized for the
    gateway's ``server.max_inflight``) and for how long."""

    __slots__ = ("aiohttp", "connect", "idle_s", "pool", "proxy", "read")

    def __init__(
        self, connect: float, read: float, *, pool: int | None = None, idle_s: float = 15.0, proxy: str | None = None
    ) -> None:
        self.connect = connect
        self.read = read
        self.pool = pool
        self.idle_s = idle_s
        self.proxy = proxy  # the provider's ``proxy`` (an http:// URL); None: HTTPS_PROXY / HTTP_PROXY / NO_PROXY
        self.aiohttp: aiohttp.ClientTimeout | None = None  # built once, on first use


class UpstreamResponse(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Case-insensitive response headers."""
        ...

    def chunks(self) -> AsyncGenerator[bytes]:
        """The body as it arrives, one item per socket read; close it (``aclose``) when done early."""
        ...

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body, decompressed; ``BodyTooLarge`` as soon as it passes ``limit`` bytes."""
        ...

    def at_eof(self) -> bool:
        """Whether the body has arrived to its end and been read: going on with ``chunks`` reads nothing more
        (False when unknown)."""
        ...

    async def aclose(self) -> None:
        """Drop the connection if the body was not read to the end (a client went away)."""
        ...


class HttpClient(Protocol):
    async def send(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None, timeouts: Timeouts
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


# --- aiohttp ----------------------------------------------------------------------------------------------


class _AiohttpResponse:
    __slots__ = ("_resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def chunks(self) -> AsyncGenerator[bytes]:
        import aiohttp

        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            timeout = isinstance(exc, asyncio.TimeoutError)
            raise StreamInterrupted(_describe(exc, "upstream stream broke off"), timeout=timeout) from exc
        finally:
            self._resp.release()

    async def read(self, limit: int | None = None) -> bytes:
        import aiohttp

        resp = self._resp
        try:
            length = resp.content_length
            if limit is None or (length is not None and length <= limit and "content-encoding" not in resp.headers):
                return await resp.read()  # its size is known and within the limit: read it in one go
            body = bytearray()
            async for chunk in self._resp.content.iter_any():  # decompressed as it arrives
                body += chunk
                if len(body) > limit:
                    self._resp.close()
                    raise BodyTooLarge(f"the body passed {limit} bytes")
            return bytes(body)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            if isinstance(exc, asyncio.TimeoutError):
                raise UpstreamTimeout("timed out reading the upstream response") from exc
            raise UpstreamConnectionError(_describe(exc, "upstream response broke off")) from exc
        finally:
            self._resp.release()

    def at_eof(self) -> bool:
        return self._resp.content.at_eof()

    async def aclose(self) -> None:
        if not self._resp.content.at_eof():
            self._resp.close()
        else:
            self._resp.release()


class AiohttpClient:
    """Default upstream client: aiohttp, one pooled session per process."""

    def __init__(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            # A gateway must never carry one client's provider cookies into another client's request
            # (and skipping the jar saves a filter pass per request).
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=True,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self._proxies = ProxyRoutes()  # (not trust_env: see ProxyRoutes)

    async def send(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None, timeouts: Timeouts
    ) -> UpstreamResponse:
        import aiohttp

        check_headers(headers)  # aiohttp refuses CR and LF only, with a ValueError (a traceback)
        timeout = timeouts.aiohttp
        if timeout is None:
            timeout = timeouts.aiohttp = aiohttp.ClientTimeout(
                total=None, sock_connect=timeouts.connect, sock_read=timeouts.read
            )
        try:
            # never follow a redirect: no provider redirects a Messages call, and following one would carry the
            # provider key to whatever host it names (a 3xx becomes an upstream error in adapters.base)
            proxy = None
            if self._proxies.env or timeouts.proxy:
                parts = urlsplit(url)
                port = parts.port or (443 if parts.scheme == "https" else 80)
                proxy = self._proxies.url(parts.scheme, parts.hostname or "", port, timeouts.proxy)
            resp = await self._session.request(
                method, url, headers=headers, data=body, timeout=timeout, allow_redirects=False, proxy=proxy
            )
        except TimeoutError as exc:
            log.warning("timed out connecting to or waiting for %s", _host(url))
            raise UpstreamTimeout("timed out connecting to or waiting for the provider") from exc
        except aiohttp.ClientResponseError as exc:  # its parser refused the answer: reached, answered wrong
            raise _malformed(url, exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise _unreachable(url, exc) from exc
        return _AiohttpResponse(resp)

    async def aclose(self) -> None:
        await self._session.close()


# --- httpx ------------------------------------------------------------------------------------------------


class _HttpxResponse:
    __slots__ = ("_resp",)

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def chunks(self) -> AsyncGenerator[bytes]:
        import httpx

        try:
            async for chunk in self._resp.aiter_bytes():  # decoded (aiter_raw passed a gzip stream on compressed)
                yield chunk
        except httpx.TransportError as exc:
            timeout = isinstance(exc, httpx.TimeoutException)
            raise StreamInterrupted(_describe(exc, "upstream stream broke off"), timeout=timeout) from exc
        finally:
            await self._resp.aclose()

    async def read(self, limit: int | None = None) -> bytes:
        import httpx

        try:
            if limit is None:
                return await self._resp.aread()
            body = bytearray()
            async for chunk in self._resp.aiter_bytes():  # decoded as it arrives
                body += chunk
                if len(body) > limit:
                    raise BodyTooLarge(f"the body passed {limit} bytes")
            return bytes(body)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("timed out reading the upstream response") from exc
        except httpx.TransportError as exc:
            raise UpstreamConnectionError(_describe(exc, "upstream response broke off")) from exc
        finally:
            await self._resp.aclose()

    def at_eof(self) -> bool:
        return False  # httpx does not say without reading: the stream is drained in the background

    async def aclose(self) -> None:
        await self._resp.aclose()


class HttpxClient:
    """httpx on its default transport (httpcore + h11), or on another httpx transport."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        import httpx

        self._client = httpx.AsyncClient(
            transport=transport,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),  # keep no cookies (see above)
        )

    async def send(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None, timeouts: Timeouts
    ) -> UpstreamResponse:
        import httpx

        check_headers(headers)  # h11 refuses them too, but as a transport error (a 502, retried)
        timeout = httpx.Timeout(timeouts.read, connect=timeouts.connect)
        request = self._client.build_request(method, url, headers=dict(headers), content=body, timeout=timeout)
        try:
            resp = await self._client.send(request, stream=True, follow_redirects=False)  # never (see aiohttp's)
        except httpx.TimeoutException as exc:
            log.warning("timed out connecting to or waiting for %s", _host(url))
            raise UpstreamTimeout("timed out connecting to or waiting for the provider") from exc
        except httpx.TransportError as exc:
            raise _unreachable(url, exc) from exc
        return _HttpxResponse(resp)

    async def aclose(self) -> None:
        await self._client.aclose()


# --- h1: asyncio.Protocol + httptools ----------------------------------------------------------------
# A minimal HTTP/1.1 upstream client on ``asyncio.Protocol`` and ``httptools`` (issue 21): the seam's
# ``HttpClient`` with one Python layer per socket read instead of aiohttp's several.
#
# What it does, and no more: keep-alive connections pooled per (scheme, host, port), TLS with the system's
# trust store (SNI, hostname checked), the connect timeout and a read timeout that restarts with every read (one
# timer per connection, reset in ``data_received``), ``Content-Length`` and chunked bodies (``httptools``),
# ``gzip`` / ``deflate`` decompressed as the body arrives (``read(limit)`` refuses a body that inflates past its
# limit), redirects never followed (the seam's rule), no cookies, no proxies (as the aiohttp client: no
# ``trust_env``). Interim answers (``100 Continue``, ``103 Early Hints``) are skipped and their headers dropped; a
# ``101`` fails the request; chunked trailers are not headers. A connection whose answer was not read to its end is
# closed, never reused; so is one that sends a byte past its answer's end or while it is idle in the pool (its
# state, ``_HEAD`` … ``_BROKEN`` below, is checked on every read and parser callback, and an idle socket is polled
# before reuse). Select it with ``MESSAGES_GATEWAY_UPSTREAM_CLIENT=h1`` (``gateway.wire.upstream.make_client``).

DEFAULT_POOL = 1024
"""Idle connections kept per origin when neither the provider's ``pool_size`` nor ``server.max_inflight`` says:
as many as were in flight at once, up to this (a second wave as large as the first opens none; aiohttp keeps them
all). Idle ones expire after the provider's ``pool_idle_s``."""
DNS_TTL_S = 300.0
"""How long a resolved name is used (the aiohttp client was configured with ``ttl_dns_cache=300``)."""
HAPPY_EYEBALLS_DELAY_S = 0.25
"""RFC 8305 §5's recommended connection attempt delay (aiohttp's and asyncio's ``happy_eyeballs_delay``): the next
address is tried when the previous one has not connected within it, so an unreachable IPv6 address costs 0.25 s,
not the connect timeout."""
_HIGH_WATER = 1 << 20  # bytes of body held unread before the socket stops being read (the client is slow)

# A connection's state (h11 keeps one; ``_Conn.state``), checked in ``data_received`` and in each parser callback.
# An answer may be preceded by interim ones (``100 Continue``, ``103 Early Hints``: any 1xx but ``101``), which are
# skipped, their headers dropped, the connection staying in ``_HEAD``. The values are ordered so that
# ``data_received`` tells with one compare whether a byte may come now.
MAX_RESPONSE_HEAD = 64 * 1024
"""The most a provider's response head (its interim heads included) may be, as ``server.max_header_bytes`` bounds a
client's: a 64 MiB header cost 7 s of CPU in the parser's quadratic concatenation before it was bounded."""

_HEAD = 0
"""A request was sent: its answer's head is awaited (after any interim answers)."""
_BODY = 1
"""The final answer's head is in: its body is being read (a header now is a trailer: not kept)."""
_DONE = 2
"""The final answer is whole: a byte now is past its end, a protocol error (the connection is retired)."""
_IDLE = 3
"""In the pool, or not yet sent on: no answer is due, a byte now is nobody's (the connection is retired)."""
_BROKEN = 4
"""Closed: never reused."""


class MalformedResponse(ConnectionError):
    """The provider answered bytes that are not an HTTP/1.1 response (or not one this client may read): it was
    reached — an error of its answer, not of the network, and never a reason to resend."""


class _H1Headers(Mapping[str, str]):
    """Case-insensitive response headers (names kept lower-case; a repeated name keeps its last value: the
    headers the gateway reads come once)."""

    __slots__ = ("_items",)

    def __init__(self, items: dict[str, str]) -> None:
        self._items = items

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return self._items.get(name.lower(), default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> ItemsView[str, str]:  # the dict's own view: not Mapping's, which looks each name up again
        return self._items.items()


class _Conn(asyncio.Protocol):
    """One connection: the response being parsed, its body chunks, the read timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: tuple[str, str, int]) -> None:
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.poll: select.poll | None = None  # the socket, to see whether it is readable before reuse
        self.read_timeout = 0.0
        self.timeouts: Timeouts | None = None  # the provider's, of the request being answered (its pool's size)
        self.expires = 0.0  # (idle in the pool) the loop time past which it is not reused
        self.lost: Callable[[], None] | None = None  # (PoolObserver) told once, when the connection is gone
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0  # when the read timer runs: the loop time of the last read
        self._reset()

    def _reset(self) -> None:
        """Ready for the next request (no request of ours is waiting for an answer: ``_IDLE``)."""
        self.state = _IDLE
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.got = 0  # bytes of this request's answer read (a resend is safe only while it is 0)
        self.headers: dict[str, str] = {}
        self._name = ""
        self.head: asyncio.Future[None] = self.loop.create_future()
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None
        self.complete = False
        self.error: BaseException | None = None
        self.reusable = False
        self.no_body = False  # a HEAD: the answer's head is all of it, whatever its Content-Length says

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport (uvloop's is no asyncio.Transport)
        # Before an idle connection is reused, one ``poll`` with no wait tells whether its socket holds bytes (or the
        # peer's close) the loop has not read yet (as httpcore checks): a busy loop may not have read what came
        # while the connection was pooled, and those bytes would be read as the next request's answer.
        sock = transport.get_extra_info("socket")
        if sock is not None and hasattr(select, "poll"):
            self.poll = select.poll()
            self.poll.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        if self.state > _BODY:  # _DONE, _IDLE: a byte past the answer's end, or nobody's (an unsolicited response,
            self._stray()  # a 408 before a delayed close): never read, the connection never reused
            return
        if self._timer is not None:  # the silence counts from here (the timer re-arms itself for the rest)
            self._last_read = self.loop.time()
        self.got += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # pragma: no cover - a 101 fails in ``on_headers_complete`` first
            self._fail(ConnectionError("unexpected protocol upgrade"))
        except httptools.HttpParserError as exc:
            if self.complete:  # bytes past the response's end (``on_message_begin``): its body is whole
                self._stray()
            else:  # (a callback's own failure, a 101, is kept: ``_fail`` keeps the first error)
                self._fail(MalformedResponse(f"malformed HTTP response: {exc}"))
            return
        if self.state == _HEAD and self.got > MAX_RESPONSE_HEAD:  # a head still incomplete past the limit: refused
            self._fail(MalformedResponse(f"the provider's response head exceeds {MAX_RESPONSE_HEAD} bytes"))

    def _stray(self) -> None:
        """Bytes no answer of ours holds: the connection is retired (an answer already whole is still read)."""
        self.reusable = False
        self.close()

    def _ended_by_close(self) -> bool:
        """A body with neither a length nor chunks ends with the connection (HTTP/1.1 §6.3)."""
        headers = self.headers
        return (
            self.head.done()
            and self.error is None
            and "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
        )

    def eof_received(self) -> bool | None:
        self._end()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost is not None:
            self.lost()
            self.lost = None
        self.closed = True
        self.state = _BROKEN
        self._stop_timer()
        self._end(exc)

    def _end(self, exc: Exception | None = None) -> None:
        if self.complete:
            return
        if exc is None and self._ended_by_close():
            self.complete = True
            self.reusable = False
            self._wake()
            return
        self._fail(exc or ConnectionError("the connection closed before the response was complete"))

    # httptools callbacks (llhttp goes on parsing past a message's end: each checks the state)
    def on_message_begin(self) -> None:
        if self.state != _HEAD:  # a message after the final answer (in the same read): stop parsing
            raise ConnectionError("bytes after the end of the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.state == _HEAD:  # not a trailer (``_BODY``): trailers are not merged into the headers
            self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.status = self.parser.get_status_code()  # (an interim one too: the request is not retried)
        if status >= 200:
            self.state = _BODY
            if not self.head.done():
                self.head.set_result(None)
            if self.no_body:  # the answer to a HEAD has no body (RFC 9110 §9.3.2), its Content-Length notwithstanding
                self.on_message_complete()
        elif status == 101:  # this client never asks to switch: the connection is the provider's no more
            self._fail(MalformedResponse("the provider switched protocols (101) on a request that asked for none"))
            raise ConnectionError("101 Switching Protocols")  # stop parsing
        else:  # an interim answer (100 Continue, 103 Early Hints): its headers dropped, the final answer follows
            self.headers = {}

    def on_body(self, body: bytes) -> None:  # llhttp gives an interim answer no body, a 101 stops it
        if self.state != _BODY:  # a HEAD's answer is whole at its head: what follows is nobody's
            raise ConnectionError("bytes after the end of the response")
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def taken(self) -> None:
        """The body held so far was handed on: read the socket again if it was paused."""
        self.buffered = 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self._last_read = self.loop.time()  # the provider's silence counts from when it may be read again
            self.transport.resume_reading()

    def on_message_complete(self) -> None:
        if self.state != _BODY:  # the end of an interim answer (``_HEAD``): the final one is still to come
            return
        self.state = _DONE
        self.complete = True
        self.reusable = self.parser.should_keep_alive()
        self._stop_timer()
        self._wake()

    # helpers
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved: a caller that gave up does not log it
        self._wake()
        self.close()

    def _timed_out(self) -> None:
        """One timer per response, not one per read: when it fires after bytes came, it waits out the rest of
        the silence from the last read (as the server's head timer does)."""
        deadline = self._last_read + self.read_timeout
        if self.paused:  # the gateway stopped reading (its client is slow): the silence is its own, not the provider's
            deadline = self.loop.time() + self.read_timeout
        if deadline > self.loop.time():
            self._timer = self.loop.call_at(deadline, self._timed_out)
            return
        self._timer = None
        self._fail(TimeoutError("no data from the provider within the read timeout"))

    def start_timer(self, seconds: float) -> None:
        self.read_timeout = seconds
        self._stop_timer()
        self._last_read = self.loop.time()
        self._timer = self.loop.call_at(self._last_read + seconds, self._timed_out)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self.closed = True
        self.state = _BROKEN
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()


class _H1Response:
    __slots__ = ("_client", "_conn", "_decoder", "_done", "_eof", "headers", "status")

    def __init__(self, client: H1Client, conn: _Conn) -> None:
        self._client = client
        self._conn = conn
        self.status = conn.status
        self.headers: Mapping[str, str] = _H1Headers(conn.headers)
        encoding = conn.headers.get("content-encoding", "").strip().lower()
        self._decoder = _decoder(encoding)
        self._done = False
        self._eof = False

    async def _next(self) -> bytes | None:
        """The body the connection holds, handed on as one chunk once there is some; ``None`` at its end."""
        conn = self._conn
        body = conn.body
        while not body:
            if conn.complete:
                return None
            if conn.error is not None:
                raise conn.error
            conn.waiter = conn.loop.create_future()
            await conn.waiter
            conn.waiter = None
        chunk = body.popleft() if len(body) == 1 else b"".join([body.popleft() for _ in range(len(body))])
        conn.taken()
        return chunk

    async def chunks(self) -> AsyncGenerator[bytes]:
        decoder = self._decoder
        try:
            while (chunk := await self._next()) is not None:
                out = decoder.decompress(chunk) if decoder is not None else chunk
                if out:
                    yield out
        except (TimeoutError, ConnectionError, OSError, zlib.error) as exc:
            raise StreamInterrupted(
                _describe(exc, "upstream stream broke off"), timeout=isinstance(exc, TimeoutError)
            ) from exc
        finally:
            self._finish()

    async def read(self, limit: int | None = None) -> bytes:
        out = bytearray()
        decoder = self._decoder
        try:
            while (chunk := await self._next()) is not None:
                if decoder is not None:
                    chunk = decoder.decompress(chunk, (limit + 1 - len(out)) if limit is not None else 0)
                    if decoder.unconsumed_tail:
                        raise BodyTooLarge(f"the body passed {limit} bytes")
                out += chunk
                if limit is not None and len(out) > limit:
                    raise BodyTooLarge(f"the body passed {limit} bytes")
            return bytes(out)
        except TimeoutError as exc:
            raise UpstreamTimeout("timed out reading the upstream response") from exc
        except (ConnectionError, OSError, zlib.error) as exc:
            raise UpstreamConnectionError(_describe(exc, "upstream response broke off")) from exc
        finally:
            self._finish()

    def at_eof(self) -> bool:
        if self._done:
            return self._eof
        return self._conn.complete and not self._conn.body

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        conn = self._conn
        self._eof = conn.complete and not conn.body and conn.error is None
        if conn.complete and not conn.body and conn.reusable and conn.error is None and not conn.closed:
            self._client._release(conn, conn.timeouts)
        else:
            conn.close()

    async def aclose(self) -> None:
        self._finish()


class _Deflate:
    """``Content-Encoding: deflate``, which RFC 9110 §8.4.1.2 defines as zlib-wrapped and many servers send raw (as
    aiohttp reads it, ``http_parser.DeflateBuffer``): zlib when the body's first bytes decode as zlib, raw deflate
    otherwise, decided once, on the first chunk."""

    __slots__ = ("_inner",)

    def __init__(self) -> None:
        self._inner: zlib._Decompress | None = None

    @property
    def unconsumed_tail(self) -> bytes:
        return self._inner.unconsumed_tail if self._inner is not None else b""

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        inner = self._inner
        if inner is None:
            try:
                inner = zlib.decompressobj()
                out = inner.decompress(data, max_length)
            except zlib.error:  # no zlib header: raw deflate
                inner = zlib.decompressobj(-zlib.MAX_WBITS)
                out = inner.decompress(data, max_length)
            self._inner = inner
            return out
        return inner.decompress(data, max_length)


def _decoder(encoding: str) -> zlib._Decompress | _Deflate | None:
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return _Deflate()
    return None


class ProxyRefused(ConnectionError):
    """The proxy answered the ``CONNECT`` with something but 2xx (407: its credentials; 403: not allowed there)."""


class Proxy(NamedTuple):
    host: str
    port: int
    authorization: str  # a Proxy-Authorization value ("Basic …", from the URL's user:password), or ""


def parse_proxy(url: str) -> Proxy:
    """An ``http://[user:password@]host[:port]`` proxy URL (a scheme-less ``host:port`` is taken as http, as curl
    and the SDKs do); ``ValueError`` for anything else (a TLS connection to the proxy itself is not supported)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"a proxy is an http://host:port URL (HTTPS goes through it with CONNECT), not {url!r}")
    authorization = ""
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(credentials.encode()).decode("ascii")
    return Proxy(parts.hostname, parts.port or 80, authorization)


async def _tunnel(loop: asyncio.AbstractEventLoop, sock: socket.socket, host: str, port: int, proxy: Proxy) -> None:
    """Ask the proxy, on the socket connected to it, for a tunnel to ``host:port`` (RFC 9110 §9.3.6); TLS then runs
    through it end to end. ``ProxyRefused`` unless the answer is 2xx; a proxy's head is bounded as a provider's."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.authorization:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise ConnectionError(f"the proxy at {proxy.host}:{proxy.port} closed the connection before answering")
        answer += chunk
        if len(answer) > MAX_RESPONSE_HEAD:
            raise MalformedResponse(f"the proxy's answer head exceeds {MAX_RESPONSE_HEAD} bytes")
    head, _, rest = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    fields = status_line.split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not fields[1].isdigit():
        raise MalformedResponse(f"the proxy's answer to CONNECT is not HTTP/1.1: {status_line[:100]!r}")
    if not 200 <= int(fields[1]) < 300:
        raise ProxyRefused(f"the proxy at {proxy.host}:{proxy.port} refused the tunnel: {status_line[:100]}")
    if rest:  # nothing may follow a CONNECT's answer before the TLS handshake, which the client starts
        raise MalformedResponse("bytes after the proxy's answer to CONNECT")


class ProxyRoutes:
    """Which proxy a request to an origin goes through: the provider's ``proxy``, else the environment's for the
    scheme (``HTTPS_PROXY``/``HTTP_PROXY``, ``ALL_PROXY`` after them) unless ``NO_PROXY`` names the host — the
    variables as google-auth, botocore and azure-identity read them, read once, when the client is made; each
    origin's answer decided once and remembered. Both the h1 and the aiohttp client ask it (aiohttp's own
    ``trust_env`` looks up ``~/.netrc`` and the proxies in a thread on every request: three times its CPU)."""

    def __init__(self) -> None:
        self.env = urllib.request.getproxies_environment()
        self._routes: dict[tuple[str, str, int, str | None], str | None] = {}

    def url(self, scheme: str, host: str, port: int, configured: str | None) -> str | None:
        """The proxy's URL for this origin, or None: direct."""
        route = (scheme, host, port, configured)
        if route in self._routes:
            return self._routes[route]
        env = self.env
        url = configured or env.get(scheme) or env.get("all")
        if configured is None and url and urllib.request.proxy_bypass_environment(host, env):  # type: ignore[attr-defined]
            url = None
        if url is not None and "://" not in url:
            url = f"http://{url}"
        if len(self._routes) < 1024:
            self._routes[route] = url
        return url


class PoolObserver(Protocol):
    """What the h1 client tells of its pools (``gateway.observability.metrics.PoolMetrics``), per origin
    ``(scheme, host, port)``."""

    def opened(self, key: tuple[str, str, int], conn: _Conn) -> None: ...  # (sets ``conn.lost``)
    def idle(self, key: tuple[str, str, int], change: int) -> None: ...
    def reused(self, key: tuple[str, str, int]) -> None: ...


AddrInfo = tuple[Any, ...]  # getaddrinfo's (family, type, proto, canonname, sockaddr)
Resolve = Callable[[str, int], Awaitable[list[Any]]]


_PARSED: dict[str, tuple[tuple[str, str, int], str, str]] = {}
_MAX_PARSED = 1024


def parsed_url(url: str) -> tuple[tuple[str, str, int], str, str]:
    """An upstream URL's pool key ``(scheme, host, port)``, its request target (path and query) and its ``Host``
    (the netloc), parsed once per URL: a provider's URLs are few and come back with every request, and
    ``urlsplit``'s ``port`` and ``hostname`` parse the netloc again at each read. (Forgotten all at once past
    1,024 URLs; a URL ``urlsplit`` refuses raises each time, as it did.)"""
    found = _PARSED.get(url)
    if found is None:
        parts = urlsplit(url)
        scheme = parts.scheme
        key = (scheme, parts.hostname or "", parts.port or (443 if scheme == "https" else 80))
        found = (key, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), parts.netloc)
        if len(_PARSED) >= _MAX_PARSED:
            _PARSED.clear()
        _PARSED[url] = found
    return found


class H1Client:
    """The upstream client on ``asyncio.Protocol`` + ``httptools``: one pool of keep-alive connections per origin
    (LIFO, so the warmest is reused and the coldest expire), names resolved through a cache (``DNS_TTL_S``), every
    address of a name tried with Happy Eyeballs (RFC 8305, ``aiohappyeyeballs``: the library aiohttp uses).
    ``ssl_context``: instead of the system's trust store (tests with their own CA). ``pool``: idle connections kept
    per origin unless the provider's ``Timeouts.pool`` says. ``resolve``: instead of the loop's ``getaddrinfo``."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext | None = None,
        *,
        pool: int = DEFAULT_POOL,
        resolve: Resolve | None = None,
        dns_ttl_s: float = DNS_TTL_S,
    ) -> None:
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._ssl: ssl.SSLContext | None = ssl_context
        self._closed = False
        self.pool = pool
        self._resolve = resolve
        self._dns_ttl_s = dns_ttl_s
        self._dns: dict[tuple[str, int], tuple[float, list[Any]]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_every = 15.0
        self.metrics: PoolObserver | None = None  # set by the gateway: the pools in /metrics
        # HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY (either case), as google-auth, botocore and azure-identity
        # read them: read once, here; the route of each origin is decided once and remembered
        self._proxies = ProxyRoutes()
        self._parsed: dict[str, Proxy] = {}

    def _release(self, conn: _Conn, timeouts: Timeouts | None) -> None:
        idle = self._idle.setdefault(conn.key, [])
        limit = timeouts.pool if timeouts is not None and timeouts.pool is not None else self.pool
        if self._closed or timeouts is None or len(idle) >= limit:
            conn.close()
            return
        conn._reset()  # _IDLE: a byte that comes while it is pooled retires it
        conn.expires = conn.loop.time() + timeouts.idle_s
        idle.append(conn)
        if self.metrics is not None:
            self.metrics.idle(conn.key, 1)
        if self._sweep is None:
            self._sweep_every = min(self._sweep_every, timeouts.idle_s)
            self._sweep = conn.loop.call_later(self._sweep_every, self._expire)

    def _expire(self) -> None:
        """Close the connections idle past their provider's ``pool_idle_s`` (the pool is LIFO: the oldest are at
        the bottom), and look again later while any are idle."""
        self._sweep = None
        now, left = asyncio.get_running_loop().time(), 0
        for key, idle in self._idle.items():
            expired = 0
            while expired < len(idle) and idle[expired].expires <= now:
                expired += 1
            for conn in idle[:expired]:
                conn.close()
            if expired:
                del idle[:expired]
                if self.metrics is not None:
                    self.metrics.idle(key, -expired)
            left += len(idle)
        if left and not self._closed:
            self._sweep = asyncio.get_running_loop().call_later(self._sweep_every, self._expire)

    async def _addresses(self, host: str, port: int) -> list[Any]:
        """The addresses of ``host`` (a literal: itself), from the cache while it is fresh."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        found = self._dns.get((host, port))
        if found is not None and found[0] > now:
            return found[1]
        try:  # an IP literal: no lookup
            return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
        except socket.gaierror:
            pass
        infos: list[Any]
        if self._resolve is not None:
            infos = await self._resolve(host, port)
        else:
            infos = list(await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        if not infos:
            raise OSError(f"{host} has no address")
        if len(self._dns) >= 1024:
            self._dns.clear()
        self._dns[(host, port)] = (now + self._dns_ttl_s, infos)
        return infos

    def _proxy(self, scheme: str, host: str, port: int, configured: str | None) -> Proxy | None:
        url = self._proxies.url(scheme, host, port, configured)
        if url is None:
            return None
        found = self._parsed.get(url)
        if found is None:
            found = self._parsed[url] = parse_proxy(url)
        return found

    async def _connect(self, key: tuple[str, str, int], seconds: float, proxy: Proxy | None = None) -> _Conn:
        import aiohappyeyeballs

        scheme, host, port = key
        loop = asyncio.get_running_loop()
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        conn = _Conn(loop, key)
        try:
            async with asyncio.timeout(seconds):
                infos = await (
                    self._addresses(host, port) if proxy is None else self._addresses(proxy.host, proxy.port)
                )
                sock = await aiohappyeyeballs.start_connection(
                    infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S, interleave=1
                )
                try:
                    if proxy is not None and scheme == "https":
                        await _tunnel(loop, sock, host, port, proxy)
                    await loop.create_connection(
                        lambda: conn,
                        sock=sock,
                        ssl=self._ssl if scheme == "https" else None,
                        server_hostname=host if scheme == "https" else None,
                    )
                except BaseException:
                    sock.close()
                    raise
        except BaseException:
            conn.close()
            raise
        if self.metrics is not None:
            self.metrics.opened(key, conn)
        return conn

    def _pooled(self, key: tuple[str, str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        metrics = self.metrics
        while idle:
            conn = idle.pop()
            if metrics is not None:
                metrics.idle(key, -1)
            transport, poll = conn.transport, conn.poll
            if (
                conn.state == _IDLE
                and transport is not None
                and not transport.is_closing()
                and conn.expires > conn.loop.time()
                and (poll is None or not poll.poll(0))  # nothing came while it was idle that the loop has not read
            ):
                if metrics is not None:
                    metrics.reused(key)
                return conn
            conn.close()  # closed or expired meanwhile, or bytes came while it was idle that the loop has not read
        return None

    async def send(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None, timeouts: Timeouts
    ) -> _H1Response:
        key, target, netloc = parsed_url(url)
        scheme, _, port = key
        proxy = self._proxy(scheme, key[1], port, timeouts.proxy) if self._proxies.env or timeouts.proxy else None
        if proxy is not None and scheme == "http":  # plain HTTP through a proxy: the absolute form, to the proxy
            target = f"http://{netloc}{target}"
            if proxy.authorization:
                headers = {**headers, "Proxy-Authorization": proxy.authorization}
        head = _request_head(method, target, netloc, headers, body)
        for attempt in (0, 1):  # a pooled connection the provider closed meanwhile: once more on a fresh one
            conn = self._pooled(key) if attempt == 0 else None
            reused = conn is not None
            try:
                if conn is None:
                    conn = await self._connect(key, timeouts.connect, proxy)
                assert conn.transport is not None
                conn.state = _HEAD
                conn.no_body = method == "HEAD"
                conn.timeouts = timeouts
                conn.start_timer(timeouts.read)
                conn.transport.write(head + body if body else head)
                await conn.head
            except TimeoutError as exc:
                if conn is not None:
                    conn.close()
                raise UpstreamTimeout("timed out connecting to or waiting for the provider") from exc
            except (OSError, ConnectionError) as exc:
                if conn is not None:
                    conn.close()
                if isinstance(exc, MalformedResponse):  # reached, and answered wrong: said so, never resent
                    raise _malformed(url, exc) from exc
                if isinstance(exc, ProxyRefused):
                    log.warning("%s", exc)
                    raise UpstreamConnectionError(f"the proxy refused to reach the provider ({exc})") from exc
                if reused and conn is not None and conn.got == 0:
                    # not one byte answered on a stale keep-alive connection: once more on a new one. A byte of an
                    # answer (malformed, or cut) means the provider had the request: a resend could bill it twice
                    continue
                raise _unreachable(url, exc) from exc
            except asyncio.CancelledError:
                if conn is not None:
                    conn.close()
                raise
            return _H1Response(self, conn)
        raise UpstreamConnectionError(f"cannot reach the provider at {_host(url)}")  # pragma: no cover

    async def aclose(self) -> None:
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for key, idle in self._idle.items():
            for conn in idle:
                conn.close()
            if self.metrics is not None:
                self.metrics.idle(key, -len(idle))
        self._idle.clear()


def _request_head(method: str, target: str, host: str, headers: Mapping[str, str], body: bytes | None) -> bytes:
    """The request head, or ``UnsafeHeader`` when a header would not be one line of ``token: value`` in latin-1
    without control characters (``check_headers``' rule): names are looked up among those seen before, values are
    checked all at once, by one ``bytes.translate`` over the encoded head."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    seen = set()
    safe = _SAFE_NAMES
    for name, value in headers.items():
        if name not in safe and not _safe_name(name):  # a set lookup for the names seen before
            raise _unsafe(name)
        low = name.lower()
        if low in ("host", "content-length", "transfer-encoding", "connection"):
            continue
        seen.add(low)
        lines.append(f"{name}: {value}")
    if "accept-encoding" not in seen:
        lines.append("Accept-Encoding: gzip, deflate")
    if "accept" not in seen:
        lines.append("Accept: */*")
    lines.append(f"Content-Length: {len(body) if body else 0}")
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError:
        raise _refusal(headers) from None
    # one C pass: the only control bytes are the CRLF ending each line (and the head), so no value holds a line
    if len(head.translate(None, _CONTROLS)) != len(head) - 2 * (len(lines) + 1):
        raise _refusal(headers)
    return head


def _refusal(headers: Mapping[str, str]) -> UnsafeHeader:
    """The error of a head ``_request_head`` refused, naming the header at fault (the slow path)."""
    try:
        check_headers(headers)
    except UnsafeHeader as exc:
        return exc
    return UnsafeHeader("the gateway refused to send an upstream request line or Host that is not one line")


DEFAULT_CLIENT = "h1"
"""The upstream client a gateway uses unless ``MESSAGES_GATEWAY_UPSTREAM_CLIENT`` names another: ``h1`` measured
~30 % less CPU per JSON request and per paced event than aiohttp, and ~0.1 ms less added time to first token
(docs/benchmarks.md, issue 21)."""


def make_client(name: str = DEFAULT_CLIENT) -> HttpClient:
    if name == "aiohttp":
        return AiohttpClient()
    if name == "httpx":
        return HttpxClient()
    if name == "h1":
        return H1Client()
    if name == "httpx-aiohttp":  # measured in docs/benchmarks.md; needs `pip install httpx-aiohttp`
        from httpx_aiohttp import AiohttpTransport  # type: ignore[import-not-found,unused-ignore]

        return HttpxClient(AiohttpTransport())
    raise ValueError(f"unknown upstream client {name!r} (aiohttp, h1, httpx or httpx-aiohttp)")


def _unreachable(url: str, exc: BaseException) -> UpstreamConnectionError:
    """A connect failure as the client sees it: its kind, not the provider's host and port (those are logged)."""
    log.warning("cannot reach %s: %s", _host(url), _describe(exc, type(exc).__name__))
    return UpstreamConnectionError(f"cannot reach the provider ({type(exc).__name__})")


def _malformed(url: str, exc: BaseException) -> UpstreamConnectionError:
    """An answer the client could not read as HTTP/1.1: the provider was reached (not "cannot reach")."""
    log.warning("an answer from %s that is not HTTP/1.1: %s", _host(url), _describe(exc, type(exc).__name__))
    return UpstreamConnectionError(f"the provider's answer was not valid HTTP/1.1 ({type(exc).__name__})")


def _host(url: str) -> str:
    return url.split("/", 3)[2] if "://" in url else url


def _describe(exc: BaseException, prefix: str) -> str:
    detail = type(exc).__name__
    text = str(exc)
    return f"{prefix}: {detail}" + (f" ({text})" if text and len(text) < 200 else "")

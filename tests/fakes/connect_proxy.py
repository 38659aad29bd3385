"""A real HTTP forward proxy for tests, in the manner of squid in front of a corporate network: what an
``HTTPS_PROXY``/``HTTP_PROXY`` points at.

:class:`ConnectProxy` listens on 127.0.0.1 (a free port; ``proxy.url`` is ``http://127.0.0.1:PORT``) and serves
one exchange per client connection:

* ``CONNECT host:port HTTP/1.1`` (authority-form): opens a TCP connection to ``host:port``, answers
  ``HTTP/1.1 200 Connection established`` and relays bytes both ways, verbatim (TLS runs end to end inside the
  tunnel, the proxy sees none of it). A half-close (EOF) of one side is passed on to the other (``write_eof``);
  the tunnel ends when both directions have ended, or at once when either side fails (reset).
* ``METHOD http://host:port/path HTTP/1.x`` (absolute-form, plain http): forwarded to the origin in origin-form
  (``METHOD /path``), ``Host`` regenerated from the target (RFC 9112 §3.2.2), the hop-by-hop headers dropped
  (``Connection`` and the fields it names, ``Keep-Alive``, ``Proxy-Connection``, ``Proxy-Authorization``, ``TE``,
  ``Upgrade``, ``Expect``), ``Via: 1.1 connect-proxy`` added, and ``Connection: close`` as the hop's own header.
  The request body is relayed as framed (``Content-Length`` or chunked, verbatim, streamed); an
  ``Expect: 100-continue`` is answered by the proxy itself. The answer is relayed back: 1xx heads verbatim, the
  final head with its hop-by-hop headers replaced by ``Via`` and ``Connection: close``, its body verbatim (as the
  origin framed it: ``Content-Length``, chunked, or until the origin closes; none for HEAD, 204, 304), then the
  connection is closed. **No keep-alive** toward the client or the origin: one exchange per connection, which
  clients handle since every answer says ``Connection: close``. A client that goes away while the answer is
  pending (EOF or reset) makes the proxy drop its origin connection, so the origin sees the disconnect.

Refused, each answered with a small ``text/plain`` body and ``Connection: close``:

* ``auth=("user", "pass")`` set and no (or a wrong) ``Proxy-Authorization: Basic …``: ``407`` with
  ``Proxy-Authenticate: Basic realm="proxy"`` (``auth_failures`` counts them), for CONNECT and forwarding alike;
* a target port in ``refuse_ports``: ``403``;
* a target that does not resolve or refuses the connection: ``502``; one that does not answer the connect within
  ``connect_timeout_s``: ``504``; an origin that closes before a complete answer head, or sends one over 64 KiB
  or malformed: ``502``;
* a request head over ``max_head_bytes`` (64 KiB): ``431``; one not complete within ``head_timeout_s`` (10 s):
  ``408`` (a connection closed before a byte is just closed);
* origin-form requests (``GET /path``, the proxy is no origin), malformed request lines or authorities, a request
  with both ``Content-Length`` and ``Transfer-Encoding`` or a bad ``Content-Length``: ``400``; ``https://`` or
  other schemes in absolute-form (no TLS interception) and transfer codings other than ``chunked``: ``501``.

Recorded (under a lock, readable from any thread; copies): ``proxy.connects`` ("host:port" tunnelled, after the
upstream connection succeeded), ``proxy.requests`` ((method, absolute URL) forwarded, after the origin connection
succeeded), ``proxy.refused`` ((target, status) of every refusal above), ``proxy.auth_failures``; ``reset()``
forgets them.

``ConnectProxy(*, auth=None, refuse_ports=(), head_timeout_s=10.0, connect_timeout_s=10.0,
max_head_bytes=65536, port=0)``; ``proxy.url`` / ``proxy.port`` once started, ``proxy.url_with_auth(user, pw)``
gives ``http://user:pw@127.0.0.1:PORT``. Nothing limits how long the origin takes to answer or how long a tunnel
stays open (tests of upstream timeouts through the proxy must see the origin's timing); stopping the proxy ends
every connection still open.

Two ways to run it: ``async with ConnectProxy() as proxy:`` serves from the running event loop (the test's
clients must then be asynchronous, or the loop is blocked); ``with ConnectProxy() as proxy:`` (or ``start()`` /
``stop()``) serves from an event loop on its own thread, for synchronous clients (``urllib``, ``requests``, boto).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import ipaddress
import threading
from collections.abc import Iterable
from http import HTTPStatus
from types import TracebackType
from typing import Self

__all__ = ["ConnectProxy"]

_CHUNK = 65536
_VIA = b"1.1 connect-proxy"
# hop-by-hop fields (RFC 9110 §7.6.1) and what the proxy handles itself (Expect)
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "upgrade"}
)


class _Refused(Exception):
    def __init__(self, status: int, detail: str, extra: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = list(extra)


_Headers = list[tuple[str, str]]


class ConnectProxy:
    def __init__(
        self,
        *,
        auth: tuple[str, str] | None = None,
        refuse_ports: Iterable[int] = (),
        head_timeout_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        max_head_bytes: int = 64 * 1024,
        port: int = 0,
    ) -> None:
        self.auth = auth
        self.refuse_ports = frozenset(refuse_ports)
        self.head_timeout_s = head_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_head_bytes = max_head_bytes
        self.listen_port = port
        self.port = 0
        self._lock = threading.Lock()
        self._connects: list[str] = []
        self._requests: list[tuple[str, str]] = []
        self._refused: list[tuple[str, int]] = []
        self._auth_failures = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("ConnectProxy is not started")
        return f"http://127.0.0.1:{self.port}"

    def url_with_auth(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    # -- records -------------------------------------------------------------------------------------------

    @property
    def connects(self) -> list[str]:
        with self._lock:
            return list(self._connects)

    @property
    def requests(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._requests)

    @property
    def refused(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._refused)

    @property
    def auth_failures(self) -> int:
        with self._lock:
            return self._auth_failures

    def reset(self) -> None:
        with self._lock:
            self._connects.clear()
            self._requests.clear()
            self._refused.clear()
            self._auth_failures = 0

    # -- lifecycle: on the running loop --------------------------------------------------------------------

    async def astart(self) -> None:
        if self._server is not None:
            raise RuntimeError("ConnectProxy already started")
        # the reader's limit bounds readuntil: a head without its blank line within it is too large
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.listen_port, limit=self.max_head_bytes
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._closing = True
        server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
        self._closing = False

    async def __aenter__(self) -> Self:
        await self.astart()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- lifecycle: on its own thread ----------------------------------------------------------------------

    def start(self) -> Self:
        if self._thread is not None or self._server is not None:
            raise RuntimeError("ConnectProxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=self._run_loop, args=(loop,), name="connect-proxy", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.astart(), loop).result(timeout=10)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            self._loop = None
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    # -- one client connection -----------------------------------------------------------------------------

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(client_r, client_w)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            # aclose() ends connections still relaying; re-raising would make 3.11's StreamReaderProtocol log
            # "Exception in callback" (it calls task.exception() on the cancelled task)
            if not self._closing:
                raise
        finally:
            self._tasks.discard(task)
            client_w.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        target = "-"
        try:
            head = await self._read_head(client_r)
            if head is None:
                return
            method, request_target, version, headers = _parse_request_head(head)
            target = request_target
            self._check_auth(headers)
            if method == "CONNECT":
                host, port = _authority(request_target)
                target = f"{host}:{port}"
                await self._tunnel(client_r, client_w, host, port)
            else:
                await self._forward(client_r, client_w, method, request_target, version, headers)
        except _Refused as refusal:
            with self._lock:
                self._refused.append((target, refusal.status))
            with contextlib.suppress(ConnectionError, OSError):
                await _answer(client_w, refusal.status, refusal.detail, refusal.extra)

    async def _read_head(self, reader: asyncio.StreamReader) -> bytes | None:
        try:
            async with asyncio.timeout(self.head_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            if reader.at_eof() or not _buffered(reader):
                return None
            raise _Refused(408, "request head not received in time") from None
        except asyncio.LimitOverrunError:
            raise _Refused(431, "request head too large") from None
        except asyncio.IncompleteReadError:
            return None  # closed before a complete head
        if len(head) > self.max_head_bytes:
            raise _Refused(431, "request head too large")
        return head

    def _check_auth(self, headers: _Headers) -> None:
        if self.auth is None:
            return
        expected = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
        for name, value in headers:
            if name.lower() != "proxy-authorization":
                continue
            scheme, _, credentials = value.strip().partition(" ")
            if scheme.lower() == "basic" and hmac.compare_digest(credentials.strip(), expected):
                return
        with self._lock:
            self._auth_failures += 1
        raise _Refused(407, "proxy authentication required", [("Proxy-Authenticate", 'Basic realm="proxy"')])

    async def _open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if port in self.refuse_ports:
            raise _Refused(403, f"port {port} is not allowed")
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await asyncio.open_connection(host, port)
        except TimeoutError:
            raise _Refused(504, f"connecting to {host}:{port} timed out") from None
        except OSError as e:  # socket.gaierror included
            raise _Refused(502, f"cannot connect to {host}:{port}: {e}") from None

    # -- CONNECT -------------------------------------------------------------------------------------------

    async def _tunnel(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, host: str, port: int
    ) -> None:
        up_r, up_w = await self._open(host, port)
        try:
            with self._lock:
                self._connects.append(f"{_host_text(host)}:{port}")
            client_w.write(b"HTTP/1.1 200 Connection established\r\nVia: " + _VIA + b"\r\n\r\n")
            await client_w.drain()
            await _relay_both(client_r, client_w, up_r, up_w)
        finally:
            up_w.close()

    # -- absolute-form forwarding --------------------------------------------------------------------------

    async def _forward(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        method: str,
        request_target: str,
        version: str,
        headers: _Headers,
    ) -> None:
        host, port, path = _absolute_http(request_target)
        framing = _request_framing(headers)
        expect_continue = any(n.lower() == "expect" and v.strip().lower() == "100-continue" for n, v in headers)
        authority = _host_text(host) + ("" if port == 80 else f":{port}")
        kept = [(n, v) for n, v in _end_to_end(headers) if n.lower() not in ("host", "expect")]
        up_r, up_w = await self._open(host, port)
        try:
            with self._lock:
                self._requests.append((method, f"http://{authority}{path}"))
            lines = [f"{method} {path} {version}\r\n", f"Host: {authority}\r\n"]
            lines += [f"{n}: {v}\r\n" for n, v in kept]
            up_w.write("".join(lines).encode("latin-1") + b"Via: " + _VIA + b"\r\nConnection: close\r\n\r\n")
            if expect_continue and framing != 0:
                client_w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await client_w.drain()
            await _relay_body(client_r, up_w, framing)
            await up_w.drain()
            answer = asyncio.ensure_future(self._answer_back(up_r, client_w, method))
            gone = asyncio.ensure_future(_until_eof(client_r))
            try:
                done, _ = await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (answer, gone):
                    task.cancel()
                await asyncio.gather(answer, gone, return_exceptions=True)
            if answer in done:
                answer.result()  # a refusal before the answer's head: answered by _serve
        finally:
            up_w.close()

    async def _answer_back(self, up_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, method: str) -> None:
        sent_head = False
        try:
            while True:
                try:
                    head = await up_r.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    raise _Refused(502, "the origin sent no complete answer head") from None
                status_line, _, rest = head[:-4].decode("latin-1").partition("\r\n")
                status = _status_of(status_line)
                if 100 <= status < 200:
                    client_w.write(head)  # an interim answer, verbatim
                    await client_w.drain()
                    continue
                headers = _parse_fields(rest)
                lines = [status_line + "\r\n"] + [f"{n}: {v}\r\n" for n, v in _end_to_end(headers)]
                client_w.write("".join(lines).encode("latin-1") + b"Via: " + _VIA + b"\r\nConnection: close\r\n\r\n")
                sent_head = True
                await client_w.drain()
                if method == "HEAD" or status in (204, 304):
                    return
                try:
                    framing = _request_framing(headers)
                except _Refused:
                    raise _Refused(502, "the origin's answer is framed ambiguously") from None
                await _relay_body(up_r, client_w, -2 if framing == 0 and not _has_length(headers) else framing)
                return
        except _Refused:
            if sent_head:
                client_w.transport.abort()
                return
            raise
        except asyncio.IncompleteReadError:
            client_w.transport.abort()  # the origin cut the body: so does the proxy


# -- helpers -----------------------------------------------------------------------------------------------


def _buffered(reader: asyncio.StreamReader) -> bool:
    return bool(getattr(reader, "_buffer", b""))


async def _answer(writer: asyncio.StreamWriter, status: int, detail: str, extra: Iterable[tuple[str, str]]) -> None:
    body = (detail + "\n").encode()
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n", "Content-Type: text/plain; charset=utf-8\r\n"]
    lines += [f"{n}: {v}\r\n" for n, v in extra]
    lines += [f"Content-Length: {len(body)}\r\n", "Connection: close\r\n", "Via: 1.1 connect-proxy\r\n\r\n"]
    writer.write("".join(lines).encode("latin-1") + body)
    await writer.drain()


def _parse_fields(text: str) -> _Headers:
    headers: _Headers = []
    for line in text.split("\r\n") if text else []:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise _Refused(400, "malformed header field")
        headers.append((name, value.strip()))
    return headers


def _parse_request_head(head: bytes) -> tuple[str, str, str, _Headers]:
    text = head[:-4].decode("latin-1")
    request_line, _, rest = text.partition("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise _Refused(400, "malformed request line")
    return parts[0], parts[1], parts[2], _parse_fields(rest)


def _authority(text: str) -> tuple[str, int]:
    """``host:port`` (the port required, IPv6 in brackets) -> (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _Refused(400, f"bad authority {text!r}") from None
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536 or "@" in host:
        raise _Refused(400, f"bad authority {text!r}")
    return host, int(port_text)


def _absolute_http(target: str) -> tuple[str, int, str]:
    """``http://host[:port][/path?query]`` -> (host, port, origin-form path)."""
    scheme, sep, rest = target.partition("://")
    if not sep:
        raise _Refused(400, "the proxy takes absolute-form (http://host/path) or CONNECT requests")
    if scheme.lower() != "http":
        raise _Refused(501, f"{scheme}:// is not forwarded (use CONNECT)")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if not path.startswith("/"):
        path = "/" + path
    if "#" in path:
        path = path.split("#", 1)[0]
    if not authority.rpartition(":")[2].isdigit() or authority.endswith("]"):
        authority += ":80"
    host, port = _authority(authority)
    return host, port, path


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _end_to_end(headers: _Headers) -> _Headers:
    named = {token.strip().lower() for n, v in headers if n.lower() == "connection" for token in v.split(",")}
    return [(n, v) for n, v in headers if n.lower() not in _HOP_BY_HOP and n.lower() not in named]


def _has_length(headers: _Headers) -> bool:
    return any(n.lower() == "content-length" for n, _ in headers)


def _request_framing(headers: _Headers) -> int:
    """The body's framing: its length (0: none), or -1 for chunked."""
    codings = [v.strip().lower() for n, v in headers if n.lower() == "transfer-encoding"]
    lengths = {v.strip() for n, v in headers if n.lower() == "content-length"}
    if codings:
        if lengths:
            raise _Refused(400, "both Content-Length and Transfer-Encoding")
        if codings != ["chunked"]:
            raise _Refused(501, f"transfer coding {', '.join(codings)!r} not supported")
        return -1
    if not lengths:
        return 0
    if len(lengths) != 1 or not next(iter(lengths)).isdigit():
        raise _Refused(400, "bad Content-Length")
    return int(next(iter(lengths)))


def _status_of(status_line: str) -> int:
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise _Refused(502, "the origin's answer is not HTTP/1.x")
    return int(parts[1])


async def _relay_body(src: asyncio.StreamReader, dst: asyncio.StreamWriter, framing: int) -> None:
    """Relay a body verbatim: ``framing`` bytes, or chunked (-1), or until EOF (-2)."""
    if framing == -2:
        while data := await src.read(_CHUNK):
            dst.write(data)
            await dst.drain()
    elif framing == -1:
        await _relay_chunked(src, dst)
    else:
        left = framing
        while left:
            data = await src.read(min(left, _CHUNK))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            dst.write(data)
            await dst.drain()


async def _relay_chunked(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while True:
        size_line = await src.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _Refused(400, "malformed chunk size") from None
        dst.write(size_line)
        if size == 0:
            while (trailer := await src.readuntil(b"\r\n")) != b"\r\n":
                dst.write(trailer)
            dst.write(b"\r\n")
            await dst.drain()
            return
        await _relay_body(src, dst, size)
        if await src.readexactly(2) != b"\r\n":
            raise _Refused(400, "malformed chunk")
        dst.write(b"\r\n")
        await dst.drain()


async def _until_eof(reader: asyncio.StreamReader) -> None:
    """Discard what the client sends after its request, until it closes (or resets)."""
    with contextlib.suppress(ConnectionError, OSError):
        while await reader.read(_CHUNK):
            pass


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while data := await src.read(_CHUNK):
        dst.write(data)
        await dst.drain()
    if dst.can_write_eof() and not dst.is_closing():
        dst.write_eof()


async def _relay_both(
    a_r: asyncio.StreamReader, a_w: asyncio.StreamWriter, b_r: asyncio.StreamReader, b_w: asyncio.StreamWriter
) -> None:
    """Both directions until both ended with EOF (half-closes passed on); a failure of either ends both."""
    pipes = {asyncio.ensure_future(_pipe(a_r, b_w)), asyncio.ensure_future(_pipe(b_r, a_w))}
    try:
        pending = pipes
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(task.exception() is not None for task in done):
                return
    finally:
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        a_w.close()
        b_w.close()

"""A minimal Redis client for the shared rate limits: one pipelined connection on ``asyncio.Protocol``, replies
parsed by ``hiredis.Reader`` and commands packed by ``hiredis.pack_command`` (issue 21).

redis-py's asyncio client was two thirds of the limiter's cost over Redis (its pool, ``Retry``, command packing in
Python and a ``StreamReader`` under every call). This is what the limiter needs of it, no more: commands sent on
one connection as they come (Redis answers a connection's commands in order, so any number may be under way at
once, as ioredis and redis-py's own pipelines use it), a Lua script by its SHA-1 (``EVALSHA``) and by its text when
the server has not seen it (``NOSCRIPT``, e.g. after a restart), ``AUTH`` and ``SELECT`` from the URL, TLS for
``rediss://``, a Unix socket for ``unix://``.

Commands asked in one turn of the event loop go out in one write at its end (ioredis's auto-pipelining): under
load, admissions and settlements of several requests share a system call, and their replies a read.

Timeouts: one timer per connection while anything is unanswered, not one per call. A command that has waited
``timeout`` seconds (for the connection, or for its reply) fails the connection and with it every command under
way on it (``RedisUnavailable``); the next call connects again. A call is a future, so a caller that needs no answer
(the limiter's settlements) adds a callback instead of a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
from collections import deque
from typing import Any, cast

import hiredis  # small (~150 KB resident), and this module is imported only where limits.redis_url is set

from gateway.settings import Endpoint, parse_url  # the URL is config: checked when the YAML is read

__all__ = ["Endpoint", "RedisClient", "RedisUnavailable", "ReplyError", "Script", "parse_url"]


class RedisUnavailable(Exception):
    """The server cannot be reached, closed the connection, or did not answer in time."""


class ReplyError(Exception):
    """The server answered a command with an error (``-ERR …``, ``-WRONGPASS …``)."""


class Script:
    """A Lua script, called by its SHA-1 and sent whole only when the server does not know it."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text.encode()
        self.sha = hashlib.sha1(self.text).hexdigest().encode()


# One command under way: the future its reply settles (None for the connection's own AUTH / SELECT, whose error
# fails the connection), when it was asked (loop time), and the arguments of the command to send instead when the
# server answers NOSCRIPT (EVAL with the script's text in place of EVALSHA: packed only then, not for every call).
_Pending = tuple["asyncio.Future[Any] | None", float, tuple[Any, ...] | None]


class _Connection(asyncio.Protocol):
    def __init__(self, client: RedisClient) -> None:
        self._client = client
        self._reader = hiredis.Reader(replyError=ReplyError)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses

    def data_received(self, data: bytes) -> None:
        reader, client = self._reader, self._client
        try:
            reader.feed(data)
            reply = reader.gets()
            while reply is not False and client._conn is self:  # (a refused AUTH drops it mid-read)
                client._reply(reply)
                reply = reader.gets()
        except Exception as exc:  # a protocol error (hiredis.ProtocolError): nothing more on it can be trusted
            self._client._lost(self, RedisUnavailable(f"Redis protocol error: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        said = f"Redis closed the connection ({exc})" if exc else "Redis closed the connection"
        self._client._lost(self, RedisUnavailable(said))


class RedisClient:
    """Commands on one pipelined connection, made on first use and again after it is lost."""

    def __init__(self, url: str, *, timeout: float = 1.0) -> None:
        self.endpoint = parse_url(url)
        self.timeout = timeout
        self._conn: _Connection | None = None  # connected
        self._connecting: asyncio.Task[None] | None = None
        self._queued: list[bytes] = []  # packed while connecting
        self._out: list[bytes] = []  # packed in this loop turn, written together at its end
        self._pending: deque[_Pending] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # -- calls -----------------------------------------------------------------------------------------------

    def call(self, *args: Any) -> asyncio.Future[Any]:
        """Send one command; its future has the reply (``ReplyError`` for an error reply, ``RedisUnavailable``
        when there is no answer)."""
        return self._send(_pack(args), None)

    def evalsha(self, script: Script, keys: list[Any], args: list[Any]) -> asyncio.Future[Any]:
        tail = (len(keys), *keys, *args)
        return self._send(_pack((b"EVALSHA", script.sha, *tail)), (b"EVAL", script.text, *tail))

    def _send(self, packed: bytes, fallback: tuple[Any, ...] | None) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or a new event loop (a test's): nothing of the old one is usable
            if self._loop is not None:
                self._forget_loop()
            self._loop = loop
        future: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            future.set_exception(RedisUnavailable("the Redis client is closed"))
            return future
        self._push((future, loop.time(), fallback), packed)
        return future

    def _push(self, pending: _Pending, packed: bytes) -> None:
        self._pending.append(pending)
        conn = self._conn
        if conn is not None and conn.transport is not None:
            self._out.append(packed)
            if len(self._out) == 1:  # the first of this loop turn: written with the others at its end
                assert self._loop is not None
                self._loop.call_soon(self._write, conn)
        else:
            self._queued.append(packed)
            if self._connecting is None:
                assert self._loop is not None
                self._connecting = self._loop.create_task(self._connect())
        if self._timer is None:
            assert self._loop is not None
            self._timer = self._loop.call_at(pending[1] + self.timeout, self._check_time)

    def _write(self, conn: _Connection) -> None:
        if conn is not self._conn or conn.transport is None:
            return  # the connection failed meanwhile, and these commands with it (_fail)
        out, self._out = self._out, []
        conn.transport.write(out[0] if len(out) == 1 else b"".join(out))

    # -- the connection ----------------------------------------------------------------------------------------

    async def _connect(self) -> None:
        assert self._loop is not None
        end = self.endpoint
        conn = _Connection(self)
        try:
            if end.path is not None:
                await self._loop.create_unix_connection(lambda: conn, end.path)
            else:
                context = ssl.create_default_context() if end.tls else None
                await self._loop.create_connection(
                    lambda: conn, end.host, end.port, ssl=context, server_hostname=end.host if end.tls else None
                )
        except (OSError, ssl.SSLError) as exc:
            self._connecting = None
            self._fail(RedisUnavailable(f"cannot connect to Redis at {self._where()}: {exc}"))
            return
        except asyncio.CancelledError:  # closed, or timed out (_check_time) while connecting
            self._connecting = None
            if conn.transport is not None:
                conn.transport.abort()
            raise
        self._connecting = None
        assert conn.transport is not None
        hello: list[bytes] = []
        if end.password is not None:
            hello.append(_pack((b"AUTH", end.username, end.password) if end.username else (b"AUTH", end.password)))
        if end.db:
            hello.append(_pack((b"SELECT", end.db)))
        now = self._loop.time()
        for _ in hello:  # answered before everything queued, so they go first
            self._pending.appendleft((None, now, None))
        self._conn = conn
        queued, self._queued = self._queued, []
        conn.transport.write(b"".join(hello + queued))

    def _where(self) -> str:
        end = self.endpoint
        return end.path if end.path is not None else f"{end.host}:{end.port}"

    def _reply(self, reply: Any) -> None:
        future, _, fallback = self._pending.popleft()
        if future is None:  # AUTH or SELECT
            if isinstance(reply, ReplyError):
                self._drop(RedisUnavailable(f"Redis refused the connection's set-up: {reply}"))
            return
        if isinstance(reply, ReplyError):
            if fallback is not None and str(reply).startswith("NOSCRIPT"):
                assert self._loop is not None
                self._push((future, self._loop.time(), None), _pack(fallback))
                return
            if not future.done():
                future.set_exception(reply)
        elif not future.done():
            future.set_result(reply)
        if not self._pending and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_time(self) -> None:
        """Fires ``timeout`` after the oldest unanswered command was asked, or re-arms for the next oldest."""
        self._timer = None
        if not self._pending:
            return
        assert self._loop is not None
        due = self._pending[0][1] + self.timeout
        if self._loop.time() >= due:
            self._drop(RedisUnavailable(f"no answer from Redis within {self.timeout:g} s"))
        else:
            self._timer = self._loop.call_at(due, self._check_time)

    def _drop(self, error: RedisUnavailable) -> None:
        """Give up on the connection (made or being made) and every command under way on it."""
        conn, self._conn = self._conn, None
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        self._fail(error)
        if conn is not None and conn.transport is not None:
            conn.transport.abort()

    def _lost(self, conn: _Connection, error: RedisUnavailable) -> None:
        if conn is self._conn:
            self._drop(error)

    def _fail(self, error: RedisUnavailable) -> None:
        pending, self._pending = self._pending, deque()
        self._queued, self._out = [], []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for future, _, _ in pending:
            if future is not None and not future.done():
                future.set_exception(error)

    def _forget_loop(self) -> None:
        conn, self._conn, self._connecting, self._timer = self._conn, None, None, None
        self._pending, self._queued, self._out = deque(), [], []
        if conn is not None and conn.transport is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                conn.transport.abort()

    async def aclose(self) -> None:
        self._closed = True
        self._drop(RedisUnavailable("the Redis client is closed"))
        await asyncio.sleep(0)  # let the transport's close run


def _pack(args: tuple[Any, ...]) -> bytes:
    packed: bytes = hiredis.pack_command(args)
    return packed

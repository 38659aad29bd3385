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

Each connection, and each attempt at one, is an object of its own (``_Connection``) that holds the commands sent
on it and not yet answered, in order (as ioredis keeps its command queue on the connection): its replies can settle
only those. An attempt that is given up on (timed out, the client closed) is marked so, and whatever it does later
(complete, fail, unwind its cancellation) touches nothing but itself: it can neither become the client's connection
nor clear another attempt's state. At most one connection is live; one that is given up on is aborted and every
command under way on it fails (``RedisUnavailable``).

Timeouts: one timer per connection, not one per call: armed by a call when none is, it looks at the oldest
unanswered command when it fires and arms again for it (or, everything answered, lapses: cheaper than cancelling it
at every reply). A command that has waited ``timeout`` seconds (for the connection, or for its reply) fails the
connection and with it every command under way on it; the next call connects again. A connect (with its AUTH /
SELECT) has ``timeout`` seconds of its own from when it began. After a connect fails (refused, timed out, its set-up
refused or unanswered) the client waits a little before it tries again (50 ms, doubled at each failure in a row up to
1 s, jittered), and calls meanwhile fail at once: a Redis that is down (or that takes connections but answers
nothing) costs a caller no wait, and is not hammered with connects. A call is a future; a caller that needs no
answer (the limiter's settlements) sends with one ``Unawaited`` of its own in the future's place instead: no future,
callback or task a command, its failures handed to a function of the caller's (``drain`` waits for them all).

Each new connection asks ``INFO cluster`` with its set-up (in the same write as AUTH / SELECT and the first calls:
no round trip of its own) and is refused (``RedisClusterRefused``) when the server says ``cluster_enabled:1``: the
limiter's scripts touch several keys at once, which a cluster node answers with ``CROSSSLOT`` or ``MOVED``, so
every admission would fail at run time into ``on_store_error``; refused at connect, ``serve`` can say so and not
start (``gateway.cli.redis_refusal``). A server that will not answer ``INFO`` (an ACL user without ``+info``, a
proxy that does not know it) is taken as it is, not refused.

TLS (``rediss://``) is redis-py's, with its URL options: ``ssl_ca_certs`` (the CAs to trust, in place of the
system's), ``ssl_certfile`` / ``ssl_keyfile`` (a client certificate) and ``ssl_cert_reqs``. The context is the
connection's own, made at each connect: nothing process-wide changes, and certificates rotated on disk are read
at the next connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import hiredis  # small (~150 KB resident), and this module is imported only where limits.redis_url is set

from gateway.settings import Endpoint, parse_url  # the URL is config: checked when the YAML is read

__all__ = [
    "Endpoint",
    "RedisClient",
    "RedisClusterRefused",
    "RedisUnavailable",
    "ReplyError",
    "Script",
    "Unawaited",
    "parse_url",
]


class RedisUnavailable(Exception):
    """The server cannot be reached, closed the connection, or did not answer in time."""


class RedisClusterRefused(RedisUnavailable):
    """The server is a Redis Cluster node, which the limiter cannot use (module docstring); a class of its own so
    that the start-up check can refuse to start on it, and on nothing else (an unreachable Redis is
    ``on_store_error``'s)."""


class ReplyError(Exception):
    """The server answered a command with an error (``-ERR …``, ``-WRONGPASS …``)."""


class Script:
    """A Lua script, called by its SHA-1 and sent whole only when the server does not know it."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text.encode()
        self.sha = hashlib.sha1(self.text).hexdigest().encode()


class Unawaited:
    """In a future's place for the commands of a caller that awaits none of them (the limiter's settlements): a
    reply is dropped, a failure (an error reply, no answer, the connection lost) handed to ``on_error``. One stands
    for all such commands of its caller, so such a command costs no future, no callback and no loop turn when its
    reply comes."""

    __slots__ = ("on_error",)

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self.on_error = on_error

    def done(self) -> bool:
        return False

    def set_result(self, result: Any) -> None:
        return None

    def set_exception(self, exc: BaseException) -> None:
        self.on_error(exc)


# A command's future, or an Unawaited in its place
_Waiter = asyncio.Future[Any] | Unawaited
# One command under way: the future its reply settles (None for the connection's own AUTH / INFO / SELECT, whose
# error fails the connection, INFO's excepted), when it was asked (loop time), and the arguments of the command to
# send instead when the server answers NOSCRIPT (EVAL with the script's text in place of EVALSHA: packed only then,
# not for every call); for the set-up's INFO, _CLUSTER_CHECK.
_Pending = tuple["_Waiter | None", float, tuple[Any, ...] | None]
# A packed EVALSHA and the EVAL to send in its place after NOSCRIPT (RedisClient.prepare).
Prepared = tuple[bytes, tuple[Any, ...]]

_CLUSTER_CHECK = (b"INFO", b"cluster")  # works on every Redis and Valkey (CLUSTER INFO fails where cluster is off)

_RETRY_FIRST = 0.05  # seconds without a connect after one failed; doubled at each failure in a row ...
_RETRY_MAX = 1.0  # ... up to this; each jittered down to half (workers and replicas do not come back in step)


class _Connection(asyncio.Protocol):
    """One connection, or one attempt at one: the commands sent on it (or queued for it while it connects) and not
    yet answered are its own, so its replies settle only them. Once ``dead`` (given up on, lost, closed) nothing it
    does later reaches the client."""

    __slots__ = (
        "client",
        "dead",
        "out",
        "pending",
        "reader",
        "ready",
        "setup",
        "started",
        "task",
        "timer",
        "transport",
    )

    def __init__(self, client: RedisClient, started: float) -> None:
        self.client = client
        self.reader = hiredis.Reader(replyError=ReplyError)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[_Pending] = deque()  # asked and unanswered, in the order they are (or will be) sent
        self.out: list[bytes] = []  # packed, not yet written: until connected, or until the end of this loop turn
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None  # the attempt, while it runs
        self.started = started  # loop time the attempt began
        self.ready = False  # connected, its set-up sent: commands are written as they come
        self.setup = 0  # AUTH / SELECT not yet answered
        self.dead = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        if self.dead:  # given up on while the loop was making it
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        reader, client = self.reader, self.client
        try:
            reader.feed(data)
            reply = reader.gets()
            while reply is not False and not self.dead:  # (a refused AUTH drops it mid-read)
                client._reply(self, reply)
                reply = reader.gets()
        except Exception as exc:  # a protocol error (hiredis.ProtocolError), or a reply nothing was asked for
            client._drop(self, RedisUnavailable(f"Redis protocol error: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        said = f"Redis closed the connection ({exc})" if exc else "Redis closed the connection"
        if self.setup:  # before its set-up was answered (a client certificate refused): a failed connect, backed off
            self.client._connect_failed(self, f"cannot connect to Redis at {self.client._where()}: {said}")
        else:
            self.client._drop(self, RedisUnavailable(said))


class RedisClient:
    """Commands on one pipelined connection, made on first use and again after it is lost."""

    def __init__(self, url: str, *, timeout: float = 1.0) -> None:
        self.endpoint = parse_url(url)
        self.timeout = timeout
        self._conn: _Connection | None = None  # the live one: connected, or being connected
        self._tasks: set[asyncio.Task[None]] = set()  # connect attempts still running (a given-up one unwinding)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._failures = 0  # connects failed in a row
        self._retry_at = 0.0  # loop time before which no connect is tried (calls fail at once)
        self._why = ""  # the last connect's failure
        self._why_type: type[RedisUnavailable] = RedisUnavailable  # and its kind (RedisClusterRefused)

    # -- calls -----------------------------------------------------------------------------------------------

    def call(self, *args: Any) -> asyncio.Future[Any]:
        """Send one command; its future has the reply (``ReplyError`` for an error reply, ``RedisUnavailable``
        when there is no answer)."""
        return cast(asyncio.Future[Any], self._send(_pack(args), None))

    def evalsha(self, script: Script, keys: list[Any], args: list[Any]) -> asyncio.Future[Any]:
        return cast(asyncio.Future[Any], self._send(*self.prepare(script, keys, args)))

    def evalsha_unawaited(self, script: Script, keys: list[Any], args: list[Any], waiter: Unawaited) -> None:
        """``evalsha`` whose reply nobody awaits: its failure goes to ``waiter.on_error`` (at once when the client
        cannot send it: closed, or waiting after a failed connect)."""
        self._send(*self.prepare(script, keys, args), waiter)

    async def drain(self) -> None:
        """Wait until every command sent so far is answered or has failed (a ``PING`` behind them: a connection's
        replies come in order; a second behind what a ``NOSCRIPT`` sent again, whole, meanwhile); at once when none
        is under way."""
        for _ in range(2):
            conn = self._conn
            if conn is None or not conn.pending:
                return
            with contextlib.suppress(RedisUnavailable, ReplyError):
                await self.call(b"PING")

    @staticmethod
    def prepare(script: Script, keys: list[Any], args: list[Any]) -> Prepared:
        """An ``EVALSHA`` packed once, to be sent many times (``send_prepared``): a call the same every time (the
        limiter's admission of a key within a minute) costs no packing."""
        tail = (len(keys), *keys, *args)
        return _pack((b"EVALSHA", script.sha, *tail)), (b"EVAL", script.text, *tail)

    def send_prepared(self, prepared: Prepared) -> asyncio.Future[Any]:
        return cast(asyncio.Future[Any], self._send(*prepared))

    def _send(self, packed: bytes, fallback: tuple[Any, ...] | None, waiter: Unawaited | None = None) -> _Waiter:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or a new event loop (a test's): nothing of the old one is usable
            if self._loop is not None:
                self._forget_loop()
            self._loop = loop
        future: _Waiter = loop.create_future() if waiter is None else waiter
        conn = self._conn
        if conn is None:
            conn = self._open(loop, future)
            if conn is None:
                return future  # failed: closed, or waiting after a failed connect
        self._push(conn, (future, loop.time(), fallback), packed)
        return future

    def _push(self, conn: _Connection, pending: _Pending, packed: bytes) -> None:
        conn.pending.append(pending)
        out = conn.out
        out.append(packed)
        if conn.ready and len(out) == 1:  # the first of this loop turn: written with the others at its end
            assert self._loop is not None
            self._loop.call_soon(self._write, conn)
        if conn.timer is None:
            assert self._loop is not None
            conn.timer = self._loop.call_at(pending[1] + self.timeout, self._check_time, conn)

    def _write(self, conn: _Connection) -> None:
        if conn.dead:
            return  # the connection failed meanwhile, and these commands with it (_drop)
        out, conn.out = conn.out, []
        conn.transport.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[union-attr]  # ready: set

    # -- the connection ----------------------------------------------------------------------------------------

    def _open(self, loop: asyncio.AbstractEventLoop, future: _Waiter) -> _Connection | None:
        """A new attempt, made the client's connection at once (later calls queue on it); or ``None`` with
        ``future`` failed when the client is closed or waits after a failed connect."""
        if self._closed:
            future.set_exception(RedisUnavailable("the Redis client is closed"))
            return None
        now = loop.time()
        if now < self._retry_at:
            future.set_exception(self._why_type(f"{self._why} (trying again in {self._retry_at - now:.2f} s)"))
            return None
        conn = self._conn = _Connection(self, now)
        conn.timer = loop.call_at(now + self.timeout, self._check_time, conn)  # the connect's own deadline
        task = conn.task = loop.create_task(self._connect(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return conn

    async def _connect(self, conn: _Connection) -> None:
        loop = self._loop
        assert loop is not None
        end = self.endpoint
        try:
            if end.path is not None:
                await loop.create_unix_connection(lambda: conn, end.path)
            else:
                context = _tls_context(end) if end.tls else None
                await loop.create_connection(
                    lambda: conn, end.host, end.port, ssl=context, server_hostname=end.host if end.tls else None
                )
        except asyncio.CancelledError:  # given up on (_drop): timed out, or the client closed
            if conn.transport is not None:
                conn.transport.abort()
            raise
        except Exception as exc:  # OSError, ssl.SSLError (an unknown CA, a certificate file unreadable), …
            conn.task = None
            self._connect_failed(conn, f"cannot connect to Redis at {self._where()}: {exc}")
            return
        conn.task = None
        assert conn.transport is not None
        if conn.dead or conn is not self._conn:  # given up on as it completed: it is no one's
            self._drop(conn, RedisUnavailable("the Redis connection was given up on"))
            conn.transport.abort()  # (_drop did, unless it was dead already)
            return
        hello: list[bytes] = []
        setup: list[_Pending] = []
        if end.password is not None:
            hello.append(_pack((b"AUTH", end.username, end.password) if end.username else (b"AUTH", end.password)))
            setup.append((None, conn.started, None))
        hello.append(_pack(_CLUSTER_CHECK))  # before SELECT, which a cluster refuses for any db but 0
        setup.append((None, conn.started, _CLUSTER_CHECK))
        if end.db:
            hello.append(_pack((b"SELECT", end.db)))
            setup.append((None, conn.started, None))
        # answered before everything queued, so they go first; due with the connect
        conn.setup = len(hello)
        conn.pending.extendleft(reversed(setup))
        conn.ready = True
        queued, conn.out = conn.out, []
        conn.transport.write(b"".join(hello + queued))

    def _where(self) -> str:
        end = self.endpoint
        return end.path if end.path is not None else f"{end.host}:{end.port}"

    def _cluster_refusal(self) -> str:
        return (
            f"Redis at {self._where()} is a Redis Cluster node (INFO cluster: cluster_enabled:1), and Redis Cluster "
            "is not supported for limits.redis_url: each admission is one script over several keys, which a cluster "
            "refuses (CROSSSLOT) or sends elsewhere (MOVED), and the gateway's keys are not hash-tagged for one. "
            "Point it at one Redis or Valkey endpoint: a single server, or the primary of a primary with replicas "
            "(a managed Redis with cluster mode disabled)"
        )

    def _reply(self, conn: _Connection, reply: Any) -> None:
        pending = conn.pending
        future, _, fallback = pending.popleft()
        if future is None:  # AUTH, INFO cluster or SELECT
            if fallback is _CLUSTER_CHECK:
                if isinstance(reply, bytes) and b"cluster_enabled:1" in reply.splitlines():
                    self._connect_failed(conn, self._cluster_refusal(), RedisClusterRefused)
                    return
            elif isinstance(reply, ReplyError):
                self._connect_failed(conn, f"Redis refused the connection's set-up: {reply}")
                return
            conn.setup -= 1
            if not conn.setup:
                self._failures = 0
        elif isinstance(reply, ReplyError):
            if fallback is not None and str(reply).startswith("NOSCRIPT"):
                assert self._loop is not None
                self._push(conn, (future, self._loop.time(), None), _pack(fallback))
                return
            if not future.done():
                future.set_exception(reply)
        elif not future.done():
            future.set_result(reply)

    def _check_time(self, conn: _Connection) -> None:
        """Fires ``timeout`` after the attempt began while it connects, then ``timeout`` after the oldest
        unanswered command was asked (or a later one: it re-arms for the oldest, and lapses when none is left)."""
        conn.timer = None
        if conn.dead:
            return
        loop = self._loop
        assert loop is not None
        if not conn.ready:
            due = conn.started + self.timeout
            if loop.time() >= due:
                self._connect_failed(conn, f"cannot connect to Redis at {self._where()} within {self.timeout:g} s")
                return
        elif conn.pending:
            due = conn.pending[0][1] + self.timeout
            if loop.time() >= due:
                if conn.setup:  # its AUTH / INFO / SELECT unanswered: a connect that timed out, backed off as one
                    # refused is, so that a server taking connections but answering nothing costs each call no wait
                    why = (
                        f"cannot connect to Redis at {self._where()}: no answer to the set-up within {self.timeout:g} s"
                    )
                    self._connect_failed(conn, why)
                else:
                    self._drop(conn, RedisUnavailable(f"no answer from Redis within {self.timeout:g} s"))
                return
        else:
            return
        conn.timer = loop.call_at(due, self._check_time, conn)

    def _connect_failed(self, conn: _Connection, why: str, kind: type[RedisUnavailable] = RedisUnavailable) -> None:
        """The attempt failed: given up on, and no other made until a while later (longer at each failure); the
        calls meanwhile fail with the same ``kind`` of error."""
        if conn.dead:
            return
        assert self._loop is not None
        self._failures += 1
        wait = min(_RETRY_MAX, _RETRY_FIRST * 2 ** (self._failures - 1)) * (0.5 + random.random() / 2)
        self._retry_at = self._loop.time() + wait
        self._why, self._why_type = why, kind
        self._drop(conn, kind(why))

    def _drop(self, conn: _Connection, error: RedisUnavailable) -> None:
        """Give up on the connection (made or being made) and every command under way on it."""
        if conn.dead:
            return
        conn.dead = True
        if conn is self._conn:
            self._conn = None
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        if conn.task is not None:
            conn.task.cancel()  # its create_connection closes what it made; see _connect
            conn.task = None
        if conn.transport is not None:
            conn.transport.abort()
        pending, conn.pending, conn.out = conn.pending, deque(), []
        for future, _, _ in pending:
            if future is not None and not future.done():
                future.set_exception(error)

    def _forget_loop(self) -> None:
        conn, self._conn, self._tasks = self._conn, None, set()
        self._failures, self._retry_at = 0, 0.0  # the new loop's clock is not the old one's
        if conn is not None:
            conn.dead = True
            timer, task, transport = conn.timer, conn.task, conn.transport
            with contextlib.suppress(RuntimeError):  # its loop is closed
                if timer is not None:
                    timer.cancel()
            with contextlib.suppress(RuntimeError):
                if task is not None:
                    task.cancel()
            with contextlib.suppress(RuntimeError):
                if transport is not None:
                    transport.abort()

    async def aclose(self) -> None:
        """Give up on the connection, or the attempt at one, failing every call under way; and wait for any
        attempt still unwinding, so that nothing is left running."""
        self._closed = True
        if self._loop is not asyncio.get_running_loop():
            if self._loop is not None:
                self._forget_loop()
            return
        if self._conn is not None:
            self._drop(self._conn, RedisUnavailable("the Redis client is closed"))
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await asyncio.sleep(0)  # let the transport's close run


def _tls_context(end: Endpoint) -> ssl.SSLContext:
    """The context of one ``rediss://`` connection, as redis-py's SSLConnection makes it from the same URL options,
    but for ``ssl_ca_certs``: trusted alone (``cafile=``), where redis-py adds it to the system's CAs: a private CA
    names the one server the gateway may talk to. Made at each connect, so a certificate rotated on disk is read at
    the next one; nothing process-wide (the default trust store, the environment) is touched."""
    context = ssl.create_default_context(cafile=end.ssl_ca_certs)  # with no cafile: the system's CAs
    if end.ssl_cert_reqs == "none":  # no verification at all (redis-py: check_hostname off with it)
        context.check_hostname = False  # first: ssl refuses CERT_NONE while it is on
        context.verify_mode = ssl.CERT_NONE
    elif end.ssl_cert_reqs == "optional":  # on a client, verifies as CERT_REQUIRED does (the ssl module's docs)
        context.verify_mode = ssl.CERT_OPTIONAL
    if end.ssl_certfile is not None:
        context.load_cert_chain(end.ssl_certfile, end.ssl_keyfile)
    return context


def _pack(args: tuple[Any, ...]) -> bytes:
    packed: bytes = hiredis.pack_command(args)
    return packed

"""The gateway's Redis client (``gateway.governance.redis_client``) when connecting is slow: a connect that outlives
the timeout must never leave a reply to be handed to another caller (each connection settles only the calls sent on
it), the client comes back once connects go through again, and ``aclose`` leaves nothing behind.

A connect is made to hang for real: the listening socket's accept queue is kept full, so the kernel drops the
client's SYNs (as an address that drops them does) until the test opens it again."""

from __future__ import annotations

import asyncio
import random
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hiredis
import pytest
import uvloop

import gateway.governance.redis_client
from gateway.governance.redis_client import RedisClient, RedisUnavailable


class _Gate:
    """A listening socket on 127.0.0.1 that accepts (each connection served by ``serve``) or, stalled, lets new
    connects hang: its accept queue (backlog 0: one connection) held by a connection of its own, so further SYNs are
    dropped. ``cut`` aborts the connections it accepted."""

    def __init__(self, serve: Callable[[], asyncio.Protocol]) -> None:
        self._loop = asyncio.get_running_loop()
        self._serve = serve
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(0)
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]
        self._fillers: list[socket.socket] = []
        self._filler_addresses: set[Any] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._transports: list[asyncio.BaseTransport] = []
        self.accepted = 0
        self.stalled = False
        self._loop.add_reader(self._sock.fileno(), self._accept)

    def stall(self) -> None:
        self.stalled = True
        self._loop.remove_reader(self._sock.fileno())
        self._sock.listen(0)
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", self.port))
        select.select([], [filler], [], 0.1)  # in the queue (a loopback handshake is done at once)
        self._fillers.append(filler)
        self._filler_addresses.add(filler.getsockname())

    def open(self) -> None:
        self.stalled = False
        self._sock.listen(64)
        self._loop.add_reader(self._sock.fileno(), self._accept)
        for filler in self._fillers:
            filler.close()
        self._fillers = []

    def cut(self) -> None:
        for transport in self._transports:
            transport.abort()  # type: ignore[attr-defined]
        self._transports = []

    def _accept(self) -> None:
        while True:
            try:
                conn, address = self._sock.accept()
            except BlockingIOError:
                return
            if address in self._filler_addresses:
                conn.close()
                continue
            self.accepted += 1
            conn.setblocking(False)
            task = self._loop.create_task(self._loop.connect_accepted_socket(self._serve, conn))
            self._tasks.add(task)
            task.add_done_callback(self._served)

    def _served(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is None:
            self._transports.append(task.result()[0])

    async def aclose(self) -> None:
        if not self.stalled:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for filler in self._fillers:
            filler.close()
        self.cut()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await asyncio.sleep(0.01)


class _Echo(asyncio.Protocol):
    """A Redis that knows ECHO and PING, each reply sent ``delay`` seconds after the command came."""

    def __init__(self, delay: float = 0.0) -> None:
        self._delay = delay
        self._reader = hiredis.Reader()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport: Any = transport

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        out = []
        while (command := self._reader.gets()) is not False:
            name = command[0].upper()
            if name == b"ECHO":
                out.append(b"$%d\r\n%s\r\n" % (len(command[1]), command[1]))
            elif name == b"PING":
                out.append(b"+PONG\r\n")
            else:
                out.append(b"-ERR unknown command\r\n")
        asyncio.get_running_loop().call_later(self._delay, self._send, b"".join(out))

    def _send(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(data)


class _Pipe(asyncio.Protocol):
    """One connection of the proxy: forwarded to the real redis-server and back."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._upstream: Any = None
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport: Any = transport
        self._opening = asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        front = self._transport
        try:
            self._upstream, _ = await asyncio.get_running_loop().create_connection(
                lambda: _Back(front), "127.0.0.1", self._port
            )
        except OSError:
            front.abort()
            return
        if front.is_closing():
            self._upstream.abort()
        elif self._early:
            self._upstream.write(b"".join(self._early))

    def data_received(self, data: bytes) -> None:
        if self._upstream is None:
            self._early.append(data)
        else:
            self._upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._upstream is not None:
            self._upstream.abort()


class _Back(asyncio.Protocol):
    def __init__(self, front: Any) -> None:
        self._front = front

    def data_received(self, data: bytes) -> None:
        self._front.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._front.abort()


def _connects_under_way(port: int) -> int:
    """Sockets of this machine still trying to connect to ``port`` (SYN_SENT, in /proc/net/tcp)."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[2].endswith(f":{port:04X}") and line.split()[3] == "02")


def _other_tasks() -> set[asyncio.Task[Any]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


@pytest.fixture(params=["backing off", "at once"])
def retry(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The client waits a little after a connect fails before it tries again (calls meanwhile fail at once);
    "at once": no such wait, so that the next call connects again while the timed-out attempt is still unwinding."""
    if request.param == "at once":
        monkeypatch.setattr(gateway.governance.redis_client, "_RETRY_FIRST", 0.0, raising=False)
    return str(request.param)


def _connect_times_out_with_callers_in_that_turn(
    client: RedisClient, gate: _Gate, calls: dict[str, asyncio.Future[Any]], timeout: float, then: Callable[[], None]
) -> None:
    """``a`` asked while ``gate`` is stalled: its connect hangs. The loop is then busy past the timeout, so the turn
    that gives up on the connect also runs a timer of a caller's (as the limiter's delayed settlements are): it
    calls ``b``, and ``c`` right after that turn. ``then`` runs in that timer, first."""
    loop = asyncio.get_running_loop()

    def at_the_timeout() -> None:
        then()
        calls["b"] = client.call("ECHO", "b")
        loop.call_soon(lambda: calls.setdefault("c", client.call("ECHO", "c")))

    loop.call_at(loop.time() + timeout + 0.001, at_the_timeout)
    time.sleep(timeout + 0.05)  # a slow callback: the connect's deadline and the caller's timer are both due after it


def test_a_connect_that_outlives_the_timeout_hands_no_caller_another_callers_reply(retry: str) -> None:
    async def go() -> None:
        gate = _Gate(lambda: _Echo(delay=0.02))
        gate.stall()
        client = RedisClient(f"redis://127.0.0.1:{gate.port}/0", timeout=0.2)
        calls = {"a": client.call("ECHO", "a")}
        for _ in range(5):
            await asyncio.sleep(0)  # its connect under way (its SYN dropped)
        _connect_times_out_with_callers_in_that_turn(client, gate, calls, 0.2, gate.open)
        await asyncio.sleep(0.15)  # past the wait after a failed connect, if any
        for word in "defgh":
            calls[word] = client.call("ECHO", word)
            await asyncio.sleep(0.005)
        results = dict(zip(calls, await asyncio.gather(*calls.values(), return_exceptions=True), strict=True))
        for word, result in results.items():
            assert result == word.encode() or isinstance(result, RedisUnavailable), (word, result)
        assert isinstance(results["a"], RedisUnavailable)
        assert [results[word] for word in "defgh"] == [word.encode() for word in "defgh"]
        if retry == "at once":
            assert [results[word] for word in "bc"] == [b"b", b"c"]
        await client.aclose()
        await gate.aclose()

    uvloop.run(go())


def test_callers_looping_through_stalled_connects_to_a_real_redis_get_only_their_own_replies(
    redis_server: Any,
) -> None:
    """20 callers asking ``ECHO <unique>`` without a pause for 4 s through a proxy that, three times, cuts its
    connections and lets new connects hang for 0.6 s (the client's timeout: 0.2 s). Each call is asked from a timer
    and its reply awaited for at most 30 ms (as the limiter's settlements: nobody waits for them), and checked when it
    comes. No call may get another's reply; and once the proxy lets connects through, calls are answered again."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        gate = _Gate(lambda: _Pipe(redis_server.port))
        client = RedisClient(f"redis://127.0.0.1:{gate.port}/0", timeout=0.2)
        counts = {"right": 0, "wrong": 0, "failed": 0}
        wrong: list[tuple[bytes, Any]] = []
        stop = False

        def check(word: bytes, future: asyncio.Future[Any]) -> None:
            if future.exception() is not None:
                assert isinstance(future.exception(), RedisUnavailable), future.exception()
                counts["failed"] += 1
            elif future.result() == word:
                counts["right"] += 1
            else:
                counts["wrong"] += 1
                wrong.append((word, future.result()))

        def ask(word: bytes, asked: asyncio.Future[asyncio.Future[Any]]) -> None:
            future = client.call("ECHO", word)
            future.add_done_callback(lambda f: check(word, f))
            asked.set_result(future)

        async def caller(i: int) -> None:
            n = 0
            while not stop:
                n += 1
                asked: asyncio.Future[asyncio.Future[Any]] = loop.create_future()
                loop.call_later(random.random() * 0.004, ask, f"{i}-{n}".encode(), asked)
                await asyncio.wait([await asked], timeout=0.03)

        callers = [asyncio.create_task(caller(i)) for i in range(20)]
        for _ in range(3):
            await asyncio.sleep(0.3)
            gate.stall()
            gate.cut()
            await asyncio.sleep(0.6)
            gate.open()
        for _ in range(40):  # back within the longest wait after failed connects (1 s)
            await asyncio.sleep(0.05)
            try:
                assert await client.call("ECHO", "back") == b"back"
                break
            except RedisUnavailable:
                pass
        before = dict(counts)
        await asyncio.sleep(0.5)
        stop = True
        await asyncio.gather(*callers)
        await asyncio.sleep(0.1)  # the last replies
        assert counts["wrong"] == 0, (counts, wrong[:5])
        assert counts["failed"] > 0  # the stalls were felt
        assert counts["right"] - before["right"] > 100, (before, counts)  # and it came back
        assert await client.call("ECHO", "last") == b"last"
        await client.aclose()
        await gate.aclose()

    uvloop.run(go())


def test_aclose_during_a_slow_connect_leaves_no_task_and_no_connection_behind(retry: str) -> None:
    async def go() -> None:
        gate = _Gate(_Echo)
        gate.stall()  # and stays so: every connect hangs
        client = RedisClient(f"redis://127.0.0.1:{gate.port}/0", timeout=0.2)
        calls = {"a": client.call("ECHO", "a")}
        for _ in range(5):
            await asyncio.sleep(0)
        _connect_times_out_with_callers_in_that_turn(client, gate, calls, 0.2, lambda: None)
        await asyncio.sleep(0.08)  # past the wait after the failed connect, if any
        calls["d"] = client.call("ECHO", "d")  # a connect under way (again, or still: the one "b" started)
        await asyncio.sleep(0.02)
        assert _connects_under_way(gate.port) >= 1
        await client.aclose()
        assert not _other_tasks()
        assert _connects_under_way(gate.port) == 0
        results = await asyncio.gather(*calls.values(), return_exceptions=True)
        assert all(isinstance(r, RedisUnavailable) for r in results), results
        assert "closed" in str(results[-1])
        with pytest.raises(RedisUnavailable, match="closed"):
            await client.call("PING")
        await gate.aclose()

    uvloop.run(go())

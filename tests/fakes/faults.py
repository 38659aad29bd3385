"""An upstream fault injector: a TCP proxy in front of a fake provider that damages what the provider sends.

Debian packages no toxiproxy, so this is the project's own, in the same spirit: it sits between the gateway and
any fake (so one injector serves every adapter, whatever its wire format) and gives each upstream exchange one
fault, drawn from a seeded RNG:

- ``none``: passed through;
- ``latency``: the response's first byte waits a spike (50-400 ms);
- ``reset_stream``: the connection is reset (RST) once the response has passed a frame boundary;
- ``reset_frame``: the connection is reset at a random byte of the response, most often inside a frame;
- ``half_open``: after part of the response nothing more is sent, and the connection stays open;
- ``trickle``: the response goes one byte per write;
- ``refuse`` (per connection, before anything is read): the connection is reset at once.

An exchange starts where the gateway's bytes start a request line (``POST ``). ``active`` counts exchanges still
in progress: after a soak it must come back to 0, or the gateway left an upstream request hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections import Counter, deque
from types import TracebackType
from typing import Self

import httptools

__all__ = ["FAULTS", "FaultProxy"]

FAULTS = ("none", "latency", "reset_stream", "reset_frame", "half_open", "trickle")
_REQUEST_STARTS = (b"POST ", b"GET ")


class FaultProxy:
    def __init__(
        self,
        target_port: int,
        weights: dict[str, float],
        *,
        seed: int = 0,
        refuse: float = 0.0,
        frame_end: bytes = b"\n\n",
    ) -> None:
        unknown = set(weights) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}")
        self.target_port = target_port
        self.weights = weights
        self.refuse = refuse
        self.frame_end = frame_end  # where a frame ends in this provider's body (SSE); b"" for binary framing
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.connections = 0
        self.open_connections = 0
        self.active = 0  # exchanges whose response has not ended (or been cut)
        self.port = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            for task in list(self._tasks):
                task.cancel()
            loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            loop.stop()

        loop.call_soon_threadsafe(shutdown)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        self.stop()

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "connections": self.connections,
                "open_connections": self.open_connections,
                "active_exchanges": self.active,
                "injected": dict(self.injected),
            }

    # -- one connection ------------------------------------------------------------------------------------

    def _draw(self) -> str:
        names = list(self.weights)
        with self._lock:
            fault = self.rng.choices(names, weights=[self.weights[n] for n in names])[0]
            self.injected[fault] += 1
            self.active += 1
        return fault

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        with self._lock:
            self.connections += 1
            self.open_connections += 1
            refuse = self.rng.random() < self.refuse
            if refuse:
                self.injected["refuse"] += 1
        try:
            if refuse:
                _reset(client_w)
                return
            await self._relay(client_r, client_w)
        finally:
            with self._lock:
                self.open_connections -= 1
            self._tasks.discard(task)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _reset(client_w)
            return
        exchanges = _Exchanges(self)
        down = asyncio.ensure_future(self._responses(up_r, up_w, client_w, exchanges))
        try:
            while True:
                data = await client_r.read(65536)
                if not data:
                    break
                if data.startswith(_REQUEST_STARTS):
                    exchanges.pending.append(self._draw())
                up_w.write(data)
                await up_w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            down.cancel()
            await asyncio.gather(down, return_exceptions=True)
            for writer in (up_w, client_w):
                writer.close()
            exchanges.close()

    async def _responses(
        self,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        client_w: asyncio.StreamWriter,
        exchanges: _Exchanges,
    ) -> None:
        fault, sent, cut_at = "none", 0, 0
        while True:
            data = await up_r.read(65536)
            if not data:
                _reset(client_w)
                return
            if data.startswith(b"HTTP/1.1 ") and exchanges.pending:  # the next exchange's response begins
                fault = exchanges.begin()
                sent, cut_at = 0, self.rng.randint(150, 2500)
                if fault == "latency":
                    await asyncio.sleep(self.rng.uniform(0.05, 0.4))
            if fault in ("reset_stream", "reset_frame", "half_open") and sent + len(data) >= cut_at:
                client_w.write(data[: self._cut(data, cut_at - sent, fault)])
                await client_w.drain()
                if fault == "half_open":
                    await _hold(client_w)  # nothing more, until the gateway gives up and closes
                    return
                _reset(client_w)
                _reset(up_w)
                return
            if fault == "trickle":
                for i in range(len(data)):
                    client_w.write(data[i : i + 1])
                    await client_w.drain()
                    if i % 16 == 15:
                        await asyncio.sleep(0.0002)
            else:
                client_w.write(data)
                await client_w.drain()
            sent += len(data)
            exchanges.feed(data)

    def _cut(self, data: bytes, at: int, fault: str) -> int:
        at = max(0, min(at, len(data)))
        if fault == "reset_stream" and self.frame_end:
            end = data.find(self.frame_end, at)
            return len(data) if end < 0 else end + len(self.frame_end)
        return at


class _Exchanges:
    """The exchanges of one connection: faults drawn for requests not yet answered, and whether a response is
    in progress (ended when the provider's response is complete, parsed by httptools, or the connection ends)."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.pending: deque[str] = deque()
        self.in_progress = False
        self.parser = httptools.HttpResponseParser(self)

    def begin(self) -> str:
        self._end()
        self.in_progress = True
        self.parser = httptools.HttpResponseParser(self)
        return self.pending.popleft()

    def feed(self, data: bytes) -> None:
        if self.in_progress:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self._end()

    def on_message_complete(self) -> None:
        self._end()

    def _end(self) -> None:
        if self.in_progress:
            self.in_progress = False
            with self.proxy._lock:
                self.proxy.active -= 1

    def close(self) -> None:
        self._end()
        with self.proxy._lock:
            self.proxy.active -= len(self.pending)  # requests that never got an answer
        self.pending.clear()


async def _hold(writer: asyncio.StreamWriter) -> None:
    while not writer.is_closing():
        await asyncio.sleep(0.05)
        transport = writer.transport
        if transport.is_closing() or transport.get_extra_info("socket") is None:
            return


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a crashed or cut-off peer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()

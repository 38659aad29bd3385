"""A minimal OTLP/HTTP collector for benchmarks: raw ``asyncio.Protocol`` + httptools + uvloop, as
:mod:`bench.upstream`.

``POST /v1/traces`` and ``POST /v1/metrics`` (HTTP/1.1 keep-alive, ``Content-Length`` bodies) are answered
``200`` with an empty body and ``content-type: application/x-protobuf``; the body is not parsed, only its bytes
are counted. ``GET /counts`` returns ``{"traces": {"requests", "bytes"}, "metrics": {…}, "other": {…},
"connections", "process_time"}``; ``GET /healthz`` returns ok. The counts are printed as JSON on exit (SIGTERM).

Standalone: ``python -m bench.otlp_sink --port 4318`` (``python -m bench.run --tracing`` starts one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from typing import Any, cast

import httptools

__all__ = ["Counts", "counts", "serve"]

_OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
_CLOSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 9\r\n\r\nnot found"
_SIGNALS = {b"/v1/traces": "traces", b"/v1/metrics": "metrics"}


class Counts:
    """What arrived: per signal, the POSTs and their bodies' bytes."""

    requests = {"traces": 0, "metrics": 0, "other": 0}
    bytes = {"traces": 0, "metrics": 0, "other": 0}
    connections = 0


def counts() -> dict[str, Any]:
    out: dict[str, Any] = {k: {"requests": Counts.requests[k], "bytes": Counts.bytes[k]} for k in Counts.requests}
    return out | {"connections": Counts.connections, "process_time": time.process_time()}


def _json_answer(obj: object) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


class _Protocol(asyncio.Protocol):
    __slots__ = ("_parser", "_size", "_url", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        Counts.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_begin(self) -> None:
        self._url = b""
        self._size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._size += len(body)

    def on_message_complete(self) -> None:
        if self.transport is None:
            return
        method = self._parser.get_method()
        keep_alive = self._parser.should_keep_alive()
        path = self._url.split(b"?", 1)[0]
        if method == b"POST":
            kind = _SIGNALS.get(path, "other")
            Counts.requests[kind] += 1
            Counts.bytes[kind] += self._size
            answer = _OK if keep_alive else _CLOSE
        elif path == b"/counts":
            answer = _json_answer(counts())
        elif path == b"/healthz":
            answer = _json_answer({"status": "ok"})
        else:
            answer = _NOT_FOUND
        self.transport.write(answer)
        if not keep_alive:
            self.transport.close()


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Protocol, host, port, backlog=1024, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    stop: asyncio.Future[None] = loop.create_future()

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    print(f"bench.otlp_sink listening on http://{host}:{bound} (pid {os.getpid()})", flush=True)
    async with server:
        await stop
    print("bench.otlp_sink counts at exit: " + json.dumps(counts()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_sink", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    import uvloop

    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()

"""A fast fake Claude API for benchmarks: raw ``asyncio.Protocol`` + httptools + uvloop.

``POST /v1/messages`` answers from the request's ``model`` knobs (see :mod:`bench.knobs`): with
``"stream": true`` a Messages SSE stream (chunked), otherwise the equivalent Message JSON
(content-length). Every answer is encoded once per knob and cached, so serving it costs a dict
look-up and one ``write``. Paced streams (``-p<ms>``) write one event per interval: up to the first
text delta on the stream's own timer (so time to first token is exact), then on one shared timer per
pace that drives every open stream of that pace, so a thousand slow streams cost one timer, not a thousand.

``POST /model/{modelId}/invoke-with-response-stream`` (and ``/invoke``) answer the same knobs the way Amazon
Bedrock does: AWS event-stream ``chunk`` frames with real CRCs, each carrying one event as base64 plus a
padding member, the last with ``amazon-bedrock-invocationMetrics`` (signatures are not checked here).

``GET /cpu`` returns ``{"process_time": …, "requests": …, "events": …, "connections": …}``; ``GET /healthz`` returns ok.

Standalone: ``python -m bench.upstream --port 9100``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import signal
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote

import httptools

from bench.knobs import spec_for

__all__ = ["Answer", "answer_for", "canonical_body", "serve"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _head(status: int, ctype: str, extra: str) -> bytes:
    return (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\ncontent-type: {ctype}\r\n{extra}"
        "request-id: req_bench\r\nanthropic-ratelimit-requests-remaining: 999\r\n\r\n"
    ).encode()


def _fixed(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    return _head(status, ctype, f"content-length: {len(body)}\r\n") + body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass(frozen=True, slots=True)
class Answer:
    """One knob's pre-encoded answers."""

    json: bytes  # the whole non-streamed response (head + body)
    stream: bytes  # the whole streamed response in one write (head + one chunk + terminator)
    paced: tuple[bytes, ...]  # head + first event, then one chunk per event, the last one with the terminator
    events: int
    pace_s: float
    first_s: float
    lead_in: int  # events after message_start up to the first delta, paced on the stream's own clock


_ANSWERS: dict[str, Answer] = {}
_BEDROCK_ANSWERS: dict[str, Answer] = {}


def bedrock_answer_for(model: str) -> Answer:
    """The knob's stream as InvokeModelWithResponseStream sends it."""
    answer = _BEDROCK_ANSWERS.get(model)
    if answer is None:
        sse = answer_for(model)
        frames = _bedrock_frames(model)
        head = _head(200, "application/vnd.amazon.eventstream", "transfer-encoding: chunked\r\n")
        paced = [head + _chunk(frames[0])] + [_chunk(f) for f in frames[1:]]
        paced[-1] += b"0\r\n\r\n"
        answer = Answer(
            json=sse.json,
            stream=head + _chunk(b"".join(frames)) + b"0\r\n\r\n",
            paced=tuple(paced),
            events=sse.events,
            pace_s=sse.pace_s,
            first_s=sse.first_s,
            lead_in=sse.lead_in,
        )
        if len(_BEDROCK_ANSWERS) < 1024:
            _BEDROCK_ANSWERS[model] = answer
    return answer


def _bedrock_frames(model: str) -> list[bytes]:
    """The knob's events as Bedrock's ``chunk`` frames (base64 event + padding; metrics on ``message_stop``)."""
    from adapters._eventstream import encode_message

    spec = spec_for(model)
    headers = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
    frames = []
    for i, event in enumerate(spec.events):
        if event["type"] == "message_stop":
            metrics = {
                "inputTokenCount": spec.knobs.input_tokens,
                "outputTokenCount": spec.knobs.deltas,
                "invocationLatency": 900,
                "firstByteLatency": 90,
            }
            event = {**event, "amazon-bedrock-invocationMetrics": metrics}
        padding = "abcdefghijklmnopqrstuvwxyz"[: 3 + i % 20]
        payload = {"bytes": base64.b64encode(_json(event)).decode(), "p": padding}
        frames.append(encode_message(headers, _json(payload)))  # type: ignore[arg-type]
    return frames


def answer_for(model: str) -> Answer:
    answer = _ANSWERS.get(model)
    if answer is None:
        spec = spec_for(model)
        frames = [_frame(e) for e in spec.events]
        sse_head = _head(
            200, "text/event-stream; charset=utf-8", "transfer-encoding: chunked\r\ncache-control: no-cache\r\n"
        )
        paced = [sse_head + _chunk(frames[0])] + [_chunk(f) for f in frames[1:]]
        paced[-1] += b"0\r\n\r\n"
        answer = Answer(
            json=_fixed(200, _json(spec.message)),
            stream=sse_head + _chunk(b"".join(frames)) + b"0\r\n\r\n",
            paced=tuple(paced),
            events=len(frames),
            pace_s=spec.knobs.pace_ms / 1000.0,
            first_s=spec.knobs.first_ms / 1000.0,
            lead_in=next(i for i, e in enumerate(spec.events) if e["type"] == "content_block_delta"),
        )
        if len(_ANSWERS) < 1024:
            _ANSWERS[model] = answer
    return answer


def canonical_body(model: str, stream: bool, shape: str = "messages") -> bytes:
    """The body (no head, no chunk framing) this server sends for ``model``: on ``/v1/messages`` (``shape``
    "messages") or on the Bedrock routes ("bedrock": a stream is event-stream frames, ``invoke`` the same JSON)."""
    spec = spec_for(model)
    if not stream:
        return _json(spec.message)
    if shape == "bedrock":
        return b"".join(_bedrock_frames(model))
    return b"".join(_frame(e) for e in spec.events)


def _frame(event: dict[str, object]) -> bytes:
    return f"event: {event['type']}\ndata: ".encode() + _json(event) + b"\n\n"


def _error(status: int, etype: str, message: str) -> bytes:
    return _fixed(status, _json({"type": "error", "error": {"type": etype, "message": message}}))


class Stats:
    requests = 0
    events = 0
    connections = 0  # accepted so far: shows whether a client keeps its connections alive


class _PacedStream:
    __slots__ = ("chunks", "next", "proto")

    def __init__(self, proto: _Protocol, chunks: tuple[bytes, ...]) -> None:
        self.proto = proto
        self.chunks = chunks
        self.next = 1  # chunks[0] (head + message_start) is written when the stream starts

    def step(self) -> bool:
        """Write the next event; False once the stream is over (or the client went away)."""
        proto = self.proto
        if proto.transport is None:
            return False
        proto.transport.write(self.chunks[self.next])
        self.next += 1
        if self.next < len(self.chunks):
            return True
        proto.response_done()
        return False


class _Pacer:
    """One timer per pace: every tick writes the next event of every stream of that pace."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop = loop
        self.interval = interval
        self.streams: list[_PacedStream] = []
        self.next_at = 0.0
        self.running = False

    def add(self, stream: _PacedStream) -> None:
        self.streams.append(stream)
        if not self.running:
            self.running = True
            self.next_at = self.loop.time() + self.interval
            self.loop.call_at(self.next_at, self._tick)

    def _tick(self) -> None:
        current, self.streams = self.streams, []
        alive = [s for s in current if s.step()]
        self.streams = alive + self.streams  # streams added during the tick (keep-alive reuse) follow
        if not self.streams:
            self.running = False
            return
        now = self.loop.time()
        self.next_at = max(self.next_at + self.interval, now)  # late: no catch-up burst
        self.loop.call_at(self.next_at, self._tick)


_PACERS: dict[float, _Pacer] = {}


def _pacer(loop: asyncio.AbstractEventLoop, interval: float) -> _Pacer:
    pacer = _PACERS.get(interval)
    if pacer is None:
        pacer = _PACERS[interval] = _Pacer(loop, interval)
    return pacer


class _Protocol(asyncio.Protocol):
    __slots__ = ("_body", "_busy", "_keep_alive", "_method", "_parser", "_pending", "_url", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body: list[bytes] = []
        self._method = b""
        self._busy = False  # a response (paced) is still being written
        self._keep_alive = True
        self._pending: deque[tuple[bytes, bytes, bytes, bool]] = deque()

    # --- asyncio ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        Stats.connections += 1
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(_error(400, "invalid_request_error", "malformed HTTP request"))
                self.transport.close()

    # --- httptools callbacks ---
    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        method = self._parser.get_method()
        request = (method, self._url, b"".join(self._body), self._parser.should_keep_alive())
        if self._busy:
            self._pending.append(request)
        else:
            self._handle(*request)

    # --- responses ---
    def response_done(self) -> None:
        self._busy = False
        if not self._keep_alive and self.transport is not None:
            self.transport.close()
        elif self._pending:
            self._handle(*self._pending.popleft())

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)
        self.response_done()

    def _handle(self, method: bytes, url: bytes, body: bytes, keep_alive: bool) -> None:
        self._busy = True
        self._keep_alive = keep_alive
        path = url.split(b"?", 1)[0]
        if path == b"/v1/messages":
            if method != b"POST":
                return self._write(_error(405, "invalid_request_error", "use POST"))
            try:
                request = json.loads(body)
                model = request["model"]
                stream = bool(request.get("stream"))
            except (ValueError, KeyError, TypeError):
                return self._write(_error(400, "invalid_request_error", "body must be JSON with a model"))
            if not isinstance(model, str):
                return self._write(_error(400, "invalid_request_error", "model must be a string"))
            answer = answer_for(model)
            Stats.requests += 1
            if answer.first_s > 0:
                asyncio.get_running_loop().call_later(answer.first_s, self._start, answer, stream)
            else:
                self._start(answer, stream)
            return None
        if path.startswith(b"/model/") and method == b"POST":
            parts = path.split(b"/")
            operation = parts[-1]
            if len(parts) != 4 or operation not in (b"invoke", b"invoke-with-response-stream"):
                return self._write(_error(404, "not_found_error", "unknown Bedrock operation"))
            model = unquote(parts[2].decode())
            Stats.requests += 1
            bedrock = bedrock_answer_for(model)
            if bedrock.first_s > 0:
                loop = asyncio.get_running_loop()
                loop.call_later(bedrock.first_s, self._start, bedrock, operation != b"invoke")
            else:
                self._start(bedrock, operation != b"invoke")
            return None
        if path == b"/cpu":
            stats = {
                "process_time": time.process_time(),
                "requests": Stats.requests,
                "events": Stats.events,
                "connections": Stats.connections,
            }
            return self._write(_fixed(200, _json(stats)))
        if path == b"/healthz":
            return self._write(_fixed(200, b'{"status":"ok"}'))
        return self._write(_error(404, "not_found_error", f"no route for {path.decode(errors='replace')}"))

    def _start(self, answer: Answer, stream: bool) -> None:
        if not stream:
            return self._write(answer.json)
        Stats.events += answer.events
        if answer.pace_s <= 0 or len(answer.paced) == 1:
            return self._write(answer.stream)
        if self.transport is None:
            return self.response_done()
        self.transport.write(answer.paced[0])
        self._lead_in(_PacedStream(self, answer.paced), answer.pace_s, answer.lead_in)
        return None

    @staticmethod
    def _lead_in(stream: _PacedStream, pace: float, left: int) -> None:
        """Pace the events up to the first delta on this stream's own timer, the rest on the shared tick.

        On the shared tick alone, time to first token would include the tick's phase, which a closed loop
        correlates with the round trip (a request sent right after a stream ends on a tick waits nearly a
        whole interval when direct, less through a slower proxy): added TTFT would be understated."""
        loop = asyncio.get_running_loop()
        if left <= 0:
            _pacer(loop, pace).add(stream)
        else:
            loop.call_later(pace, _Protocol._lead_step, stream, pace, left)

    @staticmethod
    def _lead_step(stream: _PacedStream, pace: float, left: int) -> None:
        if stream.step():
            _Protocol._lead_in(stream, pace, left - 1)


def raise_nofile(target: int = 65536) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(target, hard) if hard != resource.RLIM_INFINITY else target
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


async def serve(host: str, port: int, ready: asyncio.Future[int] | None = None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Protocol, host, port, backlog=4096, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set_result(bound)
    stop: asyncio.Future[None] = loop.create_future()

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    print(f"bench.upstream listening on http://{host}:{bound} (pid {os.getpid()})", flush=True)
    async with server:
        await stop


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args()
    raise_nofile()
    import uvloop

    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()

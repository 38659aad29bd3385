"""A closed-loop load generator that checks every answer it gets.

``C`` workers each hold one keep-alive connection (raw ``asyncio.Protocol`` + httptools, uvloop) and
issue ``POST /v1/messages`` back to back. Every answer is checked against :func:`bench.knobs.spec_for`
of the model sent: for a stream, the SSE frames parse, the event sequence is complete
(``message_start`` … ``message_stop``, every block event on index 0, each ``event:`` name equal to
its data's ``type``), the concatenated ``text_delta`` text is exact, the usage is exact (input and
cache read from ``message_start``, output from ``message_delta``) and every ``citations_delta`` carries
exactly one expected citation. For JSON, the same on the Message. Any mismatch is an error, kept with a
sample.

``Load.shape = "bedrock"`` speaks Bedrock instead: ``POST /model/{modelId}/invoke-with-response-stream`` with
a Bedrock body (``anthropic_version``, no ``model`` / ``stream``) and ``Authorization: Bearer``. The answer
must be ``application/vnd.amazon.eventstream``: every frame is decoded (``adapters._eventstream``, both CRCs,
nothing left over), each must be a ``chunk`` event whose payload is ``{"bytes": base64}``, and the events inside
get the same check as SSE events; ``message_stop`` must carry ``amazon-bedrock-invocationMetrics`` with the
expected input and output token counts. An exception frame, a truncated or damaged frame is an error.

Per request: time to first byte (first body bytes), time to first token (first body read holding a
``content_block_delta``) and total time. A phase is: warm-up, then a measured window (a duration or a
request count), then a drain in which the requests already started finish.

Standalone: ``python -m bench.loadgen --url http://127.0.0.1:8080 --model bench-d200 -c 10 -d 5`` (``--shape bedrock
--model us.anthropic.bench-d200`` for Bedrock-shaped clients).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import re
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

import httptools
import msgspec

from adapters._eventstream import CHUNK_HEADERS, EventStreamDecoder, EventStreamError, encode_message, parse_headers
from bench.knobs import Spec, cloud_base, spec_for

__all__ = [
    "Expectation",
    "Load",
    "PhaseResult",
    "Target",
    "check_eventstream",
    "check_json",
    "check_stream",
    "percentile",
    "run_phase",
]

# --- checks -----------------------------------------------------------------------------------------------


class _Citation(msgspec.Struct):
    type: str
    cited_text: str


class _Delta(msgspec.Struct):
    type: str = ""
    text: str | None = None
    citation: _Citation | None = None
    citations: msgspec.Raw | None = None  # not part of the protocol: a delta carries one citation


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Message(msgspec.Struct):
    usage: _Usage | None = None


class _Event(msgspec.Struct):
    type: str
    index: int | None = None
    delta: _Delta | None = None
    message: _Message | None = None
    usage: _Usage | None = None


class _Chunk(msgspec.Struct):
    """An event-stream ``chunk`` payload: the event as base64 (msgspec decodes it); other members (Bedrock's
    padding ``p``) are ignored."""

    data: bytes = msgspec.field(name="bytes")


class _Metrics(msgspec.Struct):
    inputTokenCount: int | None = None
    outputTokenCount: int | None = None


class _Stop(msgspec.Struct):
    metrics: _Metrics | None = msgspec.field(default=None, name="amazon-bedrock-invocationMetrics")


class _Block(msgspec.Struct):
    type: str
    text: str | None = None
    citations: list[_Citation] | None = None


class _FullMessage(msgspec.Struct):
    type: str
    content: list[_Block]
    usage: _Usage
    stop_reason: str | None = None


_decode_events = msgspec.json.Decoder(list[_Event]).decode
_decode_message = msgspec.json.Decoder(_FullMessage).decode
_decode_chunks = msgspec.json.Decoder(list[_Chunk]).decode
_decode_stop = msgspec.json.Decoder(_Stop).decode
_CHUNK_HEADER_BLOCK = encode_message(CHUNK_HEADERS, b"")[12:-4]  # every chunk frame's header block, as sent
# The well-formed shape every server here writes: optional comments, optional `event:`, one `data:` line.
# Possessive quantifiers and one way to match each line: no backtracking, linear even on a body that fails.
_WELL_FORMED = re.compile(rb"(?:(?::[^\n]*+\n)*+(?:event:[^\n]*+\n)?+data:[^\n]*+\n\n)*+(?::[^\n]*+\n)*+\n*+")
_FRAME = re.compile(rb"(?:event: ?([^\n]*)\n)?data: ?([^\n]*)\n\n")
_REQUEST_ID = re.compile(r"req_[A-Za-z0-9_]+")
_BLOCK_EVENTS = frozenset({"content_block_start", "content_block_delta", "content_block_stop"})


def _parse_sse_slow(body: bytes) -> list[tuple[bytes, bytes]]:
    """The general SSE rules (CR/LF/CRLF, multi-line data, other fields) for bodies off the fast path."""
    body = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    frames: list[tuple[bytes, bytes]] = []
    for block in body.split(b"\n\n"):
        name, data = b"", []
        for line in block.split(b"\n"):
            if not line or line.startswith(b":"):
                continue
            key, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if key == b"event":
                name = value
            elif key == b"data":
                data.append(value)
        if data:
            frames.append((name, b"\n".join(data)))
    return frames


def _short(data: object, limit: int = 160) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    return text if len(text) <= limit else text[:limit] + "…"


def check_stream(body: bytes, spec: Spec) -> str | None:
    """None when ``body`` is exactly the stream ``spec`` describes, else what is wrong."""
    fast = b"\r" not in body and _WELL_FORMED.fullmatch(body) is not None
    frames = _FRAME.findall(body) if fast else _parse_sse_slow(body)
    if not frames:
        return f"no SSE frames in body: {_short(body)}"
    try:
        events = _decode_events(b"[" + b",".join(data for _, data in frames) + b"]")
    except msgspec.ValidationError as exc:
        where = re.search(r"\$\[(\d+)\]", str(exc))
        frame = frames[int(where.group(1))][1] if where and int(where.group(1)) < len(frames) else b""
        return f"unexpected event shape ({exc}): {_short(frame)}"
    except msgspec.DecodeError as exc:
        bad = next((d for _, d in frames if not _decodes(d)), b"")
        return f"undecodable event ({exc}): {_short(bad)}"
    for (name, _), event in zip(frames, events, strict=True):
        if name and name != event.type.encode():
            return f"event name {name.decode(errors='replace')!r} but data type {event.type!r}"
    return _check_events(events, [data for _, data in frames], spec)


def _check_events(events: list[_Event], datas: list[bytes], spec: Spec) -> str | None:
    """The checks of a stream's decoded events (``datas``: their JSON), whatever carried them."""
    seen = [e for e in events if e.type != "ping"]
    types = tuple(e.type for e in seen)
    if types != spec.types:
        if "error" in types:
            err = next(d for d, e in zip(datas, events, strict=True) if e.type == "error")
            return f"error event after {types.index('error')} events: {_short(err)}"
        first = next((i for i, (a, b) in enumerate(zip(types, spec.types, strict=False)) if a != b), None)
        if first is None:
            return f"{len(types)} events (expected {len(spec.types)}); last {types[-1:]!r}"
        return f"event {first} is {types[first]!r}, expected {spec.types[first]!r}"
    if any(e.index != 0 for e in seen if e.type in _BLOCK_EVENTS):
        return "a block event is not on index 0"
    deltas = [e.delta for e in seen if e.type == "content_block_delta"]
    text = "".join([d.text for d in deltas if d is not None and d.type == "text_delta" and d.text is not None])
    if text != spec.text:
        at = next(
            (i for i, (a, b) in enumerate(zip(text, spec.text, strict=False)) if a != b), min(len(text), len(spec.text))
        )
        return f"text differs at char {at} (got {len(text)} chars, expected {len(spec.text)}): {text[at : at + 40]!r}"
    cited: list[str] = []
    for d in deltas:
        if d is not None and d.type == "citations_delta":
            if d.citation is None or d.citations is not None:
                return "a citations_delta without exactly one citation"
            cited.append(d.citation.cited_text)
    if tuple(cited) != spec.cited:
        return f"{len(cited)} citations, expected {len(spec.cited)}"
    start = seen[0].message.usage if seen[0].message is not None else None
    if start is None or start.input_tokens != spec.knobs.input_tokens:
        return f"message_start input_tokens {start and start.input_tokens}, expected {spec.knobs.input_tokens}"
    if start.cache_read_input_tokens != spec.knobs.cache_read:
        return f"cache_read_input_tokens {start.cache_read_input_tokens}, expected {spec.knobs.cache_read}"
    end = seen[-2].usage
    if end is None or end.output_tokens != spec.output_tokens:
        return f"message_delta output_tokens {end and end.output_tokens}, expected {spec.output_tokens}"
    return None


def check_eventstream(body: bytes, spec: Spec) -> str | None:
    """None when ``body`` is exactly the stream ``spec`` describes as Bedrock InvokeModelWithResponseStream
    sends it (event-stream ``chunk`` frames, each ``{"bytes": base64 of one event}``), else what is wrong."""
    decoder = EventStreamDecoder()
    try:
        payloads, others = decoder.feed_payloads(body, _CHUNK_HEADER_BLOCK)
    except EventStreamError as exc:
        return f"event-stream: {exc} (after {len(exc.decoded)} intact frames)"
    if decoder.pending:
        left = len(body) - len(decoder.last_messages())
        return f"event-stream truncated: {left} bytes of a frame left over after {len(payloads) + len(others)} frames"
    for raw, payload in others:  # frames whose header block is not the usual one, in order
        headers = parse_headers(raw)
        if headers.get(":message-type") == "exception":
            return f"exception frame {headers.get(':exception-type')!r} after {len(payloads)} chunks: {_short(payload)}"
        if headers.get(":message-type") != "event" or headers.get(":event-type") != "chunk":
            return f"unexpected event-stream frame {headers!r} after {len(payloads)} chunks"
        payloads.append(payload)
    if not payloads:
        return f"no event-stream frames in body: {_short(body)}"
    try:
        datas = [c.data for c in _decode_chunks(b"[" + b",".join(payloads) + b"]")]
    except msgspec.DecodeError as exc:
        bad = next((p for p in payloads if not _decodes_as(p, _Chunk)), b"")
        return f'chunk payload is not {{"bytes": base64}} ({exc}): {_short(bad)}'
    try:
        events = _decode_events(b"[" + b",".join(datas) + b"]")
    except msgspec.ValidationError as exc:
        where = re.search(r"\$\[(\d+)\]", str(exc))
        data = datas[int(where.group(1))] if where and int(where.group(1)) < len(datas) else b""
        return f"unexpected event shape ({exc}): {_short(data)}"
    except msgspec.DecodeError as exc:
        bad = next((d for d in datas if not _decodes(d)), b"")
        return f"undecodable event ({exc}): {_short(bad)}"
    problem = _check_events(events, datas, spec)
    if problem is not None:
        return problem
    metrics = _decode_stop(datas[-1]).metrics
    if metrics is None:
        return "message_stop without amazon-bedrock-invocationMetrics"
    if (metrics.inputTokenCount, metrics.outputTokenCount) != (spec.knobs.input_tokens, spec.output_tokens):
        return (
            f"invocation metrics input/output {metrics.inputTokenCount}/{metrics.outputTokenCount}, expected "
            f"{spec.knobs.input_tokens}/{spec.output_tokens}"
        )
    return None


def _decodes_as(data: bytes, kind: type) -> bool:
    try:
        msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError:
        return False
    return True


def _decodes(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return True


def check_json(body: bytes, spec: Spec) -> str | None:
    """None when ``body`` is exactly the Message ``spec`` describes, else what is wrong."""
    try:
        msg = _decode_message(body)
    except msgspec.DecodeError as exc:
        return f"bad Message JSON ({exc}): {_short(body)}"
    if msg.type != "message":
        return f"type {msg.type!r}: {_short(body)}"
    text = "".join(b.text or "" for b in msg.content if b.type == "text")
    if text != spec.text:
        return f"text differs (got {len(text)} chars, expected {len(spec.text)})"
    cited = tuple(c.cited_text for b in msg.content for c in (b.citations or ()))
    if cited != spec.cited:
        return f"{len(cited)} citations, expected {len(spec.cited)}"
    u = msg.usage
    if (u.input_tokens, u.cache_read_input_tokens, u.output_tokens) != (
        spec.knobs.input_tokens,
        spec.knobs.cache_read,
        spec.output_tokens,
    ):
        return f"usage {u.input_tokens}/{u.cache_read_input_tokens}/{u.output_tokens} differs"
    return None


class Expectation:
    """How to check one model's answers. The exact bytes the fake upstream sends are the strictest check
    and cost one compare, so an identical body passes at once (those bytes were checked once with the
    full check below); anything else (a gateway that re-encodes, re-chunks or adds pings) gets the full
    semantic check, which names the first thing wrong.

    ``shape`` "bedrock": event-stream answers. The fake's Bedrock route answers a model id with its own name in
    ``message_start``; through the gateway it is asked for the alias the id maps to (``us.anthropic.`` left
    out), so the bytes of both are the fast path."""

    __slots__ = ("canonical", "others", "shape", "spec", "stream")

    def __init__(self, model: str, stream: bool, shape: str = "messages") -> None:
        from bench.upstream import canonical_body

        self.spec = spec_for(model)
        self.stream = stream
        self.shape = shape
        self.canonical = canonical_body(model, stream, shape)
        self.others: tuple[bytes, ...] = ()
        if shape == "bedrock" and cloud_base(model) != model:
            self.others = (canonical_body(cloud_base(model), stream, shape),)
        for body in (self.canonical, *self.others):
            problem = self.full_check(body)
            if problem is not None:
                raise AssertionError(f"the fake upstream's own {model} answer fails the check: {problem}")

    def full_check(self, body: bytes) -> str | None:
        if not self.stream:
            return check_json(body, self.spec)
        return check_eventstream(body, self.spec) if self.shape == "bedrock" else check_stream(body, self.spec)

    def check(self, body: bytes) -> str | None:
        return None if body == self.canonical or body in self.others else self.full_check(body)


# --- the client ---------------------------------------------------------------------------------------------


class _Counter:
    """What arrives while the window is open (events are counted per read, so paced streams count right)."""

    __slots__ = ("active", "events")

    def __init__(self) -> None:
        self.active = False
        self.events = 0


class _Conn(asyncio.Protocol):
    # what a read holding the first token contains (and how much of a read's start / end to look at for it
    # across two reads), and what each event of a read contains once
    _MARK = b"content_block_delta"
    _HEAD = 32
    _TAIL = 24
    _EVENT = b"data:"

    __slots__ = (
        "chunks",
        "closed",
        "counter",
        "keep_alive",
        "now",
        "parser",
        "status",
        "t_first_byte",
        "t_first_token",
        "tail",
        "transport",
        "waiter",
    )

    def __init__(self, counter: _Counter) -> None:
        self.counter = counter
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.chunks: list[bytes] = []
        self.status = 0
        self.keep_alive = True
        self.closed = False
        self.now = 0.0
        self.t_first_byte = 0.0
        self.t_first_token = 0.0
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionResetError(f"connection closed mid-response ({exc or 'EOF'})"))

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_exception(ConnectionError(f"bad HTTP response: {exc}"))
            self.abort()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if not self.chunks:
            self.t_first_byte = self.now
        self.chunks.append(body)
        if not self.t_first_token:
            if self._MARK in self.tail + body[: self._HEAD] or self._MARK in body:
                self.t_first_token = self.now
            else:
                self.tail = body[-self._TAIL :]
        if self.counter.active:
            self.counter.events += body.count(self._EVENT)

    def on_message_complete(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def send(self, request: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        self.chunks = []
        self.status = 0
        self.t_first_byte = self.t_first_token = 0.0
        self.tail = b""
        self.waiter = loop.create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self.waiter

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def head_problem(self) -> str | None:
        """What is wrong with a 200 answer's head (nothing, for Messages answers)."""
        return None


_EVENTSTREAM = b"application/vnd.amazon.eventstream"


class _EventStreamConn(_Conn):
    """A connection reading Bedrock answers: a delta's chunk frame holds the base64 of its event, whose first
    bytes are always ``{"type":"content_block_delta"`` (36 base64 digits of them are fixed); one
    ``:message-type`` header per frame; the content type must be event-stream."""

    _MARK = base64.b64encode(b'{"type":"content_block_delta"')[:36]
    _HEAD = 48
    _TAIL = 40
    _EVENT = b":message-type"

    __slots__ = ("content_type",)

    def __init__(self, counter: _Counter) -> None:
        super().__init__(counter)
        self.content_type = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value

    def send(self, request: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        self.content_type = b""
        return super().send(request, loop)

    def head_problem(self) -> str | None:
        if self.content_type.split(b";")[0].strip().lower() != _EVENTSTREAM:
            return f"content-type {self.content_type.decode(errors='replace')!r}, expected {_EVENTSTREAM.decode()}"
        return None


# --- phases -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    host: str
    port: int
    headers: tuple[tuple[str, str], ...] = (("x-api-key", "bench"),)
    path: str = "/v1/messages"
    model_prefix: str = ""  # e.g. "anthropic/" where a proxy wants the provider in the model name


@dataclass(frozen=True, slots=True)
class Load:
    model: str
    stream: bool = True
    concurrency: int = 10
    duration_s: float | None = 5.0  # the measured window; or
    requests: int | None = None  # a fixed count of measured requests
    warmup_s: float = 1.0
    warmup_requests: int = 0  # count mode: requests before the window opens
    ramp_s: float = 0.0  # spread the workers' first connects over this long
    drain_s: float = 30.0  # after the window, how long started requests may take to finish
    abort_after_errors: int = 500  # stop early once this many failed and failures outnumber successes 10:1
    shape: str = "messages"  # or "bedrock": InvokeModel(WithResponseStream), answered as event-stream


class _PhaseState:
    __slots__ = ("failed", "finished", "issued", "opened", "stop", "succeeded", "window_open")

    def __init__(self) -> None:
        self.opened = False  # the window was opened (count mode opens it with the first counted request)
        self.window_open = False
        self.stop = False
        self.issued = 0  # count mode: counted requests started
        self.finished = 0  # count mode: counted requests done, successful or not
        self.failed = 0
        self.succeeded = 0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))  # nearest rank
    return ordered[rank]


@dataclass(slots=True)
class PhaseResult:
    target: str
    model: str
    concurrency: int
    window_s: float = 0.0
    completed: int = 0  # answered and checked within the window
    events: int = 0  # SSE events received within the window
    errors: int = 0  # failed requests in the whole phase (warm-up and drain included)
    error_samples: list[str] = field(default_factory=list)
    ttfb: list[float] = field(default_factory=list)  # seconds, requests started within the window
    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    load_cpu_s: float = 0.0  # this process (load generator + runner) during the window
    hooks: dict[str, Any] = field(default_factory=dict)  # what the window hooks returned

    @property
    def rps(self) -> float:
        return self.completed / self.window_s if self.window_s else 0.0

    @property
    def events_per_s(self) -> float:
        return self.events / self.window_s if self.window_s else 0.0

    def summary(self) -> dict[str, Any]:
        def ms(values: list[float]) -> dict[str, float | None]:
            return {f"p{q}": _ms(percentile(values, q)) for q in (50, 90, 99)}

        return {
            "target": self.target,
            "model": self.model,
            "concurrency": self.concurrency,
            "window_s": round(self.window_s, 3),
            "completed": self.completed,
            "events": self.events,
            "rps": round(self.rps, 1),
            "events_per_s": round(self.events_per_s, 1),
            "errors": self.errors,
            "error_samples": self.error_samples,
            "ttfb_ms": ms(self.ttfb),
            "ttft_ms": ms(self.ttft),
            "total_ms": ms(self.total),
            "load_cpu_s": round(self.load_cpu_s, 4),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def build_request(target: Target, model: str, stream: bool, shape: str = "messages") -> bytes:
    if shape == "bedrock":
        return _bedrock_request(target, model, stream)
    body = json.dumps(
        {
            "model": target.model_prefix + model,
            "max_tokens": 1024,
            "stream": stream,
            "messages": [{"role": "user", "content": "Say the benchmark tokens."}],
        },
        separators=(",", ":"),
    ).encode()
    head = [
        f"POST {target.path} HTTP/1.1",
        f"host: {target.host}:{target.port}",
        "content-type: application/json",
        "accept: " + ("text/event-stream" if stream else "application/json"),
        "anthropic-version: 2023-06-01",
        *(f"{k}: {v}" for k, v in target.headers),
        f"content-length: {len(body)}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _bedrock_request(target: Target, model: str, stream: bool) -> bytes:
    """InvokeModel(WithResponseStream) as a Bedrock API-key client sends it (``Authorization: Bearer``: the
    target's ``x-api-key``)."""
    body = json.dumps(
        {
            "anthropic_version": "bedrock-2023-05-31",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": "Say the benchmark tokens."}],
        },
        separators=(",", ":"),
    ).encode()
    operation = "invoke-with-response-stream" if stream else "invoke"
    head = [
        f"POST /model/{quote(model, safe=':')}/{operation} HTTP/1.1",
        f"host: {target.host}:{target.port}",
        "content-type: application/json",
        "accept: " + ("application/vnd.amazon.eventstream" if stream else "application/json"),
        *(["x-amzn-bedrock-accept: application/json"] if stream else []),
        *(f"authorization: Bearer {v}" if k == "x-api-key" else f"{k}: {v}" for k, v in target.headers),
        f"content-length: {len(body)}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


WindowHook = Callable[[], Awaitable[Any]]


async def run_phase(
    target: Target,
    load: Load,
    *,
    on_window_start: WindowHook | None = None,
    on_window_end: WindowHook | None = None,
) -> PhaseResult:
    """Warm up, open the window (calling ``on_window_start``), close it (``on_window_end``), drain."""
    loop = asyncio.get_running_loop()
    check = Expectation(load.model, load.stream, load.shape).check
    request = build_request(target, load.model, load.stream, load.shape)
    conn_class = _EventStreamConn if load.shape == "bedrock" and load.stream else _Conn
    result = PhaseResult(target=target.name, model=load.model, concurrency=load.concurrency)
    counter = _Counter()
    state = _PhaseState()
    t_open = t_close = 0.0
    conns: set[_Conn] = set()
    window_done = loop.create_future()
    count_mode = load.requests is not None
    warm_left = [load.warmup_requests]

    def fail(message: str) -> None:
        result.errors += 1
        message = _REQUEST_ID.sub("req_…", message)  # so that samples differing only by id count once
        if len(result.error_samples) < 5 and message not in result.error_samples:
            result.error_samples.append(message)
        state.failed += 1
        if state.failed >= load.abort_after_errors and state.failed > 10 * state.succeeded:
            if not state.stop:
                result.error_samples.append(
                    f"phase aborted after {state.failed} errors and {state.succeeded} successes"
                )
            state.stop = True  # the system under test is failing nearly everything: do not spin on it
            if not window_done.done():
                window_done.set_result(None)

    async def connect() -> _Conn:
        _, conn = await loop.create_connection(lambda: conn_class(counter), target.host, target.port)
        sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.add(conn)
        return conn

    def finish_one(in_window: bool) -> None:
        if count_mode and in_window:
            state.finished += 1
            if state.finished >= (load.requests or 0) and not window_done.done():
                window_done.set_result(None)

    async def worker(i: int) -> None:
        if load.ramp_s > 0:
            await asyncio.sleep(load.ramp_s * i / load.concurrency)
        conn: _Conn | None = None
        while not state.stop:
            if not count_mode:
                in_window = state.window_open
            elif warm_left[0] > 0:
                warm_left[0] -= 1
                in_window = False
            elif state.issued < (load.requests or 0):
                state.issued += 1
                in_window = True
                if not state.opened:
                    await open_window()
            else:
                return
            try:
                if conn is None or conn.closed:
                    conn = await connect()
                t0 = time.perf_counter()
                await conn.send(request, loop)
            except (OSError, ConnectionError) as exc:
                fail(f"{type(exc).__name__}: {exc}")
                finish_one(in_window)
                if conn is not None:
                    conns.discard(conn)
                    conn.abort()
                conn = None
                await asyncio.sleep(0.05)
                continue
            t1 = time.perf_counter()
            body = b"".join(conn.chunks)
            problem = (
                f"HTTP {conn.status}: {_short(body)}" if conn.status != 200 else conn.head_problem() or check(body)
            )
            if problem is not None:
                fail(problem)
            else:
                state.succeeded += 1
            if problem is None and in_window:
                result.ttfb.append(conn.t_first_byte - t0)
                result.ttft.append((conn.t_first_token or t1) - t0)
                result.total.append(t1 - t0)
                if count_mode or state.window_open:
                    result.completed += 1
            finish_one(in_window)
            if not conn.keep_alive:
                conns.discard(conn)
                conn.abort()
                conn = None

    async def open_window() -> None:
        nonlocal t_open
        state.opened = True
        result.hooks["start"] = await on_window_start() if on_window_start else None
        result.load_cpu_s = -_cpu_self()
        counter.events = 0
        counter.active = True
        state.window_open = True
        t_open = time.perf_counter()

    async def close_window() -> None:
        nonlocal t_close
        t_close = time.perf_counter()
        state.window_open = False
        counter.active = False
        result.load_cpu_s += _cpu_self()
        result.hooks["end"] = await on_window_end() if on_window_end else None

    tasks = [asyncio.ensure_future(worker(i)) for i in range(load.concurrency)]
    try:
        if count_mode:
            await asyncio.wait([window_done, *tasks], return_when=asyncio.FIRST_COMPLETED)
            while not window_done.done() and not all(t.done() for t in tasks):
                await asyncio.wait([window_done, *tasks], return_when=asyncio.FIRST_COMPLETED)
            state.stop = True
            if not state.opened:
                await open_window()
            await close_window()
        else:
            await asyncio.wait([window_done], timeout=load.warmup_s + load.ramp_s)  # set early only on abort
            await open_window()
            await asyncio.wait([window_done], timeout=load.duration_s or 0.0)
            state.stop = True
            await close_window()
        done, pending = await asyncio.wait(tasks, timeout=load.drain_s)
        for task in pending:
            fail(f"request unfinished {load.drain_s:.0f} s after the window closed")
            task.cancel()
        for task in done:
            if task.exception() is not None:
                fail(f"worker crashed: {task.exception()!r}")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in conns:
            conn.abort()
    result.window_s = t_close - t_open
    result.events = counter.events
    return result


# --- standalone ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default="bench-d200")
    parser.add_argument("--json", action="store_true", help="non-streamed requests")
    parser.add_argument("-c", "--concurrency", type=int, default=10)
    parser.add_argument("-d", "--duration", type=float, default=5.0)
    parser.add_argument("-n", "--requests", type=int, help="a request count instead of a duration")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--key", default="bench")
    parser.add_argument("--shape", choices=("messages", "bedrock"), default="messages", help="how the clients speak")
    args = parser.parse_args()
    match = re.fullmatch(r"http://([^:/]+):(\d+)/?", args.url)
    if not match:
        parser.error("--url must be http://HOST:PORT")
    target = Target("target", match.group(1), int(match.group(2)), headers=(("x-api-key", args.key),))
    load = Load(
        model=args.model,
        stream=not args.json,
        concurrency=args.concurrency,
        duration_s=None if args.requests else args.duration,
        requests=args.requests,
        warmup_s=args.warmup,
        warmup_requests=args.concurrency if args.requests else 0,
        shape=args.shape,
    )
    import uvloop

    result = uvloop.run(run_phase(target, load))
    print(json.dumps(result.summary(), indent=2))


if __name__ == "__main__":
    main()

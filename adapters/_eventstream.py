"""``application/vnd.amazon.eventstream``: a sans-IO decoder (bytes in, messages out) and an encoder.

Each message: ``total_length`` (u32), ``headers_length`` (u32), ``prelude_crc`` (CRC-32 of the first
8 bytes), headers, payload, ``message_crc`` (CRC-32 of everything before it). Integers big-endian.
A header is ``u8 name length``, name, ``u8 type``, value (docs/wire-formats.md §3.4). Both CRCs are checked;
any damage is an ``EventStreamError`` — the stream cannot be resynchronised after one.

The frame loop (walk the messages of a buffer, check both CRCs and the limits) is ``_scan_py`` below, or
the same loop compiled, ``adapters._eventstream_c.scan`` (adapters/_eventstream_c.c, built by setup.py when
there is a C compiler): ~12x fewer instructions than the Python loop. ``IMPLEMENTATION`` says which is in use
("c" or "python"); both give the same messages and the same errors for any input (tests/unit/test_eventstream.py).

The encoder ``encode_message`` exists for the fake Bedrock upstream in tests and the benchmark, so they send
frames with real CRCs that this decoder and botocore both accept. ``encode_chunks`` writes the one message
shape a Bedrock InvokeModelWithResponseStream client reads, an Anthropic event per ``chunk`` message
(``{"bytes":"<base64 of the event>"}``), many at once: ``adapters._eventstream_c.encode_chunks`` when it is
built, else its pure-Python twin ``encode_chunks_py``; both give the same bytes as ``encode_message`` with
``CHUNK_HEADERS`` (tests/unit/test_eventstream_encode.py).
"""

from __future__ import annotations

import struct
import uuid
from binascii import b2a_base64
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Union

try:  # python-isal: CRC-32 by carry-less multiplication, no lookup tables to evict (see docs/benchmarks.md)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover
    from zlib import crc32

if TYPE_CHECKING:
    from . import _eventstream_c

__all__ = [
    "CHUNK_HEADERS",
    "IMPLEMENTATION",
    "MAX_HEADERS_LENGTH",
    "MAX_PAYLOAD_LENGTH",
    "EventStreamDecoder",
    "EventStreamError",
    "EventStreamMessage",
    "HeaderValue",
    "encode_chunks",
    "encode_chunks_py",
    "encode_message",
    "parse_headers",
]

HeaderValue = Union[bool, int, bytes, str, uuid.UUID]  # noqa: UP007 (a runtime alias)

MAX_HEADERS_LENGTH = 128 * 1024
MAX_PAYLOAD_LENGTH = 24 * 1024 * 1024
_PRELUDE = struct.Struct(">III")
_MIN_LENGTH = 16  # prelude (12) + message CRC (4)

_BOOL_TRUE, _BOOL_FALSE, _BYTE, _SHORT, _INT, _LONG, _BYTES, _STRING, _TIMESTAMP, _UUID = range(10)
_FIXED = {
    _BYTE: struct.Struct(">b"),
    _SHORT: struct.Struct(">h"),
    _INT: struct.Struct(">i"),
    _LONG: struct.Struct(">q"),
}
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


class EventStreamError(Exception):
    """A damaged or oversized event-stream message. ``decoded``: the intact messages before it in the same
    input (as ``feed_raw`` returns them), so that nothing that arrived whole is lost."""

    def __init__(self, message: str, decoded: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.decoded = decoded or []


class Timestamp(int):
    """A header of the timestamp type: milliseconds since the epoch."""


class EventStreamMessage:
    __slots__ = ("headers", "payload")

    def __init__(self, headers: dict[str, HeaderValue], payload: bytes) -> None:
        self.headers = headers
        self.payload = payload

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EventStreamMessage) and (self.headers, self.payload) == (other.headers, other.payload)

    def __hash__(self) -> int:
        return hash(self.payload)

    def __repr__(self) -> str:
        return f"EventStreamMessage({self.headers!r}, {self.payload[:60]!r})"


class ScanResult(NamedTuple):
    """What the frame loop answers (``_scan_py``; the compiled one's ``_eventstream_c.ScanResult`` has the
    same fields, in the same order)."""

    payloads: list[bytes]  # the payloads of the leading run of messages whose header block is the known one
    frames: list[tuple[bytes, bytes]]  # every message from the first other one on, as (headers, payload)
    offset: int  # the offset of the first byte not consumed
    error: str | None  # None, or the message of the damage that stopped the walk


def _scan_py(buf: bytes, known: bytes | None) -> ScanResult:
    """The frame loop (``_eventstream_c.scan`` when it is built): the complete messages of ``buf`` from its
    start (see ``ScanResult``)."""
    payloads: list[bytes] = []
    out: list[tuple[bytes, bytes]] = []
    in_run = known is not None
    start = 0
    size = len(buf)
    unpack = _PRELUDE.unpack_from
    while size - start >= _MIN_LENGTH:
        total, headers_length, prelude_crc = unpack(buf, start)
        if crc32(buf[start : start + 8]) != prelude_crc:
            return ScanResult(payloads, out, start, "event-stream prelude CRC mismatch")
        if size - start < total:
            if headers_length > MAX_HEADERS_LENGTH or total - headers_length - _MIN_LENGTH > MAX_PAYLOAD_LENGTH:
                return ScanResult(payloads, out, start, f"event-stream message of {total} bytes exceeds the limits")
            break
        if total < headers_length + _MIN_LENGTH:
            return ScanResult(payloads, out, start, "event-stream message shorter than its own headers")
        end = start + total
        if crc32(buf[start + 8 : end - 4], prelude_crc) != _U32.unpack_from(buf, end - 4)[0]:
            return ScanResult(payloads, out, start, "event-stream message CRC mismatch")
        payload_start = start + 12 + headers_length
        headers = buf[start + 12 : payload_start]
        if in_run and headers == known:
            payloads.append(buf[payload_start : end - 4])
        else:
            in_run = False
            out.append((headers, buf[payload_start : end - 4]))
        start = end
    return ScanResult(payloads, out, start, None)


_scan: Callable[[bytes, bytes | None], ScanResult | _eventstream_c.ScanResult]
try:  # the same loop compiled (setup.py builds it when there is a C compiler)
    from ._eventstream_c import scan as _scan

    IMPLEMENTATION = "c"
except ImportError:  # pragma: no cover - no compiler where it was installed
    _scan = _scan_py
    IMPLEMENTATION = "python"


class EventStreamDecoder:
    """Feed it bytes as they arrive; it returns the messages they complete, whatever the chunking.

    Headers repeat from message to message (every chunk of a stream carries the same three), so parsed
    header blocks are cached by their bytes; the dicts returned are shared and must not be mutated.
    """

    __slots__ = ("_buf", "_fed", "_used")
    _scan = staticmethod(_scan)  # the frame loop, compiled when built (a test's subclass may swap in the other)

    def __init__(self) -> None:
        self._buf = b""
        self._fed = b""  # the bytes the last feed scanned, and how many of them made whole messages
        self._used = 0

    def feed(self, chunk: bytes) -> list[EventStreamMessage]:
        return [EventStreamMessage(parse_headers(raw), payload) for raw, payload in self.feed_raw(chunk)]

    def feed_raw(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """Like ``feed``, but each message as ``(header bytes, payload)``: a caller that knows the header
        block it expects (every Bedrock chunk carries the same one) compares bytes instead of parsing."""
        return self.feed_payloads(chunk, None)[1]

    def feed_payloads(self, chunk: bytes, known: bytes | None) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
        """The messages ``chunk`` completes as two lists: the payloads of the leading run of messages whose
        header block is ``known`` (all of them, as a rule, once a Bedrock stream's chunk headers are known),
        then every message from the first other one on as ``(header bytes, payload)``, in order. Damage:
        ``EventStreamError`` whose ``decoded`` holds the intact messages before it as ``feed_raw`` would."""
        buf = self._buf + chunk if self._buf else chunk
        scanned = self._scan(buf, known)
        if scanned.error is not None:
            frames = scanned.frames
            if scanned.payloads:
                assert known is not None
                frames = [(known, payload) for payload in scanned.payloads] + frames
            raise EventStreamError(scanned.error, frames)
        start = scanned.offset
        self._buf = buf[start:] if start < len(buf) else b""
        self._fed, self._used = buf, start
        return scanned.payloads, scanned.frames

    def last_span(self) -> tuple[bytes, int]:
        """What the last feed scanned and how many of its first bytes made the messages it returned (the rest
        is a partial message it keeps): ``last_messages`` without the copy, for a caller that may never need it."""
        return self._fed, self._used

    def last_messages(self) -> bytes:
        """The exact bytes of the messages the last feed returned (a partial one it keeps is not among them)."""
        fed, used = self._fed, self._used
        return fed if used == len(fed) else fed[:used]

    @property
    def pending(self) -> bool:
        return bool(self._buf)

    def close(self) -> None:
        """End of input: a half-received message is an error."""
        if self._buf:
            size = len(self._buf)
            self._buf = b""
            raise EventStreamError(f"event stream ended inside a message ({size} bytes left over)")


_HEADER_CACHE: dict[bytes, dict[str, HeaderValue]] = {}


def parse_headers(raw: bytes) -> dict[str, HeaderValue]:
    """A message's header block as a dict; cached by its bytes (the dict is shared: do not mutate it)."""
    headers = _HEADER_CACHE.get(raw)
    if headers is None:
        headers = _parse_headers(raw)
        if len(_HEADER_CACHE) < 256:
            _HEADER_CACHE[raw] = headers
    return headers


def _parse_headers(data: bytes) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = {}
    i = 0
    end = len(data)
    try:
        while i < end:
            name_length = data[i]
            name = data[i + 1 : i + 1 + name_length].decode("utf-8")
            i += 1 + name_length
            kind = data[i]
            i += 1
            value: HeaderValue
            if kind == _BOOL_TRUE:
                value = True
            elif kind == _BOOL_FALSE:
                value = False
            elif kind in _FIXED:
                fixed = _FIXED[kind]
                (value,) = fixed.unpack_from(data, i)
                i += fixed.size
            elif kind in (_BYTES, _STRING):
                (length,) = _U16.unpack_from(data, i)
                raw = data[i + 2 : i + 2 + length]
                if len(raw) != length:
                    raise EventStreamError("event-stream header value runs past the headers")
                value = raw.decode("utf-8") if kind == _STRING else raw
                i += 2 + length
            elif kind == _TIMESTAMP:
                value = Timestamp(_I64.unpack_from(data, i)[0])
                i += 8
            elif kind == _UUID:
                if i + 16 > end:
                    raise EventStreamError("event-stream UUID header runs past the headers")
                value = uuid.UUID(bytes=data[i : i + 16])
                i += 16
            else:
                raise EventStreamError(f"event-stream header {name!r} has unknown type {kind}")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EventStreamError(f"malformed event-stream headers: {exc}") from exc
    if i != end:
        raise EventStreamError("event-stream headers overrun their length")
    return headers


def _encode_header(name: str, value: HeaderValue) -> bytes:
    raw_name = name.encode("utf-8")
    head = bytes([len(raw_name)]) + raw_name
    if value is True:
        return head + bytes([_BOOL_TRUE])
    if value is False:
        return head + bytes([_BOOL_FALSE])
    if isinstance(value, Timestamp):
        return head + bytes([_TIMESTAMP]) + _I64.pack(value)
    if isinstance(value, int):
        for kind in (_BYTE, _SHORT, _INT, _LONG):
            fixed = _FIXED[kind]
            limit = 1 << (fixed.size * 8 - 1)
            if -limit <= value < limit:
                return head + bytes([kind]) + fixed.pack(value)
        raise ValueError(f"header {name!r}: integer out of range")
    if isinstance(value, uuid.UUID):
        return head + bytes([_UUID]) + value.bytes
    if isinstance(value, str):
        data = value.encode("utf-8")
        return head + bytes([_STRING]) + _U16.pack(len(data)) + data
    return head + bytes([_BYTES]) + _U16.pack(len(value)) + value


def encode_message(headers: dict[str, HeaderValue], payload: bytes) -> bytes:
    """One event-stream message with real CRCs."""
    raw_headers = b"".join(_encode_header(name, value) for name, value in headers.items())
    total = len(raw_headers) + len(payload) + _MIN_LENGTH
    prelude = struct.pack(">II", total, len(raw_headers))
    body = prelude + struct.pack(">I", crc32(prelude)) + raw_headers + payload
    return body + struct.pack(">I", crc32(body))


# The headers of every chunk message ``encode_chunks`` writes, in this order; their header block (75 bytes) is
# built once, here (mutating the dict changes nothing). The C encoder writes the same bytes
# (adapters/_eventstream_c.c).
CHUNK_HEADERS: dict[str, HeaderValue] = {
    ":event-type": "chunk",
    ":content-type": "application/json",
    ":message-type": "event",
}
_CHUNK_HEADER_BLOCK = b"".join(_encode_header(name, value) for name, value in CHUNK_HEADERS.items())
_CHUNK_PRELUDE = struct.Struct(">II")
_CHUNK_OPEN = b'{"bytes":"'
_CHUNK_CLOSE = b'"}'
_CHUNK_OVERHEAD = _MIN_LENGTH + len(_CHUNK_HEADER_BLOCK) + len(_CHUNK_OPEN) + len(_CHUNK_CLOSE)


def encode_chunks_py(datas: Sequence[bytes]) -> bytes:
    """Every event of ``datas`` as one ``chunk`` message (``CHUNK_HEADERS``, payload
    ``{"bytes":"<base64 of the event>"}``), concatenated: ``encode_message(CHUNK_HEADERS, payload)`` each.
    The pure-Python twin of ``_eventstream_c.encode_chunks``."""
    out: list[bytes] = []
    append = out.append
    pack_prelude = _CHUNK_PRELUDE.pack
    pack_u32 = _U32.pack
    headers = _CHUNK_HEADER_BLOCK
    headers_length = len(headers)
    for data in datas:
        digits = b2a_base64(data, newline=False)
        prelude = pack_prelude(len(digits) + _CHUNK_OVERHEAD, headers_length)
        body = b"".join((prelude, pack_u32(crc32(prelude)), headers, _CHUNK_OPEN, digits, _CHUNK_CLOSE))
        append(body)
        append(pack_u32(crc32(body)))
    return b"".join(out)


encode_chunks: Callable[[list[bytes]], bytes]
try:  # the same compiled (a stale build without it: the twin)
    from ._eventstream_c import encode_chunks
except ImportError:  # pragma: no cover - no compiler where it was installed
    encode_chunks = encode_chunks_py

"""The AWS event-stream decoder: every header type, both CRCs, any chunking; cross-checked with botocore.

Every decoder test runs against both frame loops: the pure-Python ``_scan_py`` and the compiled
``adapters._eventstream_c.scan`` (skipped when it is not built; ``test_the_compiled_loop_is_in_use``
fails when it is built but not the one in use). Hypothesis compares the two on random frame sequences,
forged preludes, random damage and random chunking.
"""

from __future__ import annotations

import base64
import importlib
import importlib.util
import itertools
import os
import random
import struct
import uuid
import zlib
from types import ModuleType
from typing import Any

import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import _eventstream
from adapters._eventstream import (
    MAX_HEADERS_LENGTH,
    MAX_PAYLOAD_LENGTH,
    EventStreamDecoder,
    EventStreamError,
    EventStreamMessage,
    HeaderValue,
    Timestamp,
    encode_message,
)


def _compiled() -> ModuleType | None:
    try:
        return importlib.import_module("adapters._eventstream_c")
    except ImportError:
        return None


C = _compiled()


class PythonDecoder(EventStreamDecoder):
    __slots__ = ()
    _scan = staticmethod(_eventstream._scan_py)


class CDecoder(EventStreamDecoder):
    __slots__ = ()
    _scan = staticmethod(C.scan if C is not None else _eventstream._scan_py)


needs_c = pytest.mark.skipif(C is None, reason="adapters._eventstream_c is not built")
DECODERS = [pytest.param(PythonDecoder, id="python"), pytest.param(CDecoder, id="c", marks=needs_c)]
each_decoder = pytest.mark.parametrize("cls", DECODERS)
Decoder = type[EventStreamDecoder]

CHUNK = {":message-type": "event", ":event-type": "chunk", ":content-type": "application/json"}


def chunk_event(data: bytes, pad: str = "abcdefgh") -> bytes:
    payload = b'{"bytes":"' + base64.b64encode(data) + b'","p":"' + pad.encode() + b'"}'
    return encode_message(dict(CHUNK), payload)


EVERY_TYPE: dict[str, HeaderValue] = {
    "t": True,
    "f": False,
    "byte": -7,
    "short": 1000,
    "int": -100_000,
    "long": 1 << 40,
    "bytes": b"\x00\xff raw",
    "string": "h\u00e9llo \U0001f600",
    "ts": Timestamp(1_764_000_000_000),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
}

STREAM = b"".join(
    [
        chunk_event(b'{"type":"message_start","message":{"id":"msg_bdrk_1"}}'),
        chunk_event(b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"h\xc3\xa9"}}', "x"),
        encode_message(EVERY_TYPE, b"payload"),
        encode_message({":message-type": "exception", ":exception-type": "throttlingException"}, b'{"message":"slow"}'),
        encode_message({":message-type": "error", ":error-code": "E", ":error-message": "bad"}, b""),
    ]
)


def decode(chunks: list[bytes], cls: Decoder = EventStreamDecoder) -> list[EventStreamMessage]:
    decoder = cls()
    out: list[EventStreamMessage] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    decoder.close()
    return out


def test_the_compiled_loop_is_in_use() -> None:
    """When the extension was built (its file is there), it must import and be the decoders' loop."""
    built = importlib.util.find_spec("adapters._eventstream_c") is not None
    if os.environ.get("MESSAGES_GATEWAY_REQUIRE_EXTENSION"):
        assert built, "adapters._eventstream_c was not built"
    if built:
        assert C is not None
        assert _eventstream.IMPLEMENTATION == "c"
        assert EventStreamDecoder._scan is C.scan
        assert (C.MAX_HEADERS_LENGTH, C.MAX_PAYLOAD_LENGTH) == (MAX_HEADERS_LENGTH, MAX_PAYLOAD_LENGTH)
    else:
        assert _eventstream.IMPLEMENTATION == "python"
        assert EventStreamDecoder._scan is _eventstream._scan_py


@needs_c
def test_compiled_crc32_is_zlibs() -> None:
    assert C is not None
    rng = random.Random(7)
    for n in [*range(300), 1000, 4096, 65_537]:
        data = rng.randbytes(n)
        for value in (0, 1, 0x12345678, 0xFFFFFFFF):
            expected = zlib.crc32(data, value)
            assert C.crc32(data, value) == C._crc32_table(data, value) == expected, (n, value)
    assert C.CRC in ("pclmul", "slicing-by-8")


@each_decoder
def test_every_header_type_round_trips(cls: Decoder) -> None:
    (message,) = decode([encode_message(EVERY_TYPE, b"payload")], cls)
    assert message.headers == EVERY_TYPE
    assert isinstance(message.headers["ts"], Timestamp)
    assert message.payload == b"payload"


@each_decoder
def test_botocore_reads_what_we_write_and_we_read_the_same(cls: Decoder) -> None:
    buffer = EventStreamBuffer()
    buffer.add_data(STREAM)
    theirs = [(m.headers, m.payload) for m in buffer]
    ours = decode([STREAM], cls)
    assert len(theirs) == len(ours) == 5
    for (headers, payload), message in zip(theirs, ours, strict=True):
        assert payload == message.payload
        for name, value in headers.items():
            mine = message.headers[name]
            if isinstance(mine, uuid.UUID):
                mine = mine.bytes
            assert mine == value, name


@each_decoder
def test_one_byte_at_a_time(cls: Decoder) -> None:
    assert decode([STREAM[i : i + 1] for i in range(len(STREAM))], cls) == decode([STREAM], PythonDecoder)


@each_decoder
@settings(max_examples=200)
@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=25))
def test_any_split_gives_the_same_messages(cls: Decoder, cuts: list[int]) -> None:
    points = sorted({0, len(STREAM), *cuts})
    assert decode([STREAM[a:b] for a, b in itertools.pairwise(points)], cls) == decode([STREAM], PythonDecoder)


FIRST = len(chunk_event(b'{"type":"message_start","message":{"id":"msg_bdrk_1"}}'))


@each_decoder
@pytest.mark.parametrize(
    ("offset", "what", "intact"),
    [(9, "prelude CRC", 0), (20, "message CRC", 0), (-2, "message CRC", 4), (FIRST + 3, "prelude CRC", 1)],
)
def test_damage_is_detected(cls: Decoder, offset: int, what: str, intact: int) -> None:
    damaged = bytearray(STREAM)
    damaged[offset] ^= 0x01
    with pytest.raises(EventStreamError, match=what) as caught:
        decode([bytes(damaged)], cls)
    assert caught.value.decoded == PythonDecoder().feed_raw(STREAM)[:intact]  # what arrived whole before it


@each_decoder
def test_damage_keeps_the_known_payloads_before_it(cls: Decoder) -> None:
    frames = PythonDecoder().feed_raw(STREAM)
    damaged = bytearray(STREAM)
    damaged[-2] ^= 0x01
    with pytest.raises(EventStreamError, match="message CRC") as caught:
        cls().feed_payloads(bytes(damaged), frames[0][0])
    assert caught.value.decoded == frames[:4]  # as feed_raw reports it: (headers, payload) pairs


@each_decoder
def test_truncated_stream_is_an_error_at_close(cls: Decoder) -> None:
    decoder = cls()
    messages = decoder.feed(STREAM[:-3])
    assert len(messages) == 4 and decoder.pending
    with pytest.raises(EventStreamError, match=r"ended inside a message \(\d+ bytes left over\)"):
        decoder.close()
    assert not decoder.pending
    decoder.close()  # nothing left: no error


def forged(total: int, headers_length: int, tail: bytes = b"") -> bytes:
    """A prelude with a valid CRC for any lengths, then ``tail``."""
    prelude = struct.pack(">II", total, headers_length)
    return prelude + struct.pack(">I", zlib.crc32(prelude)) + tail


@each_decoder
@pytest.mark.parametrize(
    ("total", "headers_length", "error"),
    [
        (64 * 1024 * 1024, 0, "of 67108864 bytes exceeds the limits"),
        (MAX_PAYLOAD_LENGTH + 17, 0, f"of {MAX_PAYLOAD_LENGTH + 17} bytes exceeds the limits"),
        (MAX_PAYLOAD_LENGTH + 16, 0, None),  # at the limit: wait for the rest
        (MAX_HEADERS_LENGTH + 1 + 16, MAX_HEADERS_LENGTH + 1, "exceeds the limits"),
        (MAX_HEADERS_LENGTH + 16, MAX_HEADERS_LENGTH, None),
        (0xFFFFFFFF, 0xFFFFFFFF, "of 4294967295 bytes exceeds the limits"),
        (100, 0xFFFFFFFF, "exceeds the limits"),  # more headers than bytes, still incomplete
        (20, 8, "shorter than its own headers"),  # complete (20 bytes), but 8 + 16 > 20
        (0, 0, "shorter than its own headers"),
        (15, 0, "shorter than its own headers"),
    ],
)
def test_lengths_are_checked_before_buffering(cls: Decoder, total: int, headers_length: int, error: str | None) -> None:
    decoder = cls()
    data = forged(total, headers_length, b"\0" * 8)
    if error is None:
        assert decoder.feed_raw(data) == [] and decoder.pending
    else:
        with pytest.raises(EventStreamError, match=error):
            decoder.feed_raw(data)


@each_decoder
def test_a_payload_as_large_as_allowed_decodes(cls: Decoder) -> None:
    big = encode_message({":message-type": "event"}, b"x" * MAX_PAYLOAD_LENGTH)
    decoder = cls()
    assert decoder.feed_raw(big[:100]) == []
    (message,) = decoder.feed(big[100:])
    assert len(message.payload) == MAX_PAYLOAD_LENGTH


@each_decoder
def test_feed_payloads_splits_off_the_leading_known_run(cls: Decoder) -> None:
    known = PythonDecoder().feed_raw(chunk_event(b"{}"))[0][0]
    other = encode_message({":message-type": "event", ":event-type": "other"}, b"o")
    stream = chunk_event(b"1") + chunk_event(b"2") + other + chunk_event(b"3")
    payloads, frames = cls().feed_payloads(stream, known)
    assert [base64.b64decode(p[10:14]) for p in payloads] == [b"1", b"2"]
    assert [h for h, _ in frames] == [PythonDecoder().feed_raw(other)[0][0], known]  # the rest as pairs, in order
    assert cls().feed_payloads(stream, None) == ([], cls().feed_raw(stream))
    assert cls().feed_payloads(stream, b"") == ([], cls().feed_raw(stream))
    headerless = encode_message({}, b"h")
    assert cls().feed_payloads(headerless + headerless, b"") == ([b"h", b"h"], [])


@needs_c
def test_the_compiled_loop_takes_bytes_only() -> None:
    assert C is not None
    with pytest.raises(TypeError):
        C.scan(bytearray(STREAM), None)
    with pytest.raises(TypeError):
        C.scan(STREAM, "headers")
    with pytest.raises(TypeError):
        C.scan(STREAM)
    assert C.scan(b"", None) == ([], [], 0, None)


@needs_c
def test_both_loops_answer_a_tuple_with_the_same_named_fields() -> None:
    assert C is not None
    assert C.ScanResult.__module__ == "adapters._eventstream_c"
    assert C.ScanResult.__match_args__ == _eventstream.ScanResult._fields == ("payloads", "frames", "offset", "error")
    first, second = chunk_event(b"{}"), chunk_event(b"[]", "p")
    damaged, cut = first + second[:-1] + bytes([second[-1] ^ 1]), first + second[:-3]
    known = PythonDecoder().feed_raw(first)[0][0]
    for scan, kind in ((C.scan, C.ScanResult), (_eventstream._scan_py, _eventstream.ScanResult)):
        for buf in (first + second, damaged, cut):
            scanned = scan(buf, known)
            assert type(scanned) is kind and isinstance(scanned, tuple)
            assert tuple(scanned) == (scanned.payloads, scanned.frames, scanned.offset, scanned.error)
        whole = scan(first + second, known)
        assert (len(whole.payloads), whole.frames, whole.offset, whole.error) == (2, [], len(first + second), None)
        assert [h for h, _ in scan(first + second, None).frames] == [known, known]
        assert (scan(damaged, known).offset, scan(damaged, known).error) == (
            len(first),
            "event-stream message CRC mismatch",
        )
        assert (scan(cut, known).offset, scan(cut, known).error) == (len(first), None)


# Random streams: real frames, forged preludes (any lengths, valid prelude CRC), garbage; then damage.
_header_values = st.one_of(
    st.booleans(),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.binary(max_size=20),
    st.text(max_size=20),
    st.builds(Timestamp, st.integers(0, 1 << 50)),
    st.uuids(),
)
_real = st.builds(
    encode_message,
    st.one_of(st.just(dict(CHUNK)), st.dictionaries(st.text(min_size=1, max_size=8), _header_values, max_size=4)),
    st.binary(max_size=300),
)
_forged = st.builds(
    forged,
    st.one_of(st.integers(0, 400), st.integers(0, 0xFFFFFFFF)),
    st.one_of(st.integers(0, 400), st.integers(0, 0xFFFFFFFF)),
    st.binary(max_size=64),
)
_piece = st.one_of(_real, _real, _real, _forged, st.binary(min_size=1, max_size=40))


def run(cls: Decoder, chunks: list[bytes], known: bytes | None) -> list[Any]:
    """Everything a decoder says about ``chunks``: each feed's lists or error (message, decoded), then close()."""
    decoder = cls()
    said: list[Any] = []
    for chunk in chunks:
        try:
            said.append(decoder.feed_payloads(chunk, known))
        except EventStreamError as exc:
            said.append(("error", str(exc), exc.decoded))
            return said
        said.append(decoder.pending)
    try:
        decoder.close()
    except EventStreamError as exc:
        said.append(("close", str(exc)))
    return said


@needs_c
@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(_piece, max_size=8),
    damage=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(1, 255)), max_size=3),
    truncate=st.one_of(st.none(), st.integers(0, 1 << 16)),
    cuts=st.lists(st.integers(0, 1 << 16), max_size=10),
    known=st.sampled_from([None, b"", "chunk"]),
)
def test_compiled_and_python_loops_agree(
    pieces: list[bytes],
    damage: list[tuple[int, int]],
    truncate: int | None,
    cuts: list[int],
    known: bytes | str | None,
) -> None:
    data = bytearray(b"".join(pieces))
    for at, flip in damage:
        if data:
            data[at % len(data)] ^= flip
    if truncate is not None and data:
        del data[truncate % len(data) :]
    stream = bytes(data)
    if known == "chunk":
        known = PythonDecoder().feed_raw(chunk_event(b"{}"))[0][0]
    assert not isinstance(known, str)
    assert C is not None
    for known_ in (known, None):
        assert C.scan(stream, known_) == _eventstream._scan_py(stream, known_)
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]
    assert run(CDecoder, chunks, known) == run(PythonDecoder, chunks, known)

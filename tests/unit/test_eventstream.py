"""The AWS event-stream decoder: every header type, both CRCs, any chunking; cross-checked with botocore."""

from __future__ import annotations

import base64
import itertools
import uuid

import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters._eventstream import (
    EventStreamDecoder,
    EventStreamError,
    EventStreamMessage,
    HeaderValue,
    Timestamp,
    encode_message,
)

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


def decode(chunks: list[bytes]) -> list[EventStreamMessage]:
    decoder = EventStreamDecoder()
    out: list[EventStreamMessage] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    decoder.close()
    return out


def test_every_header_type_round_trips() -> None:
    (message,) = decode([encode_message(EVERY_TYPE, b"payload")])
    assert message.headers == EVERY_TYPE
    assert isinstance(message.headers["ts"], Timestamp)
    assert message.payload == b"payload"


def test_botocore_reads_what_we_write_and_we_read_the_same() -> None:
    buffer = EventStreamBuffer()
    buffer.add_data(STREAM)
    theirs = [(m.headers, m.payload) for m in buffer]
    ours = decode([STREAM])
    assert len(theirs) == len(ours) == 5
    for (headers, payload), message in zip(theirs, ours, strict=True):
        assert payload == message.payload
        for name, value in headers.items():
            mine = message.headers[name]
            if isinstance(mine, uuid.UUID):
                mine = mine.bytes
            assert mine == value, name


def test_one_byte_at_a_time() -> None:
    assert decode([STREAM[i : i + 1] for i in range(len(STREAM))]) == decode([STREAM])


@settings(max_examples=300)
@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=25))
def test_any_split_gives_the_same_messages(cuts: list[int]) -> None:
    points = sorted({0, len(STREAM), *cuts})
    assert decode([STREAM[a:b] for a, b in itertools.pairwise(points)]) == decode([STREAM])


@pytest.mark.parametrize(("offset", "what"), [(9, "prelude CRC"), (20, "message CRC"), (-2, "message CRC")])
def test_damage_is_detected(offset: int, what: str) -> None:
    damaged = bytearray(STREAM)
    damaged[offset] ^= 0x01
    with pytest.raises(EventStreamError, match=what):
        decode([bytes(damaged)])


def test_truncated_stream_is_an_error_at_close() -> None:
    decoder = EventStreamDecoder()
    messages = decoder.feed(STREAM[:-3])
    assert len(messages) == 4 and decoder.pending
    with pytest.raises(EventStreamError, match="ended inside a message"):
        decoder.close()


def test_oversized_lengths_are_rejected_before_buffering() -> None:
    import struct
    from zlib import crc32

    prelude = struct.pack(">II", 64 * 1024 * 1024, 0)
    with pytest.raises(EventStreamError, match="exceeds the limit"):
        EventStreamDecoder().feed(prelude + struct.pack(">I", crc32(prelude)) + b"\0" * 8)

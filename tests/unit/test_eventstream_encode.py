"""The chunk encoder: ``encode_chunks`` (``adapters._eventstream_c.encode_chunks`` when built) and its
pure-Python twin ``encode_chunks_py`` give exactly ``encode_message(CHUNK_HEADERS, {"bytes":"<base64>"})``
per event, byte for byte, and what they write decodes back (through this module's decoder, both frame
loops, and botocore's) to the same events.

The compiled encoder's tests are skipped when the extension is not built, unless
MESSAGES_GATEWAY_REQUIRE_EXTENSION is set: then they fail (as ``test_the_compiled_loop_is_in_use`` of
tests/unit/test_eventstream.py does).
"""

from __future__ import annotations

import base64
import importlib
import importlib.util
import json
import os
import random
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import _eventstream
from adapters._eventstream import (
    CHUNK_HEADERS,
    EventStreamDecoder,
    HeaderValue,
    encode_chunks,
    encode_chunks_py,
    encode_message,
    parse_headers,
)


def _compiled() -> ModuleType | None:
    try:
        return importlib.import_module("adapters._eventstream_c")
    except ImportError:
        return None


C = _compiled()
REQUIRE_EXTENSION = bool(os.environ.get("MESSAGES_GATEWAY_REQUIRE_EXTENSION"))
needs_c = pytest.mark.skipif(C is None and not REQUIRE_EXTENSION, reason="adapters._eventstream_c is not built")

Encoder = Callable[[list[bytes]], bytes]


def _c_encode(datas: list[bytes]) -> bytes:
    assert C is not None, "adapters._eventstream_c was not built"
    out: bytes = C.encode_chunks(datas)
    return out


ENCODERS = [pytest.param(encode_chunks_py, id="python"), pytest.param(_c_encode, id="c", marks=needs_c)]
each_encoder = pytest.mark.parametrize("encode", ENCODERS)

ORDER = [":event-type", ":content-type", ":message-type"]


class PythonDecoder(EventStreamDecoder):
    __slots__ = ()
    _scan = staticmethod(_eventstream._scan_py)


def reference(datas: Sequence[bytes]) -> bytes:
    """What both encoders must write: encode_message with the three headers in ORDER."""
    headers: dict[str, HeaderValue] = {
        ":event-type": "chunk",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    assert list(headers) == ORDER
    return b"".join(encode_message(headers, b'{"bytes":"' + base64.b64encode(d) + b'"}') for d in datas)


def chunk_data(payload: bytes) -> bytes:
    """The event a chunk payload carries (decoded as any JSON, not by the encoder's own shape)."""
    document = json.loads(payload)
    assert list(document) == ["bytes"]
    return base64.b64decode(document["bytes"], validate=True)


def check_decodes(stream: bytes, datas: list[bytes]) -> None:
    """``stream`` is ``datas`` as chunk messages: for this module's decoder (both frame loops, whole and
    in pieces) and for botocore's."""
    payloads = [b'{"bytes":"' + base64.b64encode(d) + b'"}' for d in datas]
    for cls in (EventStreamDecoder, PythonDecoder):
        decoder = cls()
        messages = decoder.feed(stream)
        decoder.close()
        assert [m.payload for m in messages] == payloads
        assert [chunk_data(m.payload) for m in messages] == datas
        for m in messages:
            assert m.headers == CHUNK_HEADERS
            assert list(m.headers) == ORDER
        decoder = cls()
        raw = []
        for start in range(0, len(stream), 97):  # odd pieces: messages split everywhere
            raw += decoder.feed_raw(stream[start : start + 97])
        decoder.close()
        assert [payload for _, payload in raw] == payloads
        assert all(parse_headers(headers) == CHUNK_HEADERS for headers, _ in raw)
    buffer = EventStreamBuffer()
    buffer.add_data(stream)
    theirs: list[Any] = list(buffer)  # EventStreamMessage (botocore-stubs types the iteration oddly)
    assert [m.payload for m in theirs] == payloads
    assert [m.headers for m in theirs] == [CHUNK_HEADERS] * len(datas)
    assert all(list(m.headers) == ORDER for m in theirs)
    if C is not None:  # and the compiled chunk decoder of adapters/_bedrock_stream.py takes them back
        assert C.chunk_events(payloads) == datas


def test_the_compiled_encoder_is_in_use() -> None:
    """When the extension was built, ``encode_chunks`` is its encoder; else the twin."""
    built = importlib.util.find_spec("adapters._eventstream_c") is not None
    if REQUIRE_EXTENSION:
        assert built, "adapters._eventstream_c was not built"
    if built:
        assert C is not None
        assert encode_chunks is C.encode_chunks
    else:
        assert encode_chunks is encode_chunks_py


def test_the_header_order() -> None:
    assert list(CHUNK_HEADERS) == ORDER
    assert CHUNK_HEADERS == {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}


RNG = random.Random(20_251_201)
UTF8_EVENT = '{"type":"content_block_delta","delta":{"type":"text_delta","text":"h\u00e9llo \u4e16\u754c \U0001f600"}}'
UTF8_EVENT_BYTES = UTF8_EVENT.encode()
EDGE_CASES: list[list[bytes]] = [
    [],
    [b""],
    [b"", b"", b""],
    [b"a"],
    [b"ab"],
    [b"abc"],
    [RNG.randbytes(1 << 20)],  # 1 MiB
    [RNG.randbytes((1 << 20) + 1), b"", RNG.randbytes((1 << 20) + 2)],
    [UTF8_EVENT_BYTES, "\u00e9".encode(), "\u4e16".encode(), "\U0001f600".encode()],
    ["\u00e9\u00e8\u00ea".encode() * 50, "\U0001f600".encode() * 31],
    [bytes(range(256)), bytes(range(255, -1, -1)), b"\x00" * 7, b"\xff" * 8],
    [RNG.randbytes(n) for n in range(300)],  # every remainder of 3, and past the 64 bytes of the CRC's fast path
    [b'{"type":"ping"}'] * 200,
]


@each_encoder
@pytest.mark.parametrize("datas", EDGE_CASES, ids=range(len(EDGE_CASES)))
def test_edge_cases(encode: Encoder, datas: list[bytes]) -> None:
    stream = encode(datas)
    assert stream == reference(datas)
    check_decodes(stream, datas)


@needs_c
@settings(max_examples=500, deadline=None)
@given(
    datas=st.lists(
        st.one_of(
            st.binary(max_size=400),
            st.text(max_size=120).map(lambda text: text.encode("utf-8")),
            st.integers(0, 5000).map(lambda n: b"x" * n),
        ),
        max_size=12,
    )
)
def test_c_and_python_give_the_same_bytes(datas: list[bytes]) -> None:
    ours = _c_encode(datas)
    assert ours == encode_chunks_py(datas) == reference(datas)


@settings(max_examples=200, deadline=None)
@given(datas=st.lists(st.binary(max_size=300), max_size=8))
def test_random_events_decode_back(datas: list[bytes]) -> None:
    stream = encode_chunks(datas)
    assert stream == encode_chunks_py(datas) == reference(datas)
    check_decodes(stream, datas)


def test_the_twin_takes_any_sequence() -> None:
    datas = [b"one", b"two"]
    assert encode_chunks_py(tuple(datas)) == encode_chunks_py(datas) == reference(datas)


@needs_c
@pytest.mark.parametrize("bad", [(b"a",), b"abc", None, [b"a", "b"], [bytearray(b"a")], [memoryview(b"a")]])
def test_c_refuses_other_types(bad: object) -> None:
    assert C is not None, "adapters._eventstream_c was not built"
    with pytest.raises(TypeError, match="encode_chunks"):
        C.encode_chunks(bad)


@needs_c
def test_c_takes_bytes_subclasses() -> None:
    class Raw(bytes):
        pass

    datas = [Raw(b"abc"), Raw(b"")]
    assert _c_encode(list(datas)) == reference([b"abc", b""])

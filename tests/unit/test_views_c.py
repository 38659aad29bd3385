"""gateway/wire/_views_c.c: deltas of the common shape answered from cached views; whatever it answers must be
what msgspec alone answers (``decode_views`` without the extension), for any input."""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any
from unittest import mock

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire import events
from gateway.wire.events import MALFORMED, EventView, decode_views
from tests.edits import apply_edits, byte_edits

try:
    from gateway.wire import _views_c as C
except ImportError:  # pragma: no cover - not built here
    C = None  # type: ignore[assignment]

needs_c = pytest.mark.skipif(C is None, reason="gateway.wire._views_c is not built")


def reference(datas: list[bytes], array: bytes | None = None) -> list[EventView]:
    with mock.patch.object(events, "_scan_views", None):
        return decode_views(datas, array)


def builtins(views: list[EventView]) -> list[Any]:
    return [None if v is MALFORMED else msgspec.to_builtins(v) for v in views]


def compiled(datas: list[bytes], array: bytes | None = None, *, cold: bool = False) -> list[EventView]:
    if cold:
        with mock.patch.object(events, "_VIEW_CACHE", {}):
            return decode_views(datas, array)
    return decode_views(datas, array)


def same(datas: list[bytes], array: bytes | None = None) -> None:
    """Cold cache, then warm (the first call filled it), then warm again: msgspec's answer every time."""
    want = builtins(reference(datas, array))
    with mock.patch.object(events, "_VIEW_CACHE", {}):
        for _ in range(3):
            got = decode_views(datas, array)
            assert builtins(got) == want
            assert [v is MALFORMED for v in got] == [v is MALFORMED for v in reference(datas, array)]


def test_the_compiled_scan_is_in_use() -> None:
    built = importlib.util.find_spec("gateway.wire._views_c") is not None
    if os.environ.get("MESSAGES_GATEWAY_REQUIRE_EXTENSION"):
        assert built, "gateway.wire._views_c was not built"
    assert (events._scan_views is not None) == built


def delta(text: str, index: int = 0, kind: str = "text_delta", key: str = "text") -> bytes:
    return json.dumps(
        {"type": "content_block_delta", "index": index, "delta": {"type": kind, key: text}},
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


STREAM = [
    b'{"type":"message_start","message":{"id":"m","usage":{"input_tokens":5,"output_tokens":1}}}',
    b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
    delta("Hello"),
    delta(' w\u00f6rld \u20ac \U0001f600 "q" \\ /\n\t'),
    delta("", 0),
    b'{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{"type":"char_location"}}}',
    b'{"type":"content_block_stop","index":0}',
    b'{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}',
    delta('{"a":', 1, "input_json_delta", "partial_json"),
    delta("thinking", 12, "thinking_delta", "thinking"),
    delta("sig", 123456789, "signature_delta", "signature"),
    b'{"type":"ping"}',
    b'{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}',
    b'{"type":"message_stop"}',
]


@needs_c
def test_a_whole_stream_cold_and_warm() -> None:
    same(STREAM)
    same(STREAM, b"[" + b",".join(STREAM) + b"]")
    same([], b"[]")


@needs_c
def test_deltas_are_answered_from_the_cache_and_the_rest_by_msgspec() -> None:
    assert C is not None
    array = b"[" + b",".join(STREAM[:4]) + b"]"
    cache: dict[bytes, Any] = {}
    scanned = C.scan_views(array, cache)
    assert scanned is not None
    assert scanned.views == [None] * 4
    assert scanned.rest == array
    prefix = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    assert scanned.misses == [(0, None), (1, None), (2, prefix), (3, prefix)]
    marker = object()
    cache[prefix] = marker
    scanned = C.scan_views(array, cache)
    assert scanned is not None
    assert scanned.views == [None, None, marker, marker]
    assert scanned.rest == b"[" + b",".join(STREAM[:2]) + b"]"
    assert scanned.misses == [(0, None), (1, None)]
    assert C.scan_views(b"[" + STREAM[2] + b"]", cache) == ([marker], None, [])
    with mock.patch.object(events, "_VIEW_CACHE", {}):
        decode_views(STREAM)
        again = decode_views(STREAM)
        assert again[2] is again[3] is events._VIEW_CACHE[prefix]  # one shared view per prefix


@needs_c
def test_the_cache_stops_growing_when_full() -> None:
    with mock.patch.object(events, "_VIEW_CACHE", {}), mock.patch.object(events, "_VIEW_CACHE_SIZE", 3):
        decode_views([delta("x", i) for i in range(10)])
        assert len(events._VIEW_CACHE) == 3
        assert builtins(decode_views([delta("x", i) for i in range(10)])) == builtins(
            reference([delta("x", i) for i in range(10)])
        )


ODD = {
    "invalid utf-8": delta("ok")[:-4] + b'\xff"}}',
    "overlong utf-8": delta("ok")[:-4] + b'\xc0\xaf"}}',
    "surrogate in utf-8": delta("ok")[:-4] + b'\xed\xa0\x80"}}',
    "truncated utf-8": delta("ok")[:-4] + b'\xe2\x82"}}',
    "unicode escape": delta("ok")[:-4] + b'\\u00e9"}}',
    "lone surrogate escape": delta("ok")[:-4] + b'\\ud800"}}',
    "bad escape": delta("ok")[:-4] + b'\\q"}}',
    "control character": delta("ok")[:-4] + b'\x01"}}',
    "raw newline": delta("ok")[:-4] + b'\n"}}',
    "second type in delta": b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","type":"x"}}',
    "second type at the top": delta("a")[:-1] + b',"type":"ping"}',
    "leading zero": delta("ok").replace(b'"index":0', b'"index":01'),
    "negative index": delta("ok").replace(b'"index":0', b'"index":-1'),
    "huge index": delta("ok").replace(b'"index":0', b'"index":123456789012345678901234567890'),
    "float index": delta("ok").replace(b'"index":0', b'"index":0.5'),
    "string index": delta("ok").replace(b'"index":0', b'"index":"0"'),
    "non-string value": b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":5}}',
    "upper-case delta type": delta("ok", kind="Text_delta"),
    "extra member after": delta("ok")[:-2] + b',"x":1}}',
    "space": delta("ok").replace(b'"index":0', b'"index": 0'),
    "unterminated": delta("ok")[:-3],
    "not an object": b"5",
    "array": b"[1]",
    "deep": b'{"a":' * 70 + b"1" + b"}" * 70,
    "mismatched brackets": b'{"a":[1}]',
    "string with brackets": b'{"type":"ping","x":"}]{[\\""}',
}


@needs_c
@pytest.mark.parametrize("event", list(ODD.values()), ids=list(ODD))
def test_odd_events_get_msgspecs_answer(event: bytes) -> None:
    same([STREAM[2], event, STREAM[3]])
    same([event])
    same([], b"[" + STREAM[2] + b"," + event + b"]")


ARRAYS = {
    "trailing comma": b"[" + STREAM[2] + b",]",
    "leading comma": b"[," + STREAM[2] + b"]",
    "double comma": b"[" + STREAM[2] + b",," + STREAM[3] + b"]",
    "whitespace": b"[ " + STREAM[2] + b"]",
    "no brackets": STREAM[2],
    "empty": b"",
    "trailing bytes": b"[" + STREAM[2] + b"]x",
    "missing comma": b"[" + STREAM[2] + STREAM[3] + b"]",
}


@needs_c
@pytest.mark.parametrize("array", list(ARRAYS.values()), ids=list(ARRAYS))
def test_odd_arrays_get_msgspecs_answer(array: bytes) -> None:
    same([STREAM[2], STREAM[3]], array)
    same([], array)


_text = st.text(alphabet=st.sampled_from('ab é€😀"\\/\n\t\x00\x1f\x7f\u2028'), max_size=10)
_event = st.one_of(
    st.builds(delta, _text, st.integers(0, 3), st.sampled_from(["text_delta", "thinking_delta", "citations_delta"])),
    st.sampled_from(STREAM),
)


@needs_c
@settings(max_examples=400, deadline=None)
@given(
    datas=st.lists(_event, max_size=8),
    edits=byte_edits(b' "\\,:{}[]0189-.aetxyz_\x00\x01\n\x7f\x80\xbf\xc3\xe2\xed\xf0\xff', reach=2000),
)
def test_wherever_c_answers_it_is_msgspecs_answer(datas: list[bytes], edits: list[tuple[int, str, int]]) -> None:
    """Realistic events, then random edits of the array: the same views as msgspec alone, cache cold or warm."""
    array = apply_edits(b"[" + b",".join(datas) + b"]", edits)
    same(datas, array)
    same([], array)
    if not edits:
        same(datas)


@needs_c
def test_scan_views_arguments() -> None:
    assert C is not None
    with pytest.raises(TypeError):
        C.scan_views(bytearray(b"[]"), {})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        C.scan_views(b"[]", [])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        C.scan_views(b"[]")  # type: ignore[call-arg]
    assert C.scan_views(b"[]", {}) == ([], None, [])
    assert C.scan_views(b"x", {}) is None


@needs_c
def test_the_compiled_results_are_tuples_with_named_fields() -> None:
    """Like os.stat_result: a tuple (so it unpacks and compares as one) whose items are also named."""
    assert C is not None
    scanned = C.scan_views(b'[{"type":"ping"}]', {})
    assert type(scanned) is C.ScannedViews and isinstance(scanned, tuple)
    assert C.ScannedViews.__module__ == "gateway.wire._views_c"
    assert C.ScannedViews.__match_args__ == ("views", "rest", "misses")
    views, rest, misses = scanned
    assert (
        (views, rest, misses)
        == (scanned.views, scanned.rest, scanned.misses)
        == ([None], b'[{"type":"ping"}]', [(0, None)])
    )
    split = C.split_sse(b"event: a\ndata: 1\n\n")
    assert type(split) is C.SplitSse and isinstance(split, tuple)
    assert C.SplitSse.__match_args__ == ("events", "array", "frame_count")
    assert tuple(split) == (split.events, split.array, split.frame_count) == (b"event: a", b"[1]", 1)


# names_match: a block's event lines against its views' types, in place of the Python join (gateway/wire/sse.py)

_TYPES = st.one_of(
    st.sampled_from(["message_start", "content_block_delta", "ping", "", "message_stop", "a\nevent: b", "é"]),
    st.text(max_size=12),
)


def _events_for(types: list[str]) -> bytes:
    return b"event: " + "\nevent: ".join(types).encode("utf-8", "surrogatepass")


@needs_c
@settings(max_examples=500, deadline=None)
@given(
    st.lists(_TYPES, max_size=6),
    byte_edits(b"event: \n\xc3\xa9ap", reach=120),  # the names of exactly these types (no edit), or damaged
)
def test_names_match_is_the_join_compared(types: list[str], edits: list[tuple[int, str, int]]) -> None:
    from gateway.wire.sse import names_match_py

    views = [EventView(type=t) for t in types]
    events_ = _events_for(types)
    events_ = apply_edits(events_, edits)
    try:
        expected: bool | type[BaseException] = names_match_py(events_, views)
    except UnicodeEncodeError:  # a lone surrogate (st.text draws them): the same error from both
        expected = UnicodeEncodeError
    if expected is UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            C.names_match(events_, views)
    else:
        assert C.names_match(events_, views) is expected


@needs_c
def test_names_match_cases() -> None:
    start, delta = EventView(type="message_start"), EventView(type="content_block_delta")
    assert C.names_match(b"event: message_start\nevent: content_block_delta", [start, delta])
    assert not C.names_match(b"event: message_start\nevent: content_block_delta", [delta, start])
    assert not C.names_match(b"event: message_start\nevent: content_block_delt", [start, delta])
    assert not C.names_match(b"event: message_start\nevent: content_block_delta\n", [start, delta])
    assert not C.names_match(b"event: message_start", [start, delta])
    assert C.names_match(b"event: ", []) and not C.names_match(b"", [])
    assert C.names_match(b"event: ", [MALFORMED])  # the untyped view: an empty name

    # a class of other views (no slot, a property): read through getattr; the last class read is remembered
    class Other:
        @property
        def type(self) -> str:
            return "ping"

    assert C.names_match(b"event: ping\nevent: message_start\nevent: ping", [Other(), start, Other()])
    with pytest.raises(TypeError, match="expected str instance, int found"):
        C.names_match(b"event: 1", [EventView(type=1)])  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        C.names_match(b"event: x", [object()])
    with pytest.raises(TypeError):
        C.names_match("event: x", [start])  # type: ignore[arg-type]


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 299), st.integers(0, 255))
def test_is_ascii_is_bytes_isascii(data: bytes, at: int, byte: int) -> None:
    # any length (the vectorised loop's body and its tail), one byte set anywhere, any value
    if data:
        data = data[: at % len(data)] + bytes([byte]) + data[at % len(data) + 1 :]
    ascii_ = bytes(b & 0x7F for b in data)
    assert C.is_ascii(data) is data.isascii()
    assert C.is_ascii(ascii_) is True
    big = ascii_ * 200  # past any unrolled width, the odd byte last
    assert C.is_ascii(big + bytes([byte])) is (byte < 0x80)
    with pytest.raises(TypeError):
        C.is_ascii(bytearray(data))  # type: ignore[arg-type]
    for odd in (b"\x80", b"\x00" * 40 + b"\x80", b"\x7f" * 33 + b"\xff"):  # the high bit alone, or with all
        assert C.is_ascii(odd) is False

"""The Bedrock event-stream → canonical batches transcoder, fed from an in-memory response."""

from __future__ import annotations

import asyncio
import base64
import importlib
import importlib.util
import json
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import _bedrock_stream
from adapters._bedrock_stream import BedrockEventStream
from adapters._eventstream import encode_message
from gateway.wire.sse import encode_frames
from gateway.wire.validate import StreamValidator
from tests.edits import apply_edits, byte_edits
from tests.fakes.claude_api import get_scenario
from tests.unit.test_eventstream import C

CHUNK = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}


def chunk(event: dict[str, Any], pad: str = "abcdef") -> bytes:
    data = json.dumps(event, separators=(",", ":")).encode()
    return encode_message(CHUNK, json.dumps({"bytes": base64.b64encode(data).decode(), "p": pad}).encode())


def exception(name: str, message: str) -> bytes:
    headers = {":message-type": "exception", ":exception-type": name, ":content-type": "application/json"}
    return encode_message(headers, json.dumps({"message": message}).encode())  # type: ignore[arg-type]


EVENTS = get_scenario("fake-citations").events
METRICS = {"inputTokenCount": 0, "outputTokenCount": 0, "invocationLatency": 10, "firstByteLatency": 5}


def body(events: list[dict[str, Any]] = EVENTS, metrics: dict[str, int] | None = None) -> bytes:
    frames = []
    for i, event in enumerate(events):
        if event["type"] == "message_stop" and metrics is not None:
            event = {**event, "amazon-bedrock-invocationMetrics": metrics}
        frames.append(chunk(event, "p" * (i % 7)))
    return b"".join(frames)


class Resp:
    status = 200
    headers: dict[str, str] = {}

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def chunks(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part

    async def read(self, limit: int | None = None) -> bytes:
        return b"".join(self.parts)

    async def aclose(self) -> None:
        return None


def run(parts: list[bytes], on_mismatch: Any = None) -> list[tuple[str, bytes]]:
    async def main() -> list[tuple[str, bytes]]:
        stream = BedrockEventStream(Resp(parts), "bedrock", on_mismatch)  # type: ignore[arg-type]
        validator = StreamValidator()
        out = []
        async for batch in stream.batches():
            validator.check_all(batch.views)
            out += [(view.type, data) for view, data in zip(batch.views, batch.datas, strict=True)]
        return out

    return asyncio.run(main())


def expected(events: list[dict[str, Any]] = EVENTS) -> list[tuple[str, bytes]]:
    return [(e["type"], json.dumps(e, separators=(",", ":")).encode()) for e in events]


def _usage_metrics() -> dict[str, int]:
    start = EVENTS[0]["message"]["usage"]["input_tokens"]
    out = next(e for e in EVENTS if e["type"] == "message_delta")["usage"]["output_tokens"]
    return {**METRICS, "inputTokenCount": start, "outputTokenCount": out}


def test_whole_stream_one_read() -> None:
    assert run([body(metrics=_usage_metrics())]) == expected()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=60))
def test_any_chunking_gives_the_same_events(sizes: list[int]) -> None:
    data = body(metrics=_usage_metrics())
    parts, at = [], 0
    for size in sizes:
        parts.append(data[at : at + size])
        at += size
    parts.append(data[at:])
    assert run([p for p in parts if p]) == expected()


def test_one_byte_at_a_time() -> None:
    data = body()
    assert run([data[i : i + 1] for i in range(len(data))]) == expected()


def test_metrics_stripped_and_mismatch_counted() -> None:
    seen: list[int] = []
    got = run([body(metrics={**_usage_metrics(), "outputTokenCount": 999})], lambda: seen.append(1))
    assert got[-1] == ("message_stop", b'{"type":"message_stop"}')
    assert seen == [1]
    run([body(metrics=_usage_metrics())], lambda: seen.append(2))
    assert seen == [1]  # equal counts: nothing counted


def test_damage_in_the_same_read_keeps_what_came_before() -> None:
    good = body(EVENTS[:3])
    bad = bytearray(chunk(EVENTS[3]))
    bad[-1] ^= 0xFF
    got = run([good + bytes(bad) + chunk(EVENTS[4])])
    assert got[:3] == expected(EVENTS[:3])
    assert got[3][0] == "error" and b"CRC" in got[3][1] and len(got) == 4


def test_exception_frame_after_events() -> None:
    got = run([body(EVENTS[:3]) + exception("throttlingException", "slow down") + chunk(EVENTS[3])])
    assert got[:3] == expected(EVENTS[:3])
    assert got[3] == ("error", b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}')
    assert len(got) == 4


def test_malformed_chunk_json_keeps_the_events_before() -> None:
    broken = encode_message(CHUNK, b'{"bytes": "not base64!!"}')  # type: ignore[arg-type]
    got = run([body(EVENTS[:2]) + broken + chunk(EVENTS[2])])
    assert got[:2] == expected(EVENTS[:2])
    assert got[2][0] == "error" and len(got) == 3


def test_other_event_types_are_skipped() -> None:
    other = encode_message({":message-type": "event", ":event-type": "initial-response"}, b"{}")  # type: ignore[arg-type]
    assert run([other + body()]) == expected()


def test_stream_ending_inside_a_frame_is_an_error() -> None:
    data = body()
    got = run([data[:-10]])
    assert got[-1][0] == "error" and b"ended inside a message" in got[-1][1]
    assert "message_stop" not in [t for t, _ in got]


def test_multi_line_json_is_put_on_one_line() -> None:
    pretty = json.dumps(EVENTS[1], indent=2).replace("\n", "\r\n").encode()
    frame = encode_message(CHUNK, json.dumps({"bytes": base64.b64encode(pretty).decode()}).encode())  # type: ignore[arg-type]
    got = run([chunk(EVENTS[0]) + frame + body(EVENTS[2:])])
    assert got == expected()


# The chunk payloads of Bedrock's exact shape are decoded in C (``_eventstream_c.chunk_events``); any other
# shape falls back to msgspec. Where C answers, it must give msgspec's bytes.


needs_c = pytest.mark.skipif(C is None, reason="adapters._eventstream_c is not built")


def msgspec_datas(payloads: list[bytes]) -> list[bytes]:
    """``_chunk_datas`` as it is without the extension: msgspec only."""
    with mock.patch.object(_bedrock_stream, "_chunk_events", None):
        return BedrockEventStream._chunk_datas(payloads)


def canonical(data: bytes, pad: str | None = "abc") -> bytes:
    """A chunk payload as Bedrock writes it: no whitespace, ``bytes`` first, the padding last (or none)."""
    head = b'{"bytes":"' + base64.b64encode(data) + b'"'
    return head + (b"}" if pad is None else b',"p":"' + pad.encode() + b'"}')


def c_chunk(event: dict[str, Any], pad: str | None = "abcdef") -> bytes:
    data = json.dumps(event, separators=(",", ":")).encode()
    return encode_message(CHUNK, canonical(data, pad))  # type: ignore[arg-type]


def test_the_compiled_chunk_decoder_is_in_use() -> None:
    built = importlib.util.find_spec("adapters._eventstream_c") is not None
    if built:
        assert C is not None
        assert _bedrock_stream._chunk_events is C.chunk_events
    else:
        assert _bedrock_stream._chunk_events is None


def test_whole_stream_of_canonical_chunks() -> None:
    events = [
        {**e, "amazon-bedrock-invocationMetrics": _usage_metrics()} if e["type"] == "message_stop" else e
        for e in EVENTS
    ]
    frames = [c_chunk(e, None if i % 3 == 0 else "x" * i) for i, e in enumerate(events)]
    assert run([b"".join(frames)]) == expected()
    # canonical and other shapes in the same read: msgspec for the whole read, the same events
    mixed = [*frames[:2], chunk(EVENTS[2]), *frames[3:]]
    assert run([b"".join(mixed)]) == expected()


def test_malformed_canonical_looking_chunk_keeps_the_events_before() -> None:
    broken = encode_message(CHUNK, b'{"bytes":"QQ=!","p":"abc"}')  # type: ignore[arg-type]
    got = run([b"".join(c_chunk(e) for e in EVENTS[:2]) + broken + c_chunk(EVENTS[2])])
    assert got[:2] == expected(EVENTS[:2])
    assert got[2][0] == "error" and len(got) == 3


_pad = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7F, exclude_characters='"\\'), max_size=30)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300), st.one_of(st.none(), _pad)), max_size=8))
def test_canonical_chunks_decode_in_c_as_msgspec_does(chunks: list[tuple[bytes, str | None]]) -> None:
    assert C is not None
    payloads = [canonical(data, pad) for data, pad in chunks]
    datas = [data for data, _ in chunks]
    assert C.chunk_events(payloads) == datas
    assert msgspec_datas(payloads) == datas
    assert BedrockEventStream._chunk_datas(payloads) == datas


@needs_c
@settings(max_examples=500, deadline=None)
@given(
    data=st.binary(max_size=40),
    pad=st.one_of(st.none(), st.text(max_size=8)),
    edits=byte_edits(b' "\\,:{}=+/pAQ_-\x00\x1f\x7f\x80\xff', reach=200),
)
def test_wherever_c_answers_it_is_msgspecs_answer(
    data: bytes, pad: str | None, edits: list[tuple[int, str, int]]
) -> None:
    """Canonical payloads (padding of any text, JSON-escaped), then random edits: C says None, or msgspec's bytes."""
    assert C is not None
    if pad is None:
        payload = canonical(data, None)
    else:
        payload = b'{"bytes":"' + base64.b64encode(data) + b'","p":' + json.dumps(pad).encode() + b"}"
    payloads = [canonical(b"first"), apply_edits(payload, edits)]
    reference = msgspec_datas(payloads)
    got = C.chunk_events(payloads)
    if got is not None:
        assert got == reference and len(got) == 2
    assert BedrockEventStream._chunk_datas(payloads) == reference


NOT_CANONICAL = {
    "spaces": b'{"bytes": "QUJD", "p": "abc"}',
    "space before }": b'{"bytes":"QUJD" }',
    "p first": b'{"p":"abc","bytes":"QUJD"}',
    "extra member": b'{"bytes":"QUJD","p":"abc","q":1}',
    "other member": b'{"bytes":"QUJD","q":"abc"}',
    "escaped slash": b'{"bytes":"QU\\/D","p":"abc"}',
    "escape in padding": b'{"bytes":"QUJD","p":"a\\"bc"}',
    "invalid base64 char": b'{"bytes":"QU!D","p":"abc"}',
    "url-safe base64": b'{"bytes":"_-_-"}',
    "bad length": b'{"bytes":"QUJDR","p":"abc"}',
    "no padding": b'{"bytes":"QQ"}',
    "too much padding": b'{"bytes":"Q==="}',
    "padding inside": b'{"bytes":"QQ==QUJD"}',
    "non-canonical padding bits": b'{"bytes":"QR=="}',
    "non-canonical padding bits (=)": b'{"bytes":"QUJ="}',
    "truncated": b'{"bytes":"QUJD","p":"ab',
    "truncated base64": b'{"bytes":"QUJD',
    "no closing brace": b'{"bytes":"QUJD"',
    "trailing byte": b'{"bytes":"QUJD"}\n',
    "control char in padding": b'{"bytes":"QUJD","p":"a\x01"}',
    "non-ASCII padding": b'{"bytes":"QUJD","p":"\xc3\xa9"}',
    "not an object": b'"QUJD"',
    "empty": b"",
    "null bytes": b'{"bytes":null}',
}


@needs_c
@pytest.mark.parametrize("payload", list(NOT_CANONICAL.values()), ids=list(NOT_CANONICAL))
def test_other_shapes_are_left_to_msgspec(payload: bytes) -> None:
    assert C is not None
    for payloads in ([payload], [canonical(b"one"), payload, canonical(b"two")]):
        assert C.chunk_events(payloads) is None
        assert BedrockEventStream._chunk_datas(payloads) == msgspec_datas(payloads)
    assert BedrockEventStream._chunk_datas([canonical(b"one"), payload]) == msgspec_datas([canonical(b"one"), payload])


@needs_c
def test_chunk_events_edge_cases() -> None:
    assert C is not None
    assert C.chunk_events([]) == []
    assert BedrockEventStream._chunk_datas([]) == msgspec_datas([]) == []
    assert C.chunk_events([b'{"bytes":""}', b'{"bytes":"","p":""}', b'{"bytes":"AA==","p":"\x7f"}']) == [
        b"",
        b"",
        b"\0",
    ]
    assert C.chunk_events([b'{"bytes":"+/+/"}']) == [b"\xfb\xff\xbf"]
    with pytest.raises(TypeError):
        C.chunk_events((b'{"bytes":""}',))
    with pytest.raises(TypeError):
        C.chunk_events([bytearray(b'{"bytes":""}')])
    with pytest.raises(TypeError):
        C.chunk_events([b'{"bytes":"QUJD"}', "text"])


@pytest.mark.parametrize("split", [False, True])
def test_a_text_quoting_the_metrics_key_is_kept_and_the_metrics_still_stripped(split: bool) -> None:
    """The key in an answer's text is not Bedrock's metrics: the text goes out unchanged (same read as the
    message_stop or not) while the metrics on the message_stop are still removed and checked."""
    quoted = "see amazon-bedrock-invocationMetrics in the docs"
    events = [dict(e) for e in EVENTS]
    i = next(i for i, e in enumerate(events) if e["type"] == "content_block_delta" and "text" in e["delta"])
    events[i] = {**events[i], "delta": {"type": "text_delta", "text": quoted}}
    data = body(events, metrics={**_usage_metrics(), "outputTokenCount": 999})
    seen: list[int] = []
    parts = [data[: len(data) // 2], data[len(data) // 2 :]] if split else [data]
    got = run(parts, lambda: seen.append(1))
    assert got == expected(events)
    assert seen == [1]


# A read of chunk frames only goes out through ``_eventstream_c.chunk_batch`` (one JSON array, the SSE and
# the names built in C); every other read takes the general path. Both must give the same batches.


def cbody(events: list[dict[str, Any]] = EVENTS, metrics: dict[str, int] | None = None) -> bytes:
    """``body`` with the chunk payloads in Bedrock's exact shape (what the C path takes)."""
    frames = []
    for i, event in enumerate(events):
        if event["type"] == "message_stop" and metrics is not None:
            event = {**event, "amazon-bedrock-invocationMetrics": metrics}
        frames.append(c_chunk(event, "p" * (i % 7) if i % 5 else None))
    return b"".join(frames)


def run_batches(parts: list[bytes], fast: bool) -> tuple[list[tuple[list[Any], bytes]], int]:
    """Every batch as (views as builtins, SSE), and how many metrics mismatches were counted."""
    seen: list[int] = []

    async def main() -> list[tuple[list[Any], bytes]]:
        stream = BedrockEventStream(Resp(parts), "bedrock", lambda: seen.append(1))  # type: ignore[arg-type]
        out = []
        async for batch in stream.batches():
            raw = batch.raw if batch.raw is not None else encode_frames(batch.views, batch.datas)
            out.append(([msgspec.to_builtins(v) for v in batch.views], raw))
        return out

    if fast:
        return asyncio.run(main()), len(seen)
    with mock.patch.object(_bedrock_stream, "_chunk_batch", None):
        return asyncio.run(main()), len(seen)


def test_the_whole_batch_is_built_in_c_when_built() -> None:
    if C is None:
        assert _bedrock_stream._chunk_batch is None
        return
    assert _bedrock_stream._chunk_batch is C.chunk_batch
    calls: list[int] = []
    real = C.chunk_batch

    def spy(payloads: list[bytes]) -> Any:
        result = real(payloads)
        calls.append(result is not None)
        return result

    data = cbody(metrics=_usage_metrics())
    with mock.patch.object(_bedrock_stream, "_chunk_batch", spy):
        fast = run_batches([data], True)
    assert calls == [True]  # the first frame's headers were learnt in the same read
    assert fast == run_batches([data], False)
    assert fast[1] == 0 and len(fast[0]) == 1


_event_text = st.text(alphabet=st.sampled_from('ab é\n\r"\\\t€😀'), max_size=12)


@needs_c
@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(_event_text, min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=4),
    metrics_out=st.sampled_from([None, 0, 1]),
    quote_metrics=st.booleans(),
    reorder=st.booleans(),
)
def test_c_batches_equal_the_general_path(
    texts: list[str], cuts: list[int], metrics_out: int | None, quote_metrics: bool, reorder: bool
) -> None:
    """Random texts (newlines, escapes, non-ASCII), metrics present or not and matching or not, a text that
    quotes the metrics key, an event whose ``type`` is not its first member, any chunking: the same views,
    SSE and mismatch count with chunk_batch as without it."""
    events: list[dict[str, Any]] = [
        EVENTS[0],
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]
    for text in texts:
        events.append({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})
    if quote_metrics:
        events.append(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "amazon-bedrock-invocationMetrics"},
            }
        )
    if reorder:
        events.append({"index": 0, "type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}})
    usage = {"output_tokens": 7}
    events += [
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": usage},
        {"type": "message_stop"},
    ]
    metrics = (
        None
        if metrics_out is None
        else {
            **METRICS,
            "inputTokenCount": EVENTS[0]["message"]["usage"]["input_tokens"],
            "outputTokenCount": 7 + metrics_out,
        }
    )
    data = cbody(events, metrics)
    parts, at = [], 0
    for cut in sorted(set(cuts)):
        if at < cut < len(data):
            parts.append(data[at:cut])
            at = cut
    parts.append(data[at:])
    fast, slow = run_batches(parts, True), run_batches(parts, False)
    assert fast == slow
    assert fast[1] == (metrics_out or 0)
    sse = b"".join(raw for _, raw in fast[0])
    assert b"amazon-bedrock-invocationMetrics" not in sse.replace(b'"text":"amazon-bedrock-invocationMetrics"', b"")


CHUNK_BATCH_NONE = {
    "type not first": b'{"index":0,"type":"ping"}',
    "upper-case name": b'{"type":"Ping"}',
    "digit in name": b'{"type":"ping2"}',
    "empty name": b'{"type":""}',
    "escaped name": b'{"type":"p\\u0069ng"}',
    "name too long": b'{"type":"' + b"a" * 65 + b'"}',
    "line feed": b'{"type":"ping",\n"x":1}',
    "carriage return": b'{"type":"ping","x":"\r"}',
    "space after brace": b'{ "type":"ping"}',
    "unterminated name": b'{"type":"ping',
}


@needs_c
@pytest.mark.parametrize("event", list(CHUNK_BATCH_NONE.values()), ids=list(CHUNK_BATCH_NONE))
def test_chunk_batch_leaves_other_events_to_the_general_path(event: bytes) -> None:
    assert C is not None
    assert C.chunk_batch([canonical(b'{"type":"ping"}'), canonical(event)]) is None
    assert C.chunk_events([canonical(event)]) == [event]  # still a chunk: only the fast path declines


@needs_c
def test_chunk_batch_layout() -> None:
    assert C is not None
    events = [
        b'{"type":"message_start","message":{}}',
        b'{"type":"a_b"}',
        b'{"type":"' + b"z" * 64 + b'","x":"\xc3\xa9"}',
    ]
    built = C.chunk_batch([canonical(e, None) for e in events])
    assert type(built) is C.ChunkBatch and isinstance(built, tuple)
    assert C.ChunkBatch.__match_args__ == ("array", "sse", "names", "last_at", "last_frame_at")
    array, sse, names, last_at, last_frame_at = built  # still a tuple
    assert (built.array, built.sse, built.names, built.last_at, built.last_frame_at) == tuple(built)
    assert array == b"[" + b",".join(events) + b"]"
    assert sse == b"".join(b"event: " + e[9 : e.index(b'"', 9)] + b"\ndata: " + e + b"\n\n" for e in events)
    assert names == b"message_start\na_b\n" + b"z" * 64
    assert array[last_at:-1] == events[-1]
    assert sse[last_frame_at:] == b"event: " + b"z" * 64 + b"\ndata: " + events[-1] + b"\n\n"
    assert C.chunk_batch([]) is None
    assert C.chunk_batch([canonical(b'{"type":"ping"}'), b'{"bytes":"QU!D"}']) is None  # not a chunk of the shape
    with pytest.raises(TypeError):
        C.chunk_batch((canonical(b"{}"),))
    with pytest.raises(TypeError):
        C.chunk_batch([canonical(b'{"type":"ping"}'), "text"])

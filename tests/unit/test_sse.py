"""The SSE decoder: any split of the bytes gives the same frames (Hypothesis picks the cuts)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire.sse import SseDecoder, SseFrame, encode_frame

FIXTURES = Path(__file__).parent.parent / "fixtures" / "claude"

BODY = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"m","content":[]}}\n\n'
    b": a comment line\n\n"
    + b"event: content_block_delta\n"
    + b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
    + '"h\u00e9llo \U0001f600 \u4e16\u754c"}}\n\n'.encode()
    + b'event: ping\r\ndata: {"type": "ping"}\r\n\r\n'
    + b'data: {"type":"no_event_line"}\r\r'
    b"event: multi\ndata: line one\ndata:line two\nid: 7\nretry: 10\n\n"
)


def frames(chunks: list[bytes]) -> list[SseFrame]:
    decoder = SseDecoder()
    out: list[SseFrame] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    out += decoder.close()
    return out


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(body), *cuts})
    return [body[a:b] for a, b in itertools.pairwise(points)]


def test_whole_body() -> None:
    got = frames([BODY])
    assert [f.event for f in got] == [b"message_start", b"content_block_delta", b"ping", None, b"multi"]
    assert got[1].data.decode().endswith('"h\u00e9llo \U0001f600 \u4e16\u754c"}}')
    assert got[2].data == b'{"type": "ping"}'
    assert got[3].data == b'{"type":"no_event_line"}'
    assert got[4].data == b"line one\nline two"


def test_one_byte_at_a_time() -> None:
    assert frames([BODY[i : i + 1] for i in range(len(BODY))]) == frames([BODY])


@settings(max_examples=300)
@given(cuts=st.lists(st.integers(0, len(BODY)), max_size=25))
def test_any_split_gives_same_frames(cuts: list[int]) -> None:
    assert frames(split_at(BODY, cuts)) == frames([BODY])


def test_multibyte_character_split_across_chunks() -> None:
    emoji_at = BODY.index("\U0001f600".encode())
    chunks = [BODY[: emoji_at + 2], BODY[emoji_at + 2 :]]
    assert frames(chunks) == frames([BODY])


def test_unterminated_frame_is_not_emitted() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"event: message_stop\ndata: {}") == []
    assert decoder.pending
    assert decoder.close() == []


def test_encode_frame_round_trips() -> None:
    data = b'{"type":"message_stop"}'
    assert frames([encode_frame("message_stop", data)]) == [SseFrame(b"message_stop", data)]


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.sse")), ids=lambda p: p.stem)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_recorded_streams_split_invariant(path: Path, data: st.DataObject) -> None:
    body = path.read_bytes()
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=30))
    whole = frames([body])
    assert whole, "a recorded stream has frames"
    assert frames(split_at(body, cuts)) == whole


def test_an_unfinished_frame_past_the_limit_is_refused_and_small_reads_stay_linear() -> None:
    import pytest

    from gateway.wire.sse import FrameTooLarge

    decoder = SseDecoder(max_frame=1000)
    decoder.feed_block(b"event: a\ndata: ")
    for _ in range(30):
        decoder.feed_block(b"x" * 30)  # 900 bytes pending: still allowed
    with pytest.raises(FrameTooLarge, match="over 1000 bytes"):
        decoder.feed_block(b"x" * 200)
    assert not decoder.pending  # nothing is kept of it
    # a frame that arrives in one-byte reads is found, whatever the reads
    frame = b'event: ping\ndata: {"type":"ping"}\n\n'
    decoder = SseDecoder()
    blocks = [decoder.feed_block(frame[i : i + 1]) for i in range(len(frame))]
    assert b"".join(blocks) == frame and blocks[-1] == frame

"""Upstream SSE blocks become batches: canonical blocks are kept as bytes, anything else is re-framed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.base import batch_of_block
from gateway.wire import sse
from gateway.wire.events import COMPILED_VIEWS, MALFORMED, decode_view
from gateway.wire.sse import SseDecoder, split_block, split_canonical, split_canonical_py
from tests.edits import apply_edits, byte_edits

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "claude").glob("*.sse"))


def block_of(body: bytes) -> bytes:
    return SseDecoder().feed_block(body)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_recorded_streams_are_canonical_and_kept_as_is(path: Path) -> None:
    body = path.read_bytes()
    block = block_of(body)
    batch = batch_of_block(block)
    assert batch.raw == block
    names, datas = split_block(block)
    assert [v.type for v in batch.views] == [n.decode() for n in names if n is not None]
    assert batch.datas == datas


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_chunking_gives_the_same_events(path: Path, data: st.DataObject) -> None:
    body = path.read_bytes()
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(body) - 1), max_size=12))))
    decoder = SseDecoder()
    types: list[str] = []
    datas: list[bytes] = []
    for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True):
        block = decoder.feed_block(body[a:b])
        if block:
            batch = batch_of_block(block)
            types += [v.type for v in batch.views]
            datas += batch.datas
            if batch.raw is not None:
                assert batch.raw == block
    whole = batch_of_block(block_of(body))
    assert types == [v.type for v in whole.views]
    assert datas == whole.datas


def test_single_frame_fast_path() -> None:
    block = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0}\n\n'
    batch = batch_of_block(block)
    assert batch.raw == block and batch.views[0].index == 0


@pytest.mark.parametrize(
    "block",
    [
        b'event: ping\ndata: {"type":"message_stop"}\n\n',  # name and type disagree: re-framed by type
        b'event: message_stop\ndata: {"type":"message_stop"}\nid: 1\n\n',
        b': keep-alive\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n',
        b'data: {"type":"message_stop"}\n\n',
        b'event: message_stop\ndata:{"type":"message_stop"}\n\n',
        b'event: a\ndata: {"type":"a"}\n\nevent: message_stop\ndata: {"type":"message_stop"}\nid: 2\n\n',
    ],
)
def test_non_canonical_blocks_are_re_framed(block: bytes) -> None:
    batch = batch_of_block(block)
    assert batch.raw is None
    assert batch.views[-1].type == "message_stop"
    assert batch.datas[-1] == b'{"type":"message_stop"}'


def test_missing_type_takes_the_event_name() -> None:
    batch = batch_of_block(b"event: message_stop\ndata: {}\n\n")
    assert batch.views[0].type == "message_stop" and batch.raw is None


@pytest.mark.parametrize(
    "block",
    [b"event: ping\ndata: {oops\n\n", b'event: ping\ndata: {"type":"ping"}\n\nevent: x\ndata: [1,\n\n'],
)
def test_malformed_json_becomes_an_untyped_view(block: bytes) -> None:
    batch = batch_of_block(block)
    assert batch.views[-1] is MALFORMED and batch.views[-1].type == ""


@pytest.mark.parametrize("split", [split_canonical, split_canonical_py], ids=["in use", "python"])
def test_split_canonical(split: Any) -> None:
    block = b'event: a\ndata: {"type":"a"}\n\nevent: b\ndata: {"x":"data: y"}\n\n'
    assert split(block) == (b"event: a\nevent: b", b'[{"type":"a"},{"x":"data: y"}]', 2)
    named = split(block)
    assert (named.events, named.array, named.frame_count) == tuple(named)
    assert split(b"") == (b"", b"[]", 0)
    for other in (
        b"event: a\ndata: 1\nid: 3\n\n",  # a third line
        b"event: a\ndata: 1\n\nevent: b",  # something after the last blank line
        b"event: a\ndata: 1\n",  # no blank line
        b"data: 1\nevent: a\n\n",  # the other order
        b"event:a\ndata: 1\n\n",  # no space
        b"event: a\r\ndata: 1\r\n\r\n",  # CRLF
    ):
        assert split(other) is None, other


@pytest.mark.skipif(not COMPILED_VIEWS, reason="gateway.wire._views_c is not built: nothing to compare")
@settings(max_examples=400, deadline=None)
@given(
    frames=st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=12)), max_size=5),
    edits=byte_edits(b"\n\r :eventdaEVD[],{}x\x00\xff", reach=200),
)
def test_compiled_split_is_the_python_one(frames: list[tuple[bytes, bytes]], edits: list[tuple[int, str, int]]) -> None:
    """Canonical blocks of any names and data (newlines included), then random edits: the same answer."""
    block = b"".join(b"event: " + name + b"\ndata: " + data + b"\n\n" for name, data in frames)
    for candidate in (block, apply_edits(block, edits)):
        assert split_canonical(candidate) == split_canonical_py(candidate)


def test_the_compiled_split_is_in_use() -> None:
    assert (sse._split_sse is not None) == COMPILED_VIEWS
    if COMPILED_VIEWS:  # the same fields, in the same order, as the Python one's
        from gateway.wire import _views_c

        assert _views_c.SplitSse.__match_args__ == sse.SplitSse._fields


def test_first_large_block_is_cut_after_its_first_delta() -> None:
    from adapters.base import split_after_first_delta

    body = (FIXTURES[0].parent / "fake-citations.sse").read_bytes()
    block = block_of(body)
    head, rest = split_after_first_delta(block)
    assert head + rest == block
    assert head.endswith(b"\n\n") and head.count(b"event: content_block_delta\n") == 1
    assert head.rstrip(b"\n").rsplit(b"\n", 2)[-2].startswith(b"event: content_block_delta")
    assert batch_of_block(head).raw == head and batch_of_block(rest).raw == rest
    small = b'event: content_block_delta\ndata: {"type":"content_block_delta"}\n\n'
    assert split_after_first_delta(small) == (b"", small)
    assert split_after_first_delta(b"event: ping\ndata: {}\n\n" * 300)[0] == b""


def _one_frame_by_count(block: bytes) -> bytes | None:
    """The single-frame test the fast path replaced (a count of the whole block's newlines), the reference: the
    frame's data when it took the block (its name the data's type), else None."""
    if block.count(b"\n") != 3:
        return None
    head, sep, data = block[:-2].partition(b"\ndata: ")
    if not (sep and head.startswith(b"event: ") and b"\n" not in data):
        return None
    try:
        kind = decode_view(data).type
    except msgspec.DecodeError:
        kind = MALFORMED.type
    return data if kind.encode() == head[7:] else None


_PIECES = st.sampled_from(
    [b"event: ", b"data: ", b"\n", b"\n\n", b"message_stop", b'{"type":"message_stop"}', b"data:", b"x", b": k"]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_PIECES, max_size=10).map(b"".join))
def test_the_one_frame_fast_path_takes_what_the_newline_count_took(block: bytes) -> None:
    block = block if block.endswith(b"\n\n") else block + b"\n\n"  # feed_block's blocks end with a blank line
    batch = batch_of_block(block)
    fast = batch.raw is not None and batch._datas is not None  # only the one-frame path gives both
    data = _one_frame_by_count(block)
    assert fast == (data is not None)
    if fast:
        assert batch.raw == block and batch.datas == [data] and len(batch.views) == 1


def test_a_one_frame_block_is_found_without_counting_the_whole_block() -> None:
    data = b'{"type":"message_stop"}'
    block = b"event: message_stop\ndata: " + data + b"\n\n"
    batch = batch_of_block(block)
    assert batch.raw == block and batch.datas == [data]
    # valid JSON (trailing whitespace) in a data line cut at the wrong newline: never the fast path
    for odd in (block + b"\n\n", block[:-1] + b" \n\n\n", b"event: message_stop\ndata: " + data + b"\n\n\n"):
        assert _one_frame_by_count(odd) is None
        batch = batch_of_block(odd)
        assert batch._datas is None or batch.raw is None
        assert batch.datas == [data]
    two = block + block  # six newlines: the general path (the fast one stops at the first data line's end)
    batch = batch_of_block(two)
    assert batch.raw == two and [v.type for v in batch.views] == ["message_stop"] * 2

"""Server-sent events: a sans-IO decoder (bytes in, frames out) and the canonical encoder.

The decoder follows the SSE rules the Anthropic SDKs use: lines end at ``\\r\\n``, ``\\n`` or ``\\r``; a
blank line ends a frame; ``data:`` lines join with ``\\n``; one space after the colon is dropped;
comment lines and unknown fields are ignored. It works on bytes throughout, so a multi-byte UTF-8
character split across reads needs no special care.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.wire.events import KNOWN_EVENTS, EventView

if TYPE_CHECKING:
    from gateway.wire import _views_c

__all__ = [
    "MAX_EVENT_BYTES",
    "FrameTooLarge",
    "SplitSse",
    "SseDecoder",
    "SseFrame",
    "encode_frame",
    "encode_frames",
    "frame_header",
    "is_ascii",
    "names_match",
    "names_match_py",
    "split_block",
    "split_canonical",
    "split_canonical_py",
]


class SseFrame:
    """One SSE frame: its ``event`` name (``None`` when absent) and its joined ``data``."""

    __slots__ = ("data", "event")

    def __init__(self, event: bytes | None, data: bytes) -> None:
        self.event = event
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SseFrame) and (self.event, self.data) == (other.event, other.data)

    def __hash__(self) -> int:
        return hash((self.event, self.data))

    def __repr__(self) -> str:
        return f"SseFrame({self.event!r}, {self.data!r})"


MAX_EVENT_BYTES = 16 * 1024 * 1024
"""The largest SSE frame a provider may send (16 MiB, far above any real event: the largest are server-tool
results of a few hundred KiB). A frame still unfinished past it ends the stream with an ``error``."""


class FrameTooLarge(ValueError):
    """An SSE frame grew past ``MAX_EVENT_BYTES`` without ending (a broken or hostile upstream)."""


class SseDecoder:
    """Incremental SSE parser. ``feed`` returns the frames completed by a chunk.

    An unfinished frame is kept in a ``bytearray`` (appends are amortised) and only the bytes that arrived since
    are searched for its end, so a frame that arrives in many small reads costs linear time, and one that never
    ends is refused once it passes ``max_frame`` bytes."""

    __slots__ = ("_buf", "_cr_pending", "max_frame")

    def __init__(self, max_frame: int = MAX_EVENT_BYTES) -> None:
        self._buf = bytearray()
        self._cr_pending = False  # the previous chunk ended in "\r": a leading "\n" now belongs to it
        self.max_frame = max_frame

    def feed(self, chunk: bytes) -> list[SseFrame]:
        block = self.feed_block(chunk)
        return _parse_frames(block) if block else []

    def feed_block(self, chunk: bytes) -> bytes:
        """The complete frames a chunk finishes, as one block of bytes (line endings made ``\\n``) that
        ends in a blank line; ``b""`` when the chunk completed none. Parse it with ``split_block``.
        ``FrameTooLarge`` when the unfinished frame passes ``max_frame``."""
        if self._cr_pending and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._cr_pending = False
        if b"\r" in chunk:
            self._cr_pending = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        pending = self._buf
        if pending:  # a frame is unfinished: append, and look for its end among the new bytes only
            start = len(pending) - 1  # ("\n" + "\n" may straddle the two)
            pending += chunk
            end = pending.rfind(b"\n\n", start)
            if end < 0:
                self._check(pending)
                return b""
            buf = bytes(pending[: end + 2])
            del pending[: end + 2]
            self._check(pending)
        else:  # the usual case: nothing pending, the chunk holds whole frames
            end = chunk.rfind(b"\n\n")
            if end < 0:
                pending += chunk
                self._check(pending)
                return b""
            if end + 2 < len(chunk):
                pending += chunk[end + 2 :]
                self._check(pending)
            buf = chunk[: end + 2] if end + 2 < len(chunk) else chunk
            end = len(buf) - 2
        if buf[:1] == b"\n":  # blank lines between frames are no frames
            buf = buf.lstrip(b"\n")
            end = buf.rfind(b"\n\n")
            if end < 0:
                return b""
        return buf[: end + 2]

    def _check(self, pending: bytearray) -> None:
        if len(pending) > self.max_frame:
            size = len(pending)
            pending.clear()
            raise FrameTooLarge(f"an event of over {self.max_frame} bytes (at least {size}) that does not end")

    def close(self) -> list[SseFrame]:
        """End of input. A frame that was never terminated by a blank line is dropped (as the SDK does);
        callers detect a truncated stream by its missing terminal event, not here."""
        self._buf.clear()
        return []

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished frame are buffered."""
        return bool(self._buf.strip(b"\n"))


class SplitSse(NamedTuple):
    """A block of canonical frames split (``split_canonical_py``; the compiled one's ``_views_c.SplitSse`` has
    the same fields, in the same order)."""

    events: bytes  # the event lines, joined by "\n"
    array: bytes  # the data of every frame, as one JSON array
    frame_count: int  # the number of frames


def names_match_py(events: bytes, views: list[Any]) -> bool:
    """Whether ``events`` (a block's event lines joined by ``\\n``, as ``split_canonical`` gives them) names each
    view's type in order, nothing else: the reference of the compiled ``names_match``, which compares each type in
    place (no list, no join, no copy: ~4 % of a 200-event stream's instructions went here)."""
    return events == b"event: " + "\nevent: ".join([v.type for v in views]).encode()


_split_sse: Callable[[bytes], _views_c.SplitSse | None] | None
names_match: Callable[[bytes, list[Any]], bool]
"""Whether a block's event lines (``SplitSse.events``) name, in order, exactly the types of its views
(``names_match_py``; compiled when built)."""
is_ascii: Callable[[bytes], bool]
"""``bytes.isascii`` (compiled when built: a vectorised loop, where CPython's goes a word at a time)."""
try:  # gateway/wire/_views_c.c: split_canonical without an object per line, names_match without the join
    from gateway.wire._views_c import is_ascii, names_match
    from gateway.wire._views_c import split_sse as _split_sse
except ImportError:  # pragma: no cover - no compiler where it was installed
    _split_sse = None
    names_match = names_match_py
    is_ascii = bytes.isascii


def split_block(block: bytes) -> tuple[list[bytes | None], list[bytes]]:
    """Event names and data of every frame in a block from ``feed_block``."""
    frames = _parse_frames(block)
    return [f.event for f in frames], [f.data for f in frames]


def split_canonical(block: bytes) -> SplitSse | _views_c.SplitSse | None:
    """For a block in the shape every Claude provider sends — each frame exactly ``event: <name>``,
    ``data: <json>``, blank line, nothing after the last — its event lines joined by ``\\n``, its data as one
    JSON array, and the frame count; ``None`` for any other shape. In C when gateway.wire._views_c is built."""
    if _split_sse is not None:
        return _split_sse(block)
    return split_canonical_py(block)


def split_canonical_py(block: bytes) -> SplitSse | None:
    """``split_canonical`` by whole-line bytes operations (in C, but an object per line): the fallback, and
    the reference the compiled one is tested against."""
    lines = block.split(b"\n")
    n = len(lines) // 3
    if len(lines) != 3 * n + 1 or any(lines[2::3]) or lines[-1]:
        return None
    events = b"\n".join(lines[0:-1:3])
    datas = b"\n".join(lines[1::3])
    # No line holds a "\n", so "\nevent: " / "\ndata: " can only occur at the start of a line.
    if (b"\n" + events).count(b"\nevent: ") != n or (b"\n" + datas).count(b"\ndata: ") != n:
        return None
    return SplitSse(events, b"[" + datas[6:].replace(b"\ndata: ", b",") + b"]", n)


def _parse_frames(block: bytes) -> list[SseFrame]:
    frames: list[SseFrame] = []
    for part in block.split(b"\n\n"):
        frame = _parse_block(part)
        if frame is not None:
            frames.append(frame)
    return frames


def _parse_block(block: bytes) -> SseFrame | None:
    if block.startswith(b"event: ") and block.count(b"\n") == 1:
        # The shape every Claude provider sends: one event line, one data line.
        name, _, data_line = block.partition(b"\n")
        if data_line.startswith(b"data: "):
            return SseFrame(name[7:], data_line[6:])
    event: bytes | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if not line or line[:1] == b":":
            continue
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            event = value
    if event is None and not data:
        return None
    return SseFrame(event, b"\n".join(data))


def frame_header(event_type: str) -> bytes:
    """``event: <type>\\ndata: `` — the bytes before an event's JSON."""
    return _HEADERS.get(event_type) or b"event: " + event_type.encode() + b"\ndata: "


_HEADERS = {name: b"event: " + name.encode() + b"\ndata: " for name in KNOWN_EVENTS}


def encode_frame(event_type: str, data: bytes) -> bytes:
    """One canonical frame: ``event: <type>`` then a single ``data:`` line, then a blank line."""
    return frame_header(event_type) + data + b"\n\n"


def encode_frames(views: Sequence[EventView], datas: Sequence[bytes]) -> bytes:
    """The canonical frames of many events at once (each ``data`` single-line JSON): one join, not one
    concatenation per event."""
    if not datas:
        return b""
    headers = _HEADERS
    try:
        return b"\n\n".join([headers[view.type] + data for view, data in zip(views, datas, strict=True)]) + b"\n\n"
    except KeyError:  # an event type this gateway does not know
        return b"\n\n".join([frame_header(view.type) + data for view, data in zip(views, datas, strict=True)]) + b"\n\n"

"""Server-sent events: a sans-IO decoder (bytes in, frames out) and the canonical encoder.

The decoder follows the SSE rules the Anthropic SDKs use: lines end at ``\\r\\n``, ``\\n`` or ``\\r``; a
blank line ends a frame; ``data:`` lines join with ``\\n``; one space after the colon is dropped;
comment lines and unknown fields are ignored. It works on bytes throughout, so a multi-byte UTF-8
character split across reads needs no special care.
"""

from __future__ import annotations

__all__ = ["SseDecoder", "SseFrame", "encode_frame", "frame_header"]


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


class SseDecoder:
    """Incremental SSE parser. ``feed`` returns the frames completed by a chunk."""

    __slots__ = ("_buf", "_cr_pending")

    def __init__(self) -> None:
        self._buf = b""
        self._cr_pending = False  # the previous chunk ended in "\r": a leading "\n" now belongs to it

    def feed(self, chunk: bytes) -> list[SseFrame]:
        if self._cr_pending and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._cr_pending = False
        if b"\r" in chunk:
            self._cr_pending = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return []
        self._buf = buf[end + 2 :]
        frames: list[SseFrame] = []
        for block in buf[:end].split(b"\n\n"):
            frame = _parse_block(block)
            if frame is not None:
                frames.append(frame)
        return frames

    def close(self) -> list[SseFrame]:
        """End of input. A frame that was never terminated by a blank line is dropped (as the SDK does);
        callers detect a truncated stream by its missing terminal event, not here."""
        self._buf = b""
        return []

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished frame are buffered."""
        return bool(self._buf.strip(b"\n"))


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


_HEADERS = {
    name: b"event: " + name.encode() + b"\ndata: "
    for name in (
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    )
}


def encode_frame(event_type: str, data: bytes) -> bytes:
    """One canonical frame: ``event: <type>`` then a single ``data:`` line, then a blank line."""
    return frame_header(event_type) + data + b"\n\n"

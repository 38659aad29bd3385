"""The Bedrock event-stream → canonical batches transcoder, fed from an in-memory response."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters._bedrock_stream import BedrockEventStream
from adapters._eventstream import encode_message
from gateway.validate import StreamValidator
from tests.fakes.claude_api import get_scenario

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

    async def read(self) -> bytes:
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

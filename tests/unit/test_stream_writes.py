"""How a stream's body goes to the server: one ASGI message per upstream read, and the last read's message
ends the body (``more_body: False``) instead of an empty message after it (one write less per stream)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.http.messages import _stream
from gateway.observability.metrics import Metrics
from gateway.observability.usage import UsageTally
from gateway.routing.pipeline import _DRAINS, OpenStream, stream_body
from tests.unit.test_pipeline import GOOD, FakeStream, _Target, client_events, ev


def serve(batches: list[list[Any]], **kwargs: Any) -> tuple[list[dict[str, Any]], UsageTally, FakeStream]:
    metrics = Metrics()
    tally = UsageTally(metrics, alias="a", provider="p", model="m")
    stream = FakeStream(batches, **kwargs)

    async def go() -> list[dict[str, Any]]:
        gen = stream.batches()
        opened = OpenStream(_Target(), stream, gen, await anext(gen))  # type: ignore[arg-type]
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            if message.get("more_body") is False:  # the client sees the end: the usage is already recorded
                assert tally.recorded is not None and stream.closed
            sent.append(message)

        body = stream_body(opened, metrics, tally)
        await _stream(send, body, [], tally, ping_s=30.0, deadline=time.monotonic() + 60)
        await asyncio.gather(*_DRAINS)
        return sent

    return asyncio.run(go()), tally, stream


def bodies(sent: list[dict[str, Any]]) -> list[tuple[bytes, bool]]:
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert all(m["type"] == "http.response.body" for m in sent[1:])
    assert [m["more_body"] for m in sent[1:]][-1] is False
    return [(m["body"], m["more_body"]) for m in sent[1:]]


def test_a_stream_in_one_read_is_one_body_message() -> None:
    sent, tally, stream = serve([GOOD])
    ((body, more),) = bodies(sent)
    assert more is False
    assert [e["type"] for e in client_events([body])] == [e.type for e in GOOD]
    assert tally.recorded == "completed" and stream.closed


def test_the_last_read_ends_the_body() -> None:
    sent, tally, _ = serve([GOOD[:2], GOOD[2:4], GOOD[4:]])
    got = bodies(sent)
    assert [more for _, more in got] == [True, True, False]
    assert [e["type"] for e in client_events([b for b, _ in got])] == [e.type for e in GOOD]
    assert tally.recorded == "completed"


def test_an_error_event_ends_the_body_too() -> None:
    bad = [*GOOD[:2], ev("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": ""})]
    sent, tally, _ = serve([GOOD[:1], bad[1:], GOOD[3:]])
    got = bodies(sent)
    assert [more for _, more in got] == [True, False]
    assert [e["type"] for e in client_events([b for b, _ in got])] == ["message_start", "content_block_start", "error"]
    assert tally.recorded == "invalid_stream"


def test_a_stream_that_just_stops_gets_its_error_then_the_end() -> None:
    sent, tally, _ = serve([GOOD[:2], GOOD[2:4]])
    got = bodies(sent)
    events = client_events([b for b, _ in got])
    assert events[-1]["type"] == "error" and "without message_stop" in events[-1]["error"]["message"]
    assert got[-1] == (b"", False)
    assert tally.recorded == "upstream_error"


def test_a_drain_cancel_during_the_last_write_never_sends_a_second_head() -> None:
    """Reproduced before: a stream whose whole answer arrived in one read, a slow ``send`` and the drain's
    cancel gave ``start, body, start, body``, because "the head was sent" was inferred from the keep-alive
    timer (none yet for a stream in one read). It is tracked now."""
    from gateway.http.messages import DRAIN_CANCEL

    metrics = Metrics()
    tally = UsageTally(metrics, alias="a", provider="p", model="m")
    stream = FakeStream([GOOD])

    async def go() -> list[dict[str, Any]]:
        gen = stream.batches()
        opened = OpenStream(_Target(), stream, gen, await anext(gen))  # type: ignore[arg-type]
        sent: list[dict[str, Any]] = []
        release, waiting = asyncio.Event(), asyncio.Event()

        async def slow_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                waiting.set()
                await release.wait()  # the socket is full: the write waits (and, cancelled, writes nothing)
            sent.append(message)

        task = asyncio.ensure_future(
            _stream(
                slow_send, stream_body(opened, metrics, tally), [], tally, ping_s=30.0, deadline=time.monotonic() + 60
            )
        )
        await waiting.wait()
        task.cancel(DRAIN_CANCEL)  # the drain timeout ran out while the last write waited
        release.set()
        await task
        return sent

    sent = asyncio.run(go())
    kinds = [m["type"] for m in sent]
    assert kinds.count("http.response.start") == 1
    assert kinds == ["http.response.start", "http.response.body"] and sent[-1]["more_body"] is False
    assert b'"type":"error"' in sent[-1]["body"]  # the body never went out: the stream ends in `error`

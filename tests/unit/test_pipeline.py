"""The pipeline never emits an invalid stream: whatever the provider sends, the client's stream is a
valid prefix ending in message_stop, or ends with exactly one error event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.observability.metrics import Metrics
from gateway.observability.usage import UsageTally
from gateway.routing.balance import TargetHealth
from gateway.routing.pipeline import _DRAINS, OpenStream, stream_body
from gateway.wire.events import MALFORMED, Batch, decode_view
from gateway.wire.sse import SseDecoder
from gateway.wire.upstream import StreamInterrupted
from gateway.wire.validate import State, StreamValidator


class _Named:
    name = "p"


class _Target:
    adapter = _Named()
    provider = "p"

    def __init__(self) -> None:
        self.health = TargetHealth()


class Ev:
    def __init__(self, type: str, data: bytes) -> None:
        self.type = type
        self.data = data


def to_batch(events: list[Ev], *, raw: bool) -> Batch:
    views = [MALFORMED if e.data == b"{not json" else decode_view(e.data) for e in events]
    canonical = b"".join(b"event: %s\ndata: %s\n\n" % (e.type.encode(), e.data) for e in events)
    return Batch(views, [e.data for e in events], canonical if raw else None)


class FakeStream:
    def __init__(self, batches: list[list[Ev]], *, interrupt: bool = False, raw: bool = True, eof: bool = True) -> None:
        self._batches = [to_batch(b, raw=raw) for b in batches]
        self._interrupt = interrupt
        self._eof = eof
        self.headers: dict[str, str] = {}
        self.request_id = ""
        self.closed = False
        self.consumed = False

    async def batches(self) -> AsyncGenerator[Batch]:
        for batch in self._batches:
            yield batch
        self.consumed = True
        if self._interrupt:
            raise StreamInterrupted("connection reset")

    def at_eof(self) -> bool:
        return self._eof

    async def aclose(self) -> None:
        self.closed = True


def ev(etype: str, **fields: Any) -> Ev:
    return Ev(etype, msgspec.json.encode({"type": etype, **fields}))


def run(
    batches: list[list[Ev]],
    *,
    interrupt: bool = False,
    raw: bool = True,
    eof: bool = True,
    drains: list[int] | None = None,
) -> tuple[list[bytes], Metrics, UsageTally, FakeStream]:
    """``drains``: gets the number of background drains the stream left behind."""
    metrics = Metrics()
    tally = UsageTally(metrics, alias="a", provider="p", model="m")
    stream = FakeStream(batches, interrupt=interrupt, raw=raw, eof=eof)

    async def go() -> list[bytes]:
        gen = stream.batches()
        first = await anext(gen)
        opened = OpenStream(_Target(), stream, gen, first)  # type: ignore[arg-type]
        chunks = [chunk async for chunk in stream_body(opened, metrics, tally)]
        if drains is not None:
            drains.append(len(_DRAINS))
        await asyncio.gather(*_DRAINS)
        return chunks

    return asyncio.run(go()), metrics, tally, stream


def client_events(chunks: list[bytes]) -> list[Any]:
    decoder = SseDecoder()
    frames = decoder.feed(b"".join(chunks))
    assert not decoder.pending, "the body ends on a frame boundary"
    out = []
    for frame in frames:
        assert frame.event is not None
        data = msgspec.json.decode(frame.data)
        assert data["type"] == frame.event.decode()
        out.append(data)
    return out


GOOD = [
    ev("message_start", message={"id": "m", "usage": {"input_tokens": 10, "output_tokens": 1}}),
    ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
    ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"}),
    ev("content_block_stop", index=0),
    ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 5}),
    ev("message_stop"),
]


def test_one_write_per_upstream_batch_and_usage() -> None:
    chunks, _, tally, stream = run([GOOD[:3], GOOD[3:]])
    assert len(chunks) == 2
    assert chunks[0] == b"".join(b"event: %s\ndata: %s\n\n" % (e.type.encode(), e.data) for e in GOOD[:3])
    assert [e["type"] for e in client_events(chunks)] == [e.type for e in GOOD]
    assert tally.recorded == "completed"
    assert (tally.usage.input_tokens, tally.usage.output_tokens) == (10, 5)
    assert stream.closed


def test_violation_becomes_error_event_and_is_counted() -> None:
    bad = [*GOOD[:2], ev("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": ""})]
    body, metrics, tally, _ = run([bad, GOOD[3:]])
    events = client_events(body)
    assert [e["type"] for e in events] == ["message_start", "content_block_start", "error"]
    assert "input_json_delta on a text block" in events[-1]["error"]["message"]
    assert (
        metrics.registry.get_sample_value("gateway_stream_violations_total", {"provider": "p", "rule": "delta_kind"})
        == 1
    )
    assert tally.recorded == "invalid_stream"


def test_truncated_upstream_ends_with_error_not_message_stop() -> None:
    body, _, tally, _ = run([GOOD[:4]])
    events = client_events(body)
    assert events[-1]["type"] == "error" and "without message_stop" in events[-1]["error"]["message"]
    assert tally.recorded == "upstream_error"
    assert tally.usage.input_tokens == 10  # partial usage kept


def test_interrupted_upstream_ends_with_error() -> None:
    body, _, tally, _ = run([GOOD[:3]], interrupt=True)
    assert client_events(body)[-1]["type"] == "error"
    assert tally.recorded == "upstream_error"


def test_nothing_after_message_stop_is_forwarded_and_the_rest_is_drained() -> None:
    for eof, background in ((False, 1), (True, 0)):
        drains: list[int] = []
        body, _, _, stream = run([[*GOOD, ev("ping")], [ev("ping")]], eof=eof, drains=drains)
        assert client_events(body)[-1]["type"] == "message_stop"
        assert stream.consumed and stream.closed  # read to its end (connection reusable), then closed
        # a body that has all arrived is finished at once; one still arriving is drained in the background
        assert drains == [background]


RANDOM_EVENT = st.one_of(
    st.sampled_from(GOOD),
    st.builds(
        lambda t, i, k: ev(t, index=i, content_block={"type": k}, delta={"type": k + "_delta"}),
        st.sampled_from(["content_block_start", "content_block_delta", "content_block_stop", "future"]),
        st.integers(0, 2),
        st.sampled_from(["text", "thinking", "input_json", "tool_use"]),
    ),
    st.just(ev("ping")),
    st.just(ev("error", error={"type": "overloaded_error", "message": "x"})),
    st.just(Ev("", b"{not json")),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(RANDOM_EVENT, min_size=1, max_size=6), min_size=1, max_size=6), st.booleans(), st.booleans())
def test_client_stream_is_always_valid(batches: list[list[Ev]], interrupt: bool, raw: bool) -> None:
    body, _, tally, stream = run(batches, interrupt=interrupt, raw=raw)
    events = client_events(body)
    checker = StreamValidator()
    for event in events:
        checker.check(decode_view(msgspec.json.encode(event)))  # never raises
    assert checker.state in (State.DONE, State.FAILED), "every stream ends in message_stop or error"
    assert sum(e["type"] in ("message_stop", "error") for e in events) == 1
    assert tally.recorded is not None and stream.closed


class _Adapter:
    """An adapter whose stream starts with the given batches."""

    kind = "test"

    def __init__(self, name: str, batches: list[list[Ev]]) -> None:
        self.name = name
        self._batches = batches
        self.opened = 0

    async def open_stream(self, request: object, model: str) -> FakeStream:
        self.opened += 1
        return FakeStream(self._batches)


def test_an_error_before_the_first_real_event_gets_an_http_status_and_falls_over() -> None:
    from gateway.routing.pipeline import open_stream
    from gateway.routing.table import Route, Target
    from gateway.wire.errors import UpstreamStatusError
    from gateway.wire.request import ProxyRequest

    overloaded = _Adapter("a", [[ev("error", error={"type": "overloaded_error", "message": "Overloaded"})]])
    healthy = _Adapter("b", [GOOD])
    request = ProxyRequest(body=b"{}", model="m", stream=True, request_id="req_1")
    metrics = Metrics()

    async def first_target_only() -> None:
        from gateway.routing.pipeline import Resilience
        from gateway.settings import ResilienceSettings, RetrySettings

        route = Route("m", (Target(overloaded, None),))  # type: ignore[arg-type]
        tally = UsageTally(metrics, alias="m")
        once = Resilience(ResilienceSettings(retry=RetrySettings(max_attempts=1)))
        try:
            await open_stream(route, request, metrics, tally, once)
        except UpstreamStatusError as exc:
            assert (exc.status_code, exc.error_type) == (529, "overloaded_error")
            assert exc.body == b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
        else:
            raise AssertionError("expected an UpstreamStatusError")

    async def with_fallback() -> str:
        route = Route("m", (Target(overloaded, None), Target(healthy, None)))  # type: ignore[arg-type]
        opened = await open_stream(route, request, metrics, UsageTally(metrics, alias="m"))
        await opened.stream.aclose()
        return opened.target.provider

    asyncio.run(first_target_only())
    assert asyncio.run(with_fallback()) == "b"
    assert (overloaded.opened, healthy.opened) == (2, 1)
    assert (
        metrics.registry.get_sample_value(
            "gateway_upstream_errors_total", {"provider": "a", "error_type": "overloaded_error"}
        )
        == 2
    )


def test_the_context_carries_the_deadline_and_counts_the_attempts() -> None:
    """The request's deadline is set by its first attempt on the pipeline's clock and every attempt is counted
    on its context (the access line and the span read them there)."""
    from gateway.routing.pipeline import Resilience, open_stream
    from gateway.routing.table import Route, Target
    from gateway.settings import ResilienceSettings, TimeoutSettings
    from gateway.wire.request import ProxyRequest

    overloaded = _Adapter("a", [[ev("error", error={"type": "overloaded_error", "message": "Overloaded"})]])
    healthy = _Adapter("b", [GOOD])
    request = ProxyRequest(body=b"{}", model="m", stream=True, request_id="req_1")
    metrics = Metrics()
    res = Resilience(ResilienceSettings(timeouts=TimeoutSettings(total_s=42)), clock=lambda: 1000.0)
    tally = UsageTally(metrics, alias="m")
    assert (tally.context.deadline, tally.context.attempts) == (None, 0)

    async def go() -> None:
        route = Route("m", (Target(overloaded, None), Target(healthy, None)))  # type: ignore[arg-type]
        opened = await open_stream(route, request, metrics, tally, res)
        await opened.stream.aclose()

    asyncio.run(go())
    assert (tally.context.deadline, tally.context.attempts) == (1042.0, 2)

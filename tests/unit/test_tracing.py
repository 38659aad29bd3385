"""The tracer's own decisions, over the exporter's in-memory transport: which ``traceparent`` it continues, which
traces it samples (``sample_ratio``; a caller's flag decides for its own), that an unsampled request still counts
in the GenAI metrics, that the histograms stop taking new series past their bound, and that finished requests
are built in batches, none lost."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client import CollectorRegistry

from gateway.observability.genai_metrics import SERVER_DURATION, GenAiMetrics
from gateway.observability.otlp_export import ExportCounters, MemoryTransport, OtlpExporter, export_config
from gateway.observability.recording import Finished
from gateway.observability.tracing import FLUSH_AT, RequestTrace, Tracer, parse_traceparent
from gateway.settings import parse_settings
from gateway.wire.events import Usage

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (f"00-{TRACE}-{SPAN}-01", (bytes.fromhex(TRACE), bytes.fromhex(SPAN), 1)),
        (f"00-{TRACE.upper()}-{SPAN}-00", (bytes.fromhex(TRACE), bytes.fromhex(SPAN), 0)),
        (f"01-{TRACE}-{SPAN}-01-future", (bytes.fromhex(TRACE), bytes.fromhex(SPAN), 1)),  # a later version: as 00
        (f"00-{TRACE}-{SPAN}-01-extra", None),  # version 00 has exactly four fields
        (f"ff-{TRACE}-{SPAN}-01", None),  # the invalid version
        (f"00-{'0' * 32}-{SPAN}-01", None),  # an all-zero trace id
        (f"00-{TRACE}-{'0' * 16}-01", None),  # an all-zero span id
        (f"00-{TRACE[:-1]}g-{SPAN}-01", None),  # not hex
        (f"00_{TRACE}_{SPAN}_01", None),
        ("", None),
        (None, None),
    ],
)
def test_traceparent(value: str | None, parsed: tuple[bytes, bytes, int] | None) -> None:
    assert parse_traceparent(value) == parsed


def tracer(**kwargs: object) -> tuple[Tracer, MemoryTransport]:
    config = export_config(
        parse_settings("auth: {open: true}\ntelemetry: {otlp: {endpoint: 'http://127.0.0.1:1'}}", environ={}),
        environ={},
    )
    assert config is not None
    transport = MemoryTransport()
    exporter = OtlpExporter(config, ExportCounters(CollectorRegistry()), transport)
    return Tracer(exporter, **kwargs), transport  # type: ignore[arg-type]


def finished(trace: RequestTrace) -> Finished:
    return Finished(
        started_at=0.0,
        request_id="req_1",
        upstream_request_id="",
        method="POST",
        path="/v1/messages",
        key_name="",
        team="",
        user="",
        session_id="",
        agent_id="",
        alias="*",
        provider="c1",
        model="m",
        model_label="",
        stream=False,
        routed=True,
        outcome="completed",
        status=200,
        usage=Usage(input_tokens=3, output_tokens=5),
        cost_usd=None,
        ttft=None,
        duration=0.01,
        attempts=1,
        timed=True,
        trace=trace,
    )


def spans_of(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    return [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]


def serve(t: Tracer, headers: dict[str, str]) -> RequestTrace:
    trace = t.start(headers)
    trace.attempt("c1", "anthropic", "m")
    t.record(finished(trace))
    t.flush()
    return trace


def test_records_are_built_in_batches_after_the_request_or_before_an_export() -> None:
    """A finished request is set aside; its spans and metrics are built with the others' once FLUSH_AT are waiting
    (in a callback of their own, after the request that completed the batch), or when the exporter is about to
    send (its schedule, its shutdown): never lost, never late beyond an export."""

    async def main() -> None:
        t, transport = tracer()
        queue = t.exporter._queue

        def one() -> None:
            trace = t.start({})
            trace.attempt("c1", "anthropic", "m")
            t.record(finished(trace))

        for _ in range(FLUSH_AT - 1):
            one()
        assert len(queue) == 0 and t.genai is not None and not t.genai.collect()  # set aside, nothing built yet
        one()  # the batch is full: built right after this callback
        assert len(queue) == 0
        await asyncio.sleep(0)
        assert len(queue) == 2 * FLUSH_AT and t.genai.collect()
        one()  # a request alone: its spans go with the next export (here: the shutdown's)
        t.exporter.start()
        await t.exporter.aclose()
        bodies = [body for signal, body in transport.sent if signal == "traces"]
        spans = [span for body in bodies for span in spans_of(body)]
        assert len(spans) == 2 * (FLUSH_AT + 1) and len({span.trace_id for span in spans}) == FLUSH_AT + 1

    asyncio.run(main())


def test_sample_ratio_and_the_callers_flag() -> None:
    never, _ = tracer(sample_ratio=0.0)
    queued = never.exporter._queue
    assert not serve(never, {}).sampled and len(queued) == 0  # not sampled: no spans…
    assert never.genai is not None and never.genai.collect()  # …but counted in the GenAI metrics
    trace = serve(never, {"traceparent": f"00-{TRACE}-{SPAN}-01"})  # the caller's flag decides for its trace
    assert trace.sampled and trace.trace_id.hex() == TRACE and trace.parent_id.hex() == SPAN and len(queued) == 2
    always, _ = tracer(sample_ratio=1.0)
    assert not serve(always, {"traceparent": f"00-{TRACE}-{SPAN}-00"}).sampled and len(always.exporter._queue) == 0
    half, _ = tracer(sample_ratio=0.5)
    sampled = sum(serve(half, {}).sampled for _ in range(2000))
    assert 850 < sampled < 1150  # the trace id's low 64 bits against the ratio (TraceIdRatioBased)
    quarter, _ = tracer(sample_ratio=0.25)
    for _ in range(500):  # exactly those bits decide, the SERVER span's id drawn with them never does
        trace = quarter.start({})
        assert trace.sampled == (int.from_bytes(trace.trace_id[8:], "big") < round(0.25 * 2**64))
        assert trace.span_id != bytes(8) and len(trace.trace_id) == 16 and len(trace.span_id) == 8


def test_the_upstream_traceparent_is_the_attempts_span() -> None:
    t, _ = tracer()
    trace = t.start({"traceparent": f"00-{TRACE}-{SPAN}-01"})
    attempt = trace.attempt("c1", "anthropic", "m")
    assert trace.traceparent(attempt) == f"00-{TRACE}-{attempt.span_id.hex()}-01" == attempt.traceparent
    assert attempt.span_id != trace.span_id and attempt.span_id.hex() != SPAN
    unsampled, _ = tracer(sample_ratio=0.0)
    own = unsampled.start({})
    second = own.attempt("c1", "anthropic", "m")
    assert second.traceparent == f"00-{own.trace_id.hex()}-{second.span_id.hex()}-00"
    assert parse_traceparent(second.traceparent) == (own.trace_id, second.span_id, 0)


def test_a_trace_and_its_attempts_are_not_tracked_by_the_cyclic_collector() -> None:
    """Made in C (msgspec Structs, gc=False: nothing they hold refers back to them); their containers are."""
    t, _ = tracer()
    trace = t.start({})
    attempt = trace.attempt("c1", "anthropic", "m")
    assert not gc.is_tracked(trace) and not gc.is_tracked(attempt) and gc.is_tracked(trace.attempts)
    assert 0 < trace.start_ns <= attempt.start_ns <= time.time_ns()


def test_the_histograms_stop_taking_new_series_at_their_bound() -> None:
    metrics = GenAiMetrics(max_series=2)
    for n in range(4):
        metrics.series(SERVER_DURATION, (("gen_ai.request.model", f"m{n}"),)).add(0.5)
    assert metrics.overflow == 2
    (histogram,) = metrics.collect()
    assert [p.attributes["gen_ai.request.model"] for p in histogram.points] == ["m0", "m1"]

"""The tracer alone, in a loop: ``python -m bench.tracer_loop`` — CPU per request of what tracing adds to a
request (issue 35, item 6), in its two halves: the request's side (the trace started from its headers, the
request's parameters, an attempt's CLIENT span and the ``traceparent`` sent upstream) and the record's (the
finished request set aside, then its SERVER and CLIENT spans encoded and its GenAI metrics added in the batch of
``FLUSH_AT``, the spans handed to the exporter's queue). A streamed request as the bench's burst makes it: a
session id, a key, a team, usage with cache reads, a time to first token. This process pinned to core 0; five
repeats of 20,000 requests each after a warm-up, the minimum reported (the host's noise only ever adds)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from gateway.observability.otlp_export import ExportCounters, MemoryTransport, OtlpExporter, export_config
from gateway.observability.recording import Finished
from gateway.observability.tracing import RequestTrace, SpanSink, Tracer, new_attempt, note_request
from gateway.settings import parse_settings
from gateway.wire.events import Usage
from gateway.wire.request import MessagesHead, parse_messages

BODY = b'{"model":"claude-sonnet-4-6","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
HEADERS = {"content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"}
N = 20_000


def make_tracer() -> Tracer:
    settings = parse_settings("auth: {open: true}\ntelemetry: {otlp: {endpoint: 'http://127.0.0.1:1'}}", environ={})
    config = export_config(settings, environ={})
    assert config is not None
    exporter = OtlpExporter(config, ExportCounters(CollectorRegistry()), MemoryTransport())
    return Tracer(exporter)


def finished(trace: RequestTrace) -> Finished:
    return Finished(
        started_at=0.0,
        request_id="req_011CUgbhbLXqzWbJ3mYbM6Ud",
        upstream_request_id="req_up_1",
        method="POST",
        path="/v1/messages",
        key_name="bench",
        team="platform",
        user="",
        session_id="2b5c3f5e-6f1e-4a39-9d6a-0d8b1f4c2e77",
        agent_id="",
        alias="*",
        provider="up",
        model="claude-sonnet-4-6",
        model_label="",
        stream=True,
        routed=True,
        outcome="completed",
        status=200,
        usage=Usage(input_tokens=12, output_tokens=210, cache_read_input_tokens=1000, cache_creation_input_tokens=0),
        cost_usd=0.0034,
        ttft=0.0009,
        duration=0.0021,
        attempts=1,
        timed=True,
        response_id="msg_01XFDUDYJgAACzvnptvVoYEL",
        response_model="claude-sonnet-4-6",
        finish_reason="end_turn",
        upstream_wait=0.0007,
        trace=trace,
    )


def request_side(tracer: Tracer, head: MessagesHead) -> RequestTrace:
    trace = tracer.start(HEADERS)
    trace.route = "/v1/messages"
    note_request(trace, "claude-sonnet-4-6", head)  # as RequestContext.traced does
    span = new_attempt(trace, "up", "anthropic", "claude-sonnet-4-6")  # with its traceparent, as the pipeline's
    span.url = "http://127.0.0.1:9000/v1/messages"
    return trace


def measure(name: str, run: Callable[[int], None]) -> None:
    run(2_000)
    figures = []
    for _ in range(5):
        started = time.process_time()
        run(N)
        figures.append((time.process_time() - started) / N * 1e6)
    print(f"{name:<14} min {min(figures):5.2f}  ({' '.join(f'{f:.2f}' for f in figures)}) µs CPU per request")


def main() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    head = parse_messages(BODY)
    tracer = make_tracer()
    queue = tracer.exporter._queue
    sink = SpanSink(tracer)  # the recording seam's, as served
    traces = [request_side(tracer, head) for _ in range(64)]
    records = [(finished(t), t) for t in traces]

    def requests(n: int) -> None:
        for _ in range(n):
            request_side(tracer, head)

    def records_only(n: int) -> None:
        for i in range(n):
            f, _ = records[i & 63]
            sink.record(f)
        tracer.flush()
        queue.clear()

    def whole(n: int) -> None:
        for _ in range(n):
            t = request_side(tracer, head)
            sink.record(finished(t))
        tracer.flush()
        queue.clear()

    def baseline(n: int) -> None:  # the Finished alone, made as the untraced request makes it
        for _ in range(n):
            finished(None)  # type: ignore[arg-type]

    measure("request side", requests)
    measure("record side", records_only)
    measure("whole", whole)
    measure("(Finished)", baseline)


if __name__ == "__main__":
    main()

"""The test OTLP receiver (``tests.fakes.otlp_collector``) against the OpenTelemetry SDK's own exporters, OTLP/gRPC
and OTLP/HTTP (plain and gzip): so the fake the end-to-end tests read the gateway's telemetry with is known to speak
the wire format. Spans (names, kinds, parent links, attributes, events, status, resource, scope, headers), metrics
(an explicit-bucket histogram, a delta counter, a gauge), the failure switch against the exporters' retries, the
HTTP side's refusals, the waits, and a clean shutdown."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.metrics import Counter, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from tests.fakes.otlp_collector import PROTOBUF, OtlpCollector, Span

KEY = "k-0123456789"
TRANSPORTS = ["grpc", "grpc-gzip", "http", "http-gzip"]
RESOURCE = {"service.name": "messages-gateway", "service.version": "9.9.9", "deployment.environment": "test"}


@pytest.fixture
def collector() -> Iterator[OtlpCollector]:
    with OtlpCollector() as collector:
        yield collector


def span_exporter(collector: OtlpCollector, transport: str, *, timeout: float = 5.0) -> SpanExporter:
    headers = {"x-collector-key": KEY}
    gzipped = transport.endswith("-gzip")
    if transport.startswith("grpc"):
        return GrpcSpanExporter(
            endpoint=collector.grpc_endpoint,
            insecure=True,
            headers=headers,
            timeout=timeout,
            compression=grpc.Compression.Gzip if gzipped else grpc.Compression.NoCompression,
        )
    return HttpSpanExporter(
        endpoint=collector.http_endpoint + "/v1/traces",
        headers=headers,
        timeout=timeout,
        compression=HttpCompression.Gzip if gzipped else HttpCompression.NoCompression,
    )


def metric_exporter(collector: OtlpCollector, transport: str) -> MetricExporter:
    headers = {"x-collector-key": KEY}
    delta_counters = {Counter: AggregationTemporality.DELTA}
    gzipped = transport.endswith("-gzip")
    if transport.startswith("grpc"):
        return GrpcMetricExporter(
            endpoint=collector.grpc_endpoint,
            insecure=True,
            headers=headers,
            timeout=5,
            compression=grpc.Compression.Gzip if gzipped else grpc.Compression.NoCompression,
            preferred_temporality=delta_counters,
        )
    return HttpMetricExporter(
        endpoint=collector.http_endpoint + "/v1/metrics",
        headers=headers,
        timeout=5,
        compression=HttpCompression.Gzip if gzipped else HttpCompression.NoCompression,
        preferred_temporality=delta_counters,
    )


def finished_spans(names: Sequence[str] = ("one",)) -> tuple[ReadableSpan, ...]:
    """Spans ended by a local SDK provider, to hand to an exporter's ``export`` directly."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(RESOURCE))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.otlp_collector")
    for name in names:
        tracer.start_span(name).end()
    provider.shutdown()
    return memory.get_finished_spans()


def by_name(spans: Sequence[Span]) -> dict[str, Span]:
    return {span.name: span for span in spans}


def post(
    collector: OtlpCollector, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", collector.http_port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def trace_request(name: str = "raw") -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id = bytes(range(16))
    span.span_id = bytes(range(8))
    span.name = name
    span.kind = trace_pb2.Span.SPAN_KIND_INTERNAL
    span.attributes.append(KeyValue(key="blob", value=AnyValue(bytes_value=b"\x00\x01")))
    return request


# --- spans ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_spans_from_the_sdk_exporter(collector: OtlpCollector, transport: str) -> None:
    provider = TracerProvider(resource=Resource.create(RESOURCE))
    provider.add_span_processor(SimpleSpanProcessor(span_exporter(collector, transport)))
    try:
        tracer = provider.get_tracer("tests.otlp_collector", "1.2.3")
        parent_attributes: dict[str, Any] = {
            "http.request.method": "POST",
            "http.response.status_code": 200,
            "gateway.ratio": 0.25,
            "gateway.streamed": True,
            "gateway.models": ["claude-a", "claude-b"],
        }
        with tracer.start_as_current_span("POST /v1/messages", kind=SpanKind.SERVER, attributes=parent_attributes) as p:
            with tracer.start_as_current_span("upstream", kind=SpanKind.CLIENT) as child:
                child.set_attribute("server.address", "api.example")
                child.add_event("retry", {"attempt": 2})
                child.set_status(Status(StatusCode.ERROR, "overloaded"))
                child_context = child.get_span_context()
            with tracer.start_as_current_span("pick") as internal:
                internal.set_status(Status(StatusCode.OK))
    finally:
        provider.shutdown()

    spans = collector.wait_spans(lambda spans: len(spans) >= 3, timeout=5)
    assert len(spans) == 3
    assert [span.name for span in spans] == ["upstream", "pick", "POST /v1/messages"]  # ended in that order
    named = by_name(spans)
    parent, child, internal_span = named["POST /v1/messages"], named["upstream"], named["pick"]

    context = p.get_span_context()
    assert parent.trace_id == f"{context.trace_id:032x}"
    assert parent.span_id == f"{context.span_id:016x}"
    assert parent.parent_span_id == ""
    assert child.trace_id == internal_span.trace_id == parent.trace_id
    assert child.parent_span_id == internal_span.parent_span_id == parent.span_id
    assert child.span_id == f"{child_context.span_id:016x}"
    assert len({parent.span_id, child.span_id, internal_span.span_id}) == 3

    assert (parent.kind, child.kind, internal_span.kind) == ("SERVER", "CLIENT", "INTERNAL")
    assert parent.attributes == parent_attributes
    assert child.attributes == {"server.address": "api.example"}
    assert [(e.name, e.attributes) for e in child.events] == [("retry", {"attempt": 2})]
    assert (parent.status_code, parent.status_message) == ("UNSET", "")
    assert (child.status_code, child.status_message) == ("ERROR", "overloaded")
    assert internal_span.status_code == "OK"
    for span in spans:
        assert 0 < span.start_ns <= span.end_ns
        assert span.flags & 0x300 == 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE, not IS_REMOTE: a local parent
        assert span.trace_state == ""
        assert span.links == []
        assert span.resource["service.name"] == "messages-gateway"
        assert span.resource["deployment.environment"] == "test"
        assert span.resource["telemetry.sdk.language"] == "python"
        assert (span.scope, span.scope_version) == ("tests.otlp_collector", "1.2.3")
        assert span.protocol == transport.split("-")[0]
        assert span.headers["x-collector-key"] == KEY
        assert "OTel-OTLP-Exporter-Python" in span.headers["user-agent"]

    requests = collector.requests()
    assert [(r.protocol, r.signal) for r in requests] == [(transport.split("-")[0], "traces")] * 3
    if transport == "http-gzip":
        assert requests[0].headers["content-encoding"] == "gzip"
    if transport.startswith("http"):
        assert requests[0].headers["content-type"] == PROTOBUF
    assert collector.refused == 0
    assert collector.rejections() == []


# --- metrics --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["grpc", "http", "http-gzip"])
def test_metrics_from_the_sdk_exporter(collector: OtlpCollector, transport: str) -> None:
    reader = PeriodicExportingMetricReader(metric_exporter(collector, transport), export_interval_millis=3_600_000)
    view = View(
        instrument_name="gateway.request.duration",
        aggregation=ExplicitBucketHistogramAggregation(boundaries=(0.1, 0.5, 1.0)),
    )
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create(RESOURCE), views=[view])

    def inflight(options: CallbackOptions) -> list[Observation]:
        return [Observation(7.5, {"pool": "a"})]

    try:
        meter = provider.get_meter("tests.otlp_collector", "1.2.3")
        duration = meter.create_histogram("gateway.request.duration", unit="s", description="Time to answer")
        for value in (0.05, 0.3, 0.3, 2.0):
            duration.record(value, {"route": "/v1/messages"})
        duration.record(0.7, {"route": "/v1/models"})
        meter.create_counter("gateway.requests", unit="{request}").add(3, {"route": "/v1/messages"})
        meter.create_observable_gauge("gateway.inflight", callbacks=[inflight])
    finally:
        provider.shutdown()  # the reader's last collection is exported here

    names = {"gateway.request.duration", "gateway.requests", "gateway.inflight"}
    points = collector.wait_metrics(lambda points: names <= {p.name for p in points}, timeout=5)
    histograms = {p.attributes["route"]: p for p in points if p.name == "gateway.request.duration"}
    assert set(histograms) == {"/v1/messages", "/v1/models"}
    messages = histograms["/v1/messages"]
    assert (messages.kind, messages.unit, messages.description) == ("histogram", "s", "Time to answer")
    assert messages.bounds == [0.1, 0.5, 1.0]
    assert messages.bucket_counts == [1, 2, 0, 1]
    assert messages.count == 4
    assert messages.sum == pytest.approx(2.65)
    assert (messages.min, messages.max) == (0.05, 2.0)
    assert messages.temporality == "CUMULATIVE"
    assert messages.value is None
    assert 0 < messages.start_ns <= messages.time_ns
    assert histograms["/v1/models"].bucket_counts == [0, 0, 1, 0]

    (counter,) = [p for p in points if p.name == "gateway.requests"]
    assert (counter.kind, counter.value, counter.temporality, counter.is_monotonic) == ("sum", 3, "DELTA", True)
    assert isinstance(counter.value, int)
    assert counter.attributes == {"route": "/v1/messages"}
    assert (counter.count, counter.sum, counter.bucket_counts) == (None, None, [])

    (gauge,) = [p for p in points if p.name == "gateway.inflight"]
    assert (gauge.kind, gauge.value, gauge.temporality, gauge.attributes) == ("gauge", 7.5, "", {"pool": "a"})

    for point in points:
        assert point.resource["service.name"] == "messages-gateway"
        assert point.scope == "tests.otlp_collector"
        assert point.protocol == transport.split("-")[0]
        assert point.headers["x-collector-key"] == KEY
    assert {r.signal for r in collector.requests()} == {"metrics"}
    assert collector.spans() == []


# --- the failure switch ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_fail_refuses_without_keeping(collector: OtlpCollector, transport: str) -> None:
    spans = finished_spans()
    exporter = span_exporter(collector, transport, timeout=0.5)  # shorter than the first backoff (1 s): no retry
    try:
        collector.fail(1)
        assert collector.failing == 1
        assert exporter.export(spans) is SpanExportResult.FAILURE
        assert collector.refused == 1
        assert collector.failing == 0
        assert collector.spans() == []
        assert collector.requests() == []

        assert exporter.export(spans) is SpanExportResult.SUCCESS  # the switch is spent
        assert [s.name for s in collector.wait_spans(timeout=2)] == ["one"]
        assert collector.refused == 1
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_exporter_retries_past_a_refusal(collector: OtlpCollector, transport: str) -> None:
    exporter = span_exporter(collector, transport, timeout=4)
    try:
        collector.fail(1)
        started = time.monotonic()
        assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        assert time.monotonic() - started < 3
    finally:
        exporter.shutdown()
    assert collector.wait_refused(1, timeout=0) == 1
    assert [s.name for s in collector.spans()] == ["one"]


def test_fail_with_a_status_the_exporters_do_not_retry(collector: OtlpCollector) -> None:
    http_exporter = span_exporter(collector, "http", timeout=5)
    grpc_exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=5)
    try:
        started = time.monotonic()
        collector.fail(1, status=400)
        assert http_exporter.export(finished_spans()) is SpanExportResult.FAILURE
        collector.fail(1, grpc_code=grpc.StatusCode.INVALID_ARGUMENT)
        assert grpc_exporter.export(finished_spans()) is SpanExportResult.FAILURE
        assert time.monotonic() - started < 1  # neither waited for a retry
    finally:
        http_exporter.shutdown()
        grpc_exporter.shutdown()
    assert collector.refused == 2
    assert collector.spans() == []


def test_fail_on_the_wire(collector: OtlpCollector) -> None:
    body = trace_request().SerializeToString()
    collector.fail(2, status=429)
    for _ in range(2):
        status, headers, text = post(collector, "/v1/traces", body, {"Content-Type": PROTOBUF})
        assert (status, headers["content-type"]) == (429, "text/plain")
        assert b"injected failure" in text
    assert post(collector, "/v1/traces", body, {"Content-Type": PROTOBUF})[0] == 200
    assert collector.refused == 2
    assert len(collector.spans()) == 1


# --- the HTTP side on the wire --------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["", "gzip", "deflate"])
def test_http_answers_a_protobuf_response(collector: OtlpCollector, encoding: str) -> None:
    body = trace_request().SerializeToString()
    headers = {"Content-Type": PROTOBUF, "X-Collector-Key": KEY}
    if encoding:
        body = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
        headers["Content-Encoding"] = encoding
    status, answer_headers, answer = post(collector, "/v1/traces", body, headers)
    assert (status, answer_headers["content-type"]) == (200, PROTOBUF)
    assert ExportTraceServiceResponse.FromString(answer) == ExportTraceServiceResponse()
    (span,) = collector.spans()
    assert (span.name, span.kind, span.trace_id, span.span_id) == (
        "raw",
        "INTERNAL",
        bytes(range(16)).hex(),
        "0001020304050607",
    )
    assert span.attributes == {"blob": b"\x00\x01"}
    assert (span.resource, span.scope, span.status_code) == ({}, "", "UNSET")
    assert span.headers["x-collector-key"] == KEY

    status, _, answer = post(collector, "/v1/metrics", b"", {"Content-Type": PROTOBUF})
    assert status == 200
    assert ExportMetricsServiceResponse.FromString(answer) == ExportMetricsServiceResponse()
    assert collector.metrics() == []
    assert [r.signal for r in collector.requests()] == ["traces", "metrics"]


def test_http_refusals(collector: OtlpCollector) -> None:
    body = trace_request().SerializeToString()
    assert post(collector, "/v1/traces", body, {"Content-Type": "application/json"})[0] == 415
    assert post(collector, "/v1/traces", body, {})[0] == 415
    assert post(collector, "/v1/logs", body, {"Content-Type": PROTOBUF})[0] == 404
    assert post(collector, "/", body, {"Content-Type": PROTOBUF})[0] == 404
    assert post(collector, "/v1/traces", b"", {}, method="GET")[0] == 405
    assert post(collector, "/v1/traces", b"\xff\xff\xff", {"Content-Type": PROTOBUF})[0] == 400
    gzip_header = {"Content-Type": PROTOBUF, "Content-Encoding": "gzip"}
    assert post(collector, "/v1/traces", b"not gzip", gzip_header)[0] == 400
    assert post(collector, "/v1/traces", body, {"Content-Type": PROTOBUF, "Content-Encoding": "br"})[0] == 400
    assert [(r.path, r.status) for r in collector.rejections()] == [
        ("/v1/traces", 415),
        ("/v1/traces", 415),
        ("/v1/logs", 404),
        ("/", 404),
        ("/v1/traces", 405),
        ("/v1/traces", 400),
        ("/v1/traces", 400),
        ("/v1/traces", 400),
    ]
    assert collector.requests() == []
    assert collector.refused == 0


def test_http_keep_alive_and_chunked_bodies(collector: OtlpCollector) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", collector.http_port, timeout=5)
    try:
        for name in ("first", "second"):
            conn.request(
                "POST", "/v1/traces", body=trace_request(name).SerializeToString(), headers={"Content-Type": PROTOBUF}
            )
            response = conn.getresponse()
            response.read()
            assert response.status == 200
        chunks = iter([trace_request("chunked").SerializeToString()])
        conn.request("POST", "/v1/traces", body=chunks, headers={"Content-Type": PROTOBUF}, encode_chunked=True)
        response = conn.getresponse()
        response.read()
        assert response.status == 200
    finally:
        conn.close()
    assert [s.name for s in collector.spans()] == ["first", "second", "chunked"]


# --- waits, clear, shutdown -----------------------------------------------------------------------------------------


def test_wait_lists_what_arrived(collector: OtlpCollector) -> None:
    post(collector, "/v1/traces", trace_request("arrived").SerializeToString(), {"Content-Type": PROTOBUF})
    post(collector, "/v1/traces", b"{}", {"Content-Type": "application/json"})
    with pytest.raises(AssertionError) as raised:
        collector.wait_spans(lambda spans: any(s.name == "missing" for s in spans), timeout=0.2)
    message = str(raised.value)
    assert "'arrived' INTERNAL" in message
    assert "http/traces: 1" in message
    assert "415" in message
    with pytest.raises(AssertionError, match="metric points did not match"):
        collector.wait_metrics(timeout=0.1)
    with pytest.raises(AssertionError, match="refused 0"):
        collector.wait_refused(1, timeout=0.1)


def test_wait_returns_once_a_late_span_arrives(collector: OtlpCollector) -> None:
    exporter = span_exporter(collector, "grpc")
    spans = finished_spans(["late"])
    try:
        timer = threading.Timer(0.3, exporter.export, args=(spans,))
        timer.start()
        started = time.monotonic()
        assert [s.name for s in collector.wait_spans(lambda spans: len(spans) == 1, timeout=5)] == ["late"]
        assert 0.2 < time.monotonic() - started < 3
        timer.join()
    finally:
        exporter.shutdown()


def test_clear_keeps_a_pending_failure(collector: OtlpCollector) -> None:
    body = trace_request().SerializeToString()
    collector.fail(2)
    post(collector, "/v1/traces", body, {"Content-Type": PROTOBUF})
    post(collector, "/v1/logs", body, {"Content-Type": PROTOBUF})
    collector.clear()
    assert (collector.refused, collector.failing, collector.rejections()) == (0, 1, [])
    assert post(collector, "/v1/traces", body, {"Content-Type": PROTOBUF})[0] == 503
    assert post(collector, "/v1/traces", body, {"Content-Type": PROTOBUF})[0] == 200
    collector.clear()
    assert (collector.spans(), collector.requests(), collector.refused) == ([], [], 0)
    collector.fail(3)
    collector.fail(0)
    assert collector.failing == 0


def test_close_cuts_open_connections_and_frees_the_ports() -> None:
    collector = OtlpCollector().start()
    assert collector.grpc_endpoint == f"http://127.0.0.1:{collector.grpc_port}"
    assert collector.http_endpoint == f"http://127.0.0.1:{collector.http_port}"
    idle = http.client.HTTPConnection("127.0.0.1", collector.http_port, timeout=5)
    idle.request("POST", "/v1/traces", body=trace_request().SerializeToString(), headers={"Content-Type": PROTOBUF})
    idle.getresponse().read()  # the connection stays open (HTTP/1.1 keep-alive)
    exporter = span_exporter(collector, "grpc")
    assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
    started = time.monotonic()
    collector.close()
    collector.close()  # idempotent
    assert time.monotonic() - started < 3
    exporter.shutdown()
    idle.close()
    for port in (collector.grpc_port, collector.http_port):
        with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
            sock.connect(("127.0.0.1", port))
    with pytest.raises(RuntimeError, match="already started"), OtlpCollector() as started_twice:
        started_twice.start()

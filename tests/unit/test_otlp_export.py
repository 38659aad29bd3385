"""The OTLP exporter over its in-memory transport, and where its configuration comes from (the config first, then
the OpenTelemetry SDK's environment variables, then OTLP's defaults). The real transports are tested against the
OTLP collector in ``tests/e2e/test_tracing.py``."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import threading

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from gateway.observability import otlp_export
from gateway.observability.otlp_export import (
    ExportCounters,
    ExportFailed,
    MemoryTransport,
    OtlpExporter,
    export_config,
    gzip_body,
    gzip_chunks,
)
from gateway.observability.otlp_proto import SPAN_KIND_SERVER, SpanRecord, encode_span, encode_traces
from gateway.settings import Settings, parse_settings


def settings(yaml: str = "") -> Settings:
    return parse_settings("auth: {open: true}\n" + yaml, environ={})


def config(**overrides: object) -> otlp_export.ExportConfig:
    base = export_config(settings("telemetry: {otlp: {endpoint: 'http://127.0.0.1:1'}}"), environ={})
    assert base is not None
    return base._replace(**overrides)  # type: ignore[arg-type]


def span(n: int) -> bytes:
    return encode_span(
        SpanRecord(
            trace_id=bytes(15) + bytes([1]),
            span_id=n.to_bytes(8, "big"),
            parent_span_id=b"",
            trace_state="",
            name=f"span {n}",
            kind=SPAN_KIND_SERVER,
            start_ns=1,
            end_ns=2,
            attributes={"n": n},
        )
    )


def exported(transport: MemoryTransport) -> list[str]:
    names = []
    for signal, body in transport.sent:
        if signal == "traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            names += [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    return names


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_off_unless_configured_and_the_variables_fill_in_what_the_config_leaves_out() -> None:
    assert export_config(settings(), environ={}) is None
    assert export_config(settings(), environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) is not None
    on = settings("telemetry: {otlp: {endpoint: 'http://c:4318'}}")
    assert export_config(on, environ={"OTEL_SDK_DISABLED": "true"}) is None
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://from-env:4317/",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-key=a%20b,X-Other=2",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_SERVICE_NAME": "edge-gw",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=prod,team=platform",
        "OTEL_BSP_SCHEDULE_DELAY": "250",
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "15000",
    }
    got = export_config(settings("server: {tracing: true}"), environ=env)
    assert got is not None
    assert (got.endpoint, got.protocol, got.timeout_s, got.schedule_delay_s) == (
        "http://from-env:4317",
        "grpc",
        2.5,
        0.25,
    )
    assert (got.max_queue, got.metrics_interval_s, got.max_batch) == (100, 15.0, 512)
    assert got.headers == {"x-key": "a b", "x-other": "2"}
    assert got.resource["service.name"] == "edge-gw" and got.resource["team"] == "platform"
    assert got.resource["service.version"] and got.resource["service.instance.id"]
    # the config's keys win over their variables
    yaml = """telemetry: {otlp: {endpoint: "http://cfg:4318", protocol: http/protobuf, headers: {x-key: cfg},
              resource_attributes: {service.name: cfg-gw}, schedule_delay_s: 1}}"""
    got = export_config(settings(yaml), environ=env)
    assert got is not None
    assert (got.endpoint, got.protocol, got.schedule_delay_s, got.timeout_s) == (
        "http://cfg:4318",
        "http/protobuf",
        1.0,
        2.5,
    )
    assert got.headers["x-key"] == "cfg" and got.resource["service.name"] == "cfg-gw"
    # defaults: OTLP/HTTP on localhost
    got = export_config(settings("server: {tracing: true}"), environ={})
    assert got is not None and (got.endpoint, got.protocol) == ("http://localhost:4318", "http/protobuf")
    assert (got.schedule_delay_s, got.max_queue, got.max_batch, got.timeout_s) == (5.0, 2048, 512, 10.0)


def test_the_bodies_are_gzipped_unless_the_config_or_the_variable_says_none() -> None:
    on = settings("telemetry: {otlp: {endpoint: 'http://c:4318'}}")
    for environ, expected in (
        ({}, "gzip"),
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "none"}, "none"),
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "GZIP"}, "gzip"),
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "gzip"),  # not served: the default, with a warning
    ):
        got = export_config(on, environ=environ)
        assert got is not None and got.compression == expected, environ
    told = settings("telemetry: {otlp: {endpoint: 'http://c:4318', compression: none}}")
    got = export_config(told, environ={"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
    assert got is not None and got.compression == "none"  # the config wins


def test_gzip_body_is_a_gzip_member_of_the_same_bytes() -> None:
    assert otlp_export.GZIP == "isal"  # a dependency: ISA-L's deflate, inflated here by the standard library's
    body = b"".join(span(n) for n in range(50))
    packed = gzip_body(body)
    assert gzip.decompress(packed) == body and len(packed) < len(body) / 5
    for size in (0, 1, 64 * 1024, 64 * 1024 + 1, 300_000):  # on the loop, a piece at a time: the same bytes inflate
        data = (body * (size // len(body) + 1))[:size]
        assert gzip.decompress(asyncio.run(gzip_chunks(data))) == data


def test_a_full_queue_drops_and_counts_and_a_batch_leaves_when_max_batch_wait() -> None:
    async def main() -> None:
        registry = CollectorRegistry()
        transport = MemoryTransport()
        exporter = OtlpExporter(
            config(max_queue=5, max_batch=3, schedule_delay_s=60), ExportCounters(registry), transport
        )
        exporter.start()
        exporter.submit([span(1), span(2)])
        await asyncio.sleep(0.05)
        assert transport.sent == []  # fewer than max_batch, and the schedule is a minute away
        exporter.submit([span(3), span(4), span(5), span(6), span(7)])  # 7 > 5: two dropped
        await asyncio.sleep(0.05)
        assert exported(transport) == ["span 1", "span 2", "span 3"]  # a batch of 3 left at once
        assert sample(registry, "gateway_otlp_spans_total", outcome="dropped") == 2
        await exporter.aclose()  # the rest leaves before the process does
        assert exported(transport) == [f"span {n}" for n in (1, 2, 3, 4, 5)]
        assert sample(registry, "gateway_otlp_spans_total", outcome="exported") == 5

    asyncio.run(main())


def test_the_schedule_sends_what_waits() -> None:
    async def main() -> None:
        transport = MemoryTransport()
        exporter = OtlpExporter(config(schedule_delay_s=0.1), ExportCounters(CollectorRegistry()), transport)
        exporter.start()
        exporter.submit([span(1)])
        await asyncio.sleep(0.3)
        assert exported(transport) == ["span 1"]
        await exporter.aclose()

    asyncio.run(main())


class Flaky(MemoryTransport):
    def __init__(self, failures: list[ExportFailed]) -> None:
        super().__init__()
        self.errors = failures
        self.calls = 0

    async def send(self, signal: otlp_export.Signal, body: bytes, timeout_s: float) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        await super().send(signal, body, timeout_s)


@pytest.mark.parametrize("retryable", [True, False])
def test_a_retryable_failure_is_retried_once_and_a_failure_is_counted(
    retryable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(otlp_export, "_RETRY_AFTER_S", 0.01)

    async def main() -> None:
        registry = CollectorRegistry()
        transport = Flaky([ExportFailed("HTTP 503", retryable=retryable)])
        exporter = OtlpExporter(config(schedule_delay_s=0.05), ExportCounters(registry), transport)
        exporter.start()
        exporter.submit([span(1)])
        await asyncio.sleep(0.3)
        await exporter.aclose()
        if retryable:
            assert exported(transport) == ["span 1"] and transport.calls == 2
            assert sample(registry, "gateway_otlp_exports_total", signal="traces", outcome="ok") == 1
        else:
            assert exported(transport) == [] and transport.calls == 1
            assert sample(registry, "gateway_otlp_exports_total", signal="traces", outcome="failed") == 1
            assert sample(registry, "gateway_otlp_spans_total", outcome="failed") == 1

    asyncio.run(main())


def test_a_collector_that_never_answers_costs_the_shutdown_at_most_its_bound() -> None:
    class Silent(MemoryTransport):
        async def send(self, signal: otlp_export.Signal, body: bytes, timeout_s: float) -> None:
            await asyncio.sleep(3600)

    async def main() -> None:
        registry = CollectorRegistry()
        exporter = OtlpExporter(config(schedule_delay_s=60), ExportCounters(registry), Silent())
        exporter.start()
        exporter.submit([span(1), span(2)])
        loop = asyncio.get_running_loop()
        started = loop.time()
        await exporter.aclose(within=0.2)
        assert loop.time() - started < 1.0
        assert sample(registry, "gateway_otlp_spans_total", outcome="exported") == 0
        assert sample(registry, "gateway_otlp_spans_total", outcome="dropped") == 2

    asyncio.run(main())


class _Relay:
    """A TCP relay on 127.0.0.1 in front of ``port``, counting the bytes the client sent through it."""

    def __init__(self, port: int) -> None:
        self.sent = 0
        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self._target))
                threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
                threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if count:
                    self.sent += len(data)
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_grpc_sends_gzipped_messages_unless_told_none(compression: str) -> None:
    """gRPC's message compression, seen on the wire through a relay (a collector cannot see it: grpcio inflates
    before the servicer): a batch of repetitive spans is a fraction of its size gzipped, all of it otherwise — and
    the collector gets every span either way."""
    pytest.importorskip("grpc")
    from tests.fakes.otlp_collector import OtlpCollector

    spans = [span(n) for n in range(300)]
    body = encode_traces({"service.name": "t"}, "s", "1", spans)
    with OtlpCollector() as collector:
        relay = _Relay(int(collector.grpc_endpoint.rsplit(":", 1)[1]))
        try:
            transport = otlp_export.GrpcTransport(
                config(endpoint=f"http://127.0.0.1:{relay.port}", protocol="grpc", compression=compression)
            )

            async def send() -> None:
                await transport.send("traces", body, 10.0)
                await transport.aclose()

            asyncio.run(send())
            assert len(collector.wait_spans(lambda got: len(got) >= 300)) == 300
        finally:
            relay.close()
    if compression == "gzip":
        assert relay.sent < len(body) / 3
    else:
        assert relay.sent > len(body)

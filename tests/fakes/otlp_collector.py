"""A test OTLP receiver standing in for an OpenTelemetry Collector (none can be installed here), built on the
official ``opentelemetry-proto`` messages, so what it decodes is what a real collector would.

:class:`OtlpCollector` serves on 127.0.0.1 (free ports unless given), from background threads:

* OTLP/gRPC (``grpc_endpoint``, ``http://127.0.0.1:PORT``): a ``grpc.server`` implementing
  ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` and
  ``opentelemetry.proto.collector.metrics.v1.MetricsService/Export``, answering an empty ``Export*ServiceResponse``
  (gRPC's own ``grpc-encoding: gzip`` is inflated by grpcio).
* OTLP/HTTP with protobuf bodies (``http_endpoint``, ``http://127.0.0.1:PORT``, the base: a client appends
  ``/v1/traces`` or ``/v1/metrics``): ``POST`` with ``Content-Type: application/x-protobuf`` (``Content-Encoding``
  ``gzip``, ``deflate`` or none; a ``Content-Length`` or chunked body) -> 200 with a serialized empty
  ``Export*ServiceResponse`` (``application/x-protobuf``). Another content type is 415, an unknown encoding or a
  body that does not decode 400, another method on those paths 405, another path 404; each of these is kept in
  :meth:`OtlpCollector.rejections` (never among the requests).

Every accepted request is kept (:class:`OtlpRequest`: protocol, signal, the lower-cased headers or gRPC metadata,
the decoded message) and flattened into :class:`Span` and :class:`Point` rows; :meth:`OtlpCollector.wait_spans` and
:meth:`OtlpCollector.wait_metrics` poll until a predicate over all rows so far holds. ``fail(n, status)`` makes
the next ``n`` OTLP requests of either protocol fail (HTTP: that status; gRPC: ``UNAVAILABLE``) without keeping
them, counted in ``refused``. Everything is lock-protected.

    with OtlpCollector() as collector:
        ... start the gateway with collector.grpc_endpoint or collector.http_endpoint ...
        spans = collector.wait_spans(lambda spans: any(s.kind == "SERVER" for s in spans))
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = [
    "OtlpCollector",
    "OtlpRequest",
    "Point",
    "Rejection",
    "Span",
    "SpanEvent",
    "SpanLink",
    "any_value",
    "attributes",
]

Protocol = Literal["grpc", "http"]
Signal = Literal["traces", "metrics"]

T = TypeVar("T")

PROTOBUF = "application/x-protobuf"
_HTTP_PATHS: dict[str, Signal] = {"/v1/traces": "traces", "/v1/metrics": "metrics"}
_REQUESTS: dict[Signal, type[Message]] = {
    "traces": trace_service_pb2.ExportTraceServiceRequest,
    "metrics": metrics_service_pb2.ExportMetricsServiceRequest,
}
_RESPONSES: dict[Signal, type[Message]] = {
    "traces": trace_service_pb2.ExportTraceServiceResponse,
    "metrics": metrics_service_pb2.ExportMetricsServiceResponse,
}


# --- what is kept -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OtlpRequest:
    """One accepted export request."""

    protocol: Protocol
    signal: Signal
    headers: dict[str, str]  # lower-cased names (HTTP headers or gRPC metadata); repeated ones joined by ", "
    message: Any  # ExportTraceServiceRequest | ExportMetricsServiceRequest
    received_at: float  # time.time()


@dataclass(frozen=True)
class Rejection:
    """A request the collector refused for what it was (not one ``fail()`` refused)."""

    protocol: Protocol
    path: str  # the HTTP path, or the gRPC method
    status: int  # the HTTP status answered
    reason: str


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True)
class SpanLink:
    trace_id: str  # hex
    span_id: str  # hex
    trace_state: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class Span:
    """One span as received, flattened with its resource and scope."""

    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # 16 hex digits, "" for a root span
    trace_state: str
    name: str
    kind: str  # "UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: str  # "UNSET", "OK", "ERROR"
    status_message: str
    flags: int
    resource: dict[str, Any]
    scope: str
    scope_version: str
    protocol: Protocol
    headers: dict[str, str]
    events: list[SpanEvent]
    links: list[SpanLink]

    def __str__(self) -> str:
        parent = f" parent={self.parent_span_id}" if self.parent_span_id else ""
        status = f" status={self.status_code}" if self.status_code != "UNSET" else ""
        return (
            f"{self.name!r} {self.kind} trace={self.trace_id} span={self.span_id}{parent}{status}"
            f" via {self.protocol} attributes={self.attributes}"
        )


@dataclass(frozen=True)
class Point:
    """One metric data point, flattened with its metric, resource and scope. Fields that do not apply to the
    kind are None (or empty lists)."""

    name: str
    unit: str
    description: str
    kind: str  # "histogram", "sum", "gauge", "exponential_histogram", "summary"
    attributes: dict[str, Any]
    count: int | None  # histogram, exponential_histogram, summary
    sum: float | None  # histogram (when sent), exponential_histogram (when sent), summary
    bucket_counts: list[int]  # histogram: len(bounds) + 1 counts
    bounds: list[float]  # histogram: the explicit bounds
    min: float | None  # histogram, exponential_histogram (when sent)
    max: float | None
    value: int | float | None  # sum, gauge (as_int -> int, as_double -> float)
    temporality: str  # "DELTA", "CUMULATIVE" ("UNSPECIFIED" if so sent); "" for gauge and summary
    start_ns: int
    time_ns: int
    resource: dict[str, Any]
    protocol: Protocol
    is_monotonic: bool | None  # sum only
    scope: str
    headers: dict[str, str]

    def __str__(self) -> str:
        shown = f"value={self.value}" if self.value is not None else f"count={self.count} sum={self.sum}"
        temporality = f" {self.temporality}" if self.temporality else ""
        return f"{self.name!r} {self.kind}{temporality} {shown} attributes={self.attributes} via {self.protocol}"


# --- decoding -----------------------------------------------------------------------------------------------------


def any_value(value: common_pb2.AnyValue) -> Any:
    """An OTLP ``AnyValue`` as Python: str, bool, int, float, bytes, list (array), dict (kvlist), None (empty)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, which)


def attributes(key_values: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in key_values}


def _hex(raw: bytes) -> str:
    return raw.hex()


def _flatten_spans(request: OtlpRequest) -> list[Span]:
    spans: list[Span] = []
    for resource_spans in request.message.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            for span in scope_spans.spans:
                spans.append(
                    Span(
                        trace_id=_hex(span.trace_id),
                        span_id=_hex(span.span_id),
                        parent_span_id=_hex(span.parent_span_id),
                        trace_state=span.trace_state,
                        name=span.name,
                        kind=trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=attributes(span.attributes),
                        status_code=trace_pb2.Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
                        status_message=span.status.message,
                        flags=span.flags,
                        resource=dict(resource),
                        scope=scope.name,
                        scope_version=scope.version,
                        protocol=request.protocol,
                        headers=request.headers,
                        events=[SpanEvent(e.name, e.time_unix_nano, attributes(e.attributes)) for e in span.events],
                        links=[
                            SpanLink(
                                _hex(link.trace_id), _hex(link.span_id), link.trace_state, attributes(link.attributes)
                            )
                            for link in span.links
                        ],
                    )
                )
    return spans


def _temporality(value: int) -> str:
    return metrics_pb2.AggregationTemporality.Name(value).removeprefix("AGGREGATION_TEMPORALITY_")


def _optional(point: Any, name: str) -> float | None:
    return getattr(point, name) if point.HasField(name) else None


def _metric_points(metric: metrics_pb2.Metric) -> list[dict[str, Any]]:
    """The kind-specific fields of each data point of one metric."""
    kind = metric.WhichOneof("data")
    rows: list[dict[str, Any]] = []
    if kind in ("sum", "gauge"):
        data = getattr(metric, kind)
        for dp in data.data_points:
            which = dp.WhichOneof("value")
            rows.append(
                {
                    "dp": dp,
                    "value": getattr(dp, which) if which else None,
                    "temporality": _temporality(data.aggregation_temporality) if kind == "sum" else "",
                    "is_monotonic": data.is_monotonic if kind == "sum" else None,
                }
            )
    elif kind == "histogram":
        for dp in metric.histogram.data_points:
            rows.append(
                {
                    "dp": dp,
                    "count": dp.count,
                    "sum": _optional(dp, "sum"),
                    "bucket_counts": list(dp.bucket_counts),
                    "bounds": list(dp.explicit_bounds),
                    "min": _optional(dp, "min"),
                    "max": _optional(dp, "max"),
                    "temporality": _temporality(metric.histogram.aggregation_temporality),
                }
            )
    elif kind == "exponential_histogram":
        data = metric.exponential_histogram
        for dp in data.data_points:
            rows.append(
                {
                    "dp": dp,
                    "count": dp.count,
                    "sum": _optional(dp, "sum"),
                    "min": _optional(dp, "min"),
                    "max": _optional(dp, "max"),
                    "temporality": _temporality(data.aggregation_temporality),
                }
            )
    elif kind == "summary":
        for dp in metric.summary.data_points:
            rows.append({"dp": dp, "count": dp.count, "sum": dp.sum})
    return rows


def _flatten_metrics(request: OtlpRequest) -> list[Point]:
    points: list[Point] = []
    for resource_metrics in request.message.resource_metrics:
        resource = attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for row in _metric_points(metric):
                    dp = row["dp"]
                    points.append(
                        Point(
                            name=metric.name,
                            unit=metric.unit,
                            description=metric.description,
                            kind=metric.WhichOneof("data") or "",
                            attributes=attributes(dp.attributes),
                            count=row.get("count"),
                            sum=row.get("sum"),
                            bucket_counts=row.get("bucket_counts", []),
                            bounds=row.get("bounds", []),
                            min=row.get("min"),
                            max=row.get("max"),
                            value=row.get("value"),
                            temporality=row.get("temporality", ""),
                            start_ns=dp.start_time_unix_nano,
                            time_ns=dp.time_unix_nano,
                            resource=dict(resource),
                            protocol=request.protocol,
                            is_monotonic=row.get("is_monotonic"),
                            scope=scope_metrics.scope.name,
                            headers=request.headers,
                        )
                    )
    return points


def _header_dict(pairs: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in pairs:
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        key = name.lower()
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers


# --- the HTTP side ------------------------------------------------------------------------------------------------


class _HttpServer(ThreadingHTTPServer):
    """Keeps its connections so that closing the server ends keep-alive ones too (and joins their threads)."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], collector: OtlpCollector) -> None:
        self.collector = collector
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _HttpHandler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        try:
            super().finish_request(request, client_address)
        finally:
            with self.connections_lock:
                self.connections.discard(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client gone mid-request (or the collector closing its connections) is not an error of the test

    def close_connections(self) -> None:
        with self.connections_lock:
            connections = list(self.connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _HttpHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self._read_body()
        if body is None:
            return
        self.server.collector._on_http(self, self.path.split("?", 1)[0], body)

    def _other_method(self) -> None:
        body = self._read_body()
        if body is None:
            return
        path = self.path.split("?", 1)[0]
        status = 405 if path in _HTTP_PATHS else 404
        self.server.collector._reject("http", path, status, f"{self.command} {path}")
        self.reply(status, f"{self.command} {path}: not served".encode(), "text/plain", allow="POST")

    do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _other_method

    def _read_body(self) -> bytes | None:
        """The request's body (Content-Length or chunked); None when the client went away meanwhile."""
        try:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                chunks: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        except (OSError, ValueError):
            self.close_connection = True
            return None

    def reply(self, status: int, body: bytes, content_type: str, **extra: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra.items():
            self.send_header(name.replace("_", "-").title(), value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _inflate(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return gzip.decompress(body)
    if encoding == "deflate":
        try:
            return zlib.decompress(body)
        except zlib.error:
            return zlib.decompress(body, -zlib.MAX_WBITS)  # raw deflate, as some clients send it
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


# --- the gRPC side ------------------------------------------------------------------------------------------------


class _TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, collector: OtlpCollector) -> None:
        self._collector = collector

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._collector._on_grpc("traces", request, context)
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
    def __init__(self, collector: OtlpCollector) -> None:
        self._collector = collector

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._collector._on_grpc("metrics", request, context)
        return metrics_service_pb2.ExportMetricsServiceResponse()


# --- the collector ------------------------------------------------------------------------------------------------


class OtlpCollector:
    """An OTLP/gRPC and OTLP/HTTP (protobuf) receiver on 127.0.0.1. ``grpc_port``/``http_port`` 0: free ports."""

    def __init__(self, *, grpc_port: int = 0, http_port: int = 0, workers: int = 8) -> None:
        self.grpc_endpoint = ""  # "http://127.0.0.1:PORT", once started
        self.http_endpoint = ""  # "http://127.0.0.1:PORT" (the base: the client appends /v1/traces, /v1/metrics)
        self.grpc_port = grpc_port
        self.http_port = http_port
        self._workers = workers
        self._cond = threading.Condition()
        self._requests: list[OtlpRequest] = []
        self._spans: list[Span] = []
        self._points: list[Point] = []
        self._rejections: list[Rejection] = []
        self._refused = 0
        self._fail_left = 0
        self._fail_status = 503
        self._fail_code = grpc.StatusCode.UNAVAILABLE
        self._generation = 0  # bumped on every change that a wait may be waiting for
        self._grpc_server: grpc.Server | None = None
        self._grpc_pool: ThreadPoolExecutor | None = None
        self._http_server: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> Self:
        if self._grpc_server is not None or self._http_server is not None:
            raise RuntimeError("OtlpCollector already started")
        try:
            self._start_grpc()
            self._start_http()
        except BaseException:
            self.close()
            raise
        return self

    def _start_grpc(self) -> None:
        pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="otlp-grpc")
        self._grpc_pool = pool
        server = grpc.server(pool, options=[("grpc.so_reuseport", 0)])
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceServicer(self), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsServicer(self), server)
        port = server.add_insecure_port(f"127.0.0.1:{self.grpc_port}")
        if port == 0:
            raise OSError(f"OtlpCollector: cannot listen for gRPC on 127.0.0.1:{self.grpc_port}")
        server.start()
        self._grpc_server = server
        self.grpc_port = port
        self.grpc_endpoint = f"http://127.0.0.1:{port}"

    def _start_http(self) -> None:
        server = _HttpServer(("127.0.0.1", self.http_port), self)
        self._http_server = server
        self.http_port = server.server_address[1]
        self.http_endpoint = f"http://127.0.0.1:{self.http_port}"
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="otlp-http", daemon=True
        )
        self._http_thread = thread
        thread.start()

    def close(self) -> None:
        """Stop both servers (idempotent): open connections are cut, their threads joined."""
        grpc_server, self._grpc_server = self._grpc_server, None
        pool, self._grpc_pool = self._grpc_pool, None
        http_server, self._http_server = self._http_server, None
        http_thread, self._http_thread = self._http_thread, None
        if grpc_server is not None:
            grpc_server.stop(grace=0.5).wait(5)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if http_server is not None:
            if http_thread is not None:
                http_server.shutdown()
                http_thread.join(5)
            http_server.close_connections()
            http_server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- failures --------------------------------------------------------------------------------------------------

    def fail(self, n: int, status: int = 503, *, grpc_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        """The next ``n`` OTLP requests (either protocol, either signal) fail and are not kept: HTTP answers
        ``status`` with a small text body, gRPC aborts with ``grpc_code``. Replaces what is left of an earlier
        ``fail``; ``fail(0)`` cancels it."""
        with self._cond:
            self._fail_left = n
            self._fail_status = status
            self._fail_code = grpc_code

    @property
    def refused(self) -> int:
        """How many requests ``fail()`` refused so far."""
        with self._cond:
            return self._refused

    @property
    def failing(self) -> int:
        """How many of the requests to come ``fail()`` will still refuse."""
        with self._cond:
            return self._fail_left

    def _take_failure(self) -> tuple[int, grpc.StatusCode] | None:
        with self._cond:
            if self._fail_left <= 0:
                return None
            self._fail_left -= 1
            self._refused += 1
            self._generation += 1
            self._cond.notify_all()
            return self._fail_status, self._fail_code

    # -- receiving -------------------------------------------------------------------------------------------------

    def _keep(self, protocol: Protocol, signal: Signal, headers: dict[str, str], message: Any) -> None:
        request = OtlpRequest(protocol, signal, headers, message, time.time())
        spans = _flatten_spans(request) if signal == "traces" else []
        points = _flatten_metrics(request) if signal == "metrics" else []
        with self._cond:
            self._requests.append(request)
            self._spans.extend(spans)
            self._points.extend(points)
            self._generation += 1
            self._cond.notify_all()

    def _reject(self, protocol: Protocol, path: str, status: int, reason: str) -> None:
        with self._cond:
            self._rejections.append(Rejection(protocol, path, status, reason))
            self._generation += 1
            self._cond.notify_all()

    def _on_grpc(self, signal: Signal, message: Any, context: grpc.ServicerContext) -> None:
        failure = self._take_failure()
        if failure is not None:
            context.abort(failure[1], f"collector: injected failure ({failure[0]})")
        self._keep("grpc", signal, _header_dict(context.invocation_metadata()), message)

    def _on_http(self, handler: _HttpHandler, path: str, body: bytes) -> None:
        signal = _HTTP_PATHS.get(path)
        if signal is None:
            self._reject("http", path, 404, f"POST {path}")
            handler.reply(404, f"{path}: not an OTLP path (/v1/traces, /v1/metrics)".encode(), "text/plain")
            return
        failure = self._take_failure()
        if failure is not None:
            handler.reply(failure[0], b"collector: injected failure", "text/plain")
            return
        content_type = handler.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if content_type != PROTOBUF:
            self._reject("http", path, 415, f"Content-Type {content_type or '(none)'!r}")
            handler.reply(415, f"only {PROTOBUF} is served".encode(), "text/plain")
            return
        try:
            message = _REQUESTS[signal].FromString(_inflate(body, handler.headers.get("Content-Encoding", "")))
        except (ValueError, OSError, EOFError, zlib.error, DecodeError) as error:
            self._reject("http", path, 400, f"undecodable body: {error}")
            handler.reply(400, f"undecodable body: {error}".encode(), "text/plain")
            return
        self._keep("http", signal, _header_dict(handler.headers.items()), message)
        handler.reply(200, _RESPONSES[signal]().SerializeToString(), PROTOBUF)

    # -- reading ---------------------------------------------------------------------------------------------------

    def requests(self) -> list[OtlpRequest]:
        """Every accepted request, oldest first."""
        with self._cond:
            return list(self._requests)

    def rejections(self) -> list[Rejection]:
        with self._cond:
            return list(self._rejections)

    def spans(self) -> list[Span]:
        """Every span received so far, in the order they arrived."""
        with self._cond:
            return list(self._spans)

    def metrics(self) -> list[Point]:
        """Every metric data point received so far, in the order they arrived."""
        with self._cond:
            return list(self._points)

    def clear(self) -> None:
        """Forget the requests, spans, points, rejections and the ``refused`` count (not a pending ``fail``)."""
        with self._cond:
            self._requests.clear()
            self._spans.clear()
            self._points.clear()
            self._rejections.clear()
            self._refused = 0
            self._generation += 1
            self._cond.notify_all()

    def wait_spans(self, predicate: Callable[[list[Span]], object] | None = None, timeout: float = 10.0) -> list[Span]:
        """All spans so far, once ``predicate(spans)`` holds (default: there is one); AssertionError after
        ``timeout`` seconds, listing what arrived."""
        return self._wait(self.spans, predicate, timeout, "spans")

    def wait_metrics(
        self, predicate: Callable[[list[Point]], object] | None = None, timeout: float = 10.0
    ) -> list[Point]:
        """All metric points so far, once ``predicate(points)`` holds (default: there is one); AssertionError after
        ``timeout`` seconds, listing what arrived."""
        return self._wait(self.metrics, predicate, timeout, "metric points")

    def wait_requests(
        self, predicate: Callable[[list[OtlpRequest]], object] | None = None, timeout: float = 10.0
    ) -> list[OtlpRequest]:
        return self._wait(self.requests, predicate, timeout, "requests")

    def wait_refused(self, count: int = 1, timeout: float = 10.0) -> int:
        """Wait until ``refused >= count``; returns it (AssertionError on timeout)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._refused >= count, timeout):
                raise AssertionError(f"the collector refused {self._refused} request(s) in {timeout} s, not {count}")
            return self._refused

    def _wait(
        self, read: Callable[[], list[T]], predicate: Callable[[list[T]], object] | None, timeout: float, what: str
    ) -> list[T]:
        deadline = time.monotonic() + timeout
        holds = predicate if predicate is not None else bool
        while True:
            with self._cond:
                generation = self._generation
            rows = read()
            if holds(rows):
                return rows
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(self._describe(rows, what, timeout))
            self._wait_change(generation, min(remaining, 0.25))

    def _wait_change(self, generation: int, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._generation != generation, timeout)

    def _describe(self, rows: Sequence[object], what: str, timeout: float) -> str:
        lines = [f"the collector's {what} did not match in {timeout} s; {len(rows)} arrived:"]
        lines += [f"  {row}" for row in rows] or ["  (none)"]
        with self._cond:
            protocols = _count(f"{r.protocol}/{r.signal}" for r in self._requests)
            lines.append(f"requests: {protocols or 'none'}; refused by fail(): {self._refused}")
            lines += [f"rejected: {r.protocol} {r.path} {r.status} {r.reason}" for r in self._rejections]
        return "\n".join(lines)


def _count(items: Iterable[str]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in Counter(items).items())

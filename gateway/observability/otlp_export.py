"""The gateway's own traces and GenAI metrics, sent over OTLP (``telemetry.otlp``, or the ``OTEL_*`` variables).

``export_config`` reads where to (the config's keys first, then the standard variables of the OpenTelemetry SDK's
environment specification, then OTLP's defaults); ``OtlpExporter`` sends. ``submit`` (called once per traced
request, when it is recorded) never awaits and never raises: the spans join a queue of at most ``max_queue`` (more
are dropped and counted). A background task sends a batch of at most ``max_batch`` when the queue holds that many,
or ``schedule_delay_s`` after the last send, and the GenAI histograms every ``metrics_interval_s``: the
OpenTelemetry SDK's ``BatchSpanProcessor`` and ``PeriodicExportingMetricReader``, with the same defaults. An
export that fails (a connect error, a timeout, an answer that is not success) is retried once when OTLP calls it
retryable, then counted (``gateway_otlp_exports_total{outcome="failed"}``, the spans it held in
``gateway_otlp_spans_total{outcome="failed"}``) and logged at most once a minute: a request never feels it.

Two transports, as the collector speaks: ``http/protobuf`` (aiohttp: ``POST {endpoint}/v1/traces`` and
``/v1/metrics``, ``application/x-protobuf``, gzipped unless ``compression: none``) and ``grpc`` (grpcio's asyncio
channel, the ``TraceService`` and ``MetricsService`` ``Export`` methods, the bodies passed as the serialized requests
they are, gzip as gRPC's message compression); and an in-memory one for unit tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol
from urllib.parse import unquote, urlsplit

from gateway.observability.otlp_proto import AttrValue, encode_metrics, encode_traces

if TYPE_CHECKING:
    import aiohttp
    from prometheus_client import CollectorRegistry

    from gateway.observability.genai_metrics import GenAiMetrics
    from gateway.settings import Settings

__all__ = [
    "ExportConfig",
    "ExportFailed",
    "GrpcTransport",
    "HttpTransport",
    "MemoryTransport",
    "OtlpExporter",
    "Transport",
    "export_config",
]

log = logging.getLogger("gateway")

Signal = Literal["traces", "metrics"]
SCOPE = "messages-gateway"
_LOG_EVERY_S = 60.0
_RETRY_AFTER_S = 1.0
_RETRYABLE_STATUS = frozenset({429, 502, 503, 504})


class ExportConfig(NamedTuple):
    endpoint: str  # the collector's base URL
    protocol: Literal["grpc", "http/protobuf"]
    headers: dict[str, str]
    resource: dict[str, AttrValue]
    traces: bool
    metrics: bool
    timeout_s: float
    schedule_delay_s: float
    max_queue: int
    max_batch: int
    metrics_interval_s: float
    sample_ratio: float
    capture_content: bool
    traces_url: str = ""  # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the full URL, as the variable gives it
    metrics_url: str = ""
    compression: Literal["gzip", "none"] = "gzip"  # the bodies (HTTP's Content-Encoding, gRPC's grpc-encoding)


def _pairs(value: str) -> dict[str, str]:
    """``k=v,k2=v2`` (the W3C baggage form of OTEL_EXPORTER_OTLP_HEADERS and OTEL_RESOURCE_ATTRIBUTES)."""
    out: dict[str, str] = {}
    for item in value.split(","):
        key, eq, val = item.partition("=")
        if eq and key.strip():
            out[unquote(key.strip())] = unquote(val.strip())
    return out


def _seconds(environ: Mapping[str, str], name: str) -> float | None:
    raw = environ.get(name, "").strip()
    try:
        value = float(raw) / 1000 if raw else None  # the variables are in milliseconds
    except ValueError:
        log.warning("ignoring %s=%r: not a number of milliseconds", name, raw)
        return None
    return value if value is not None and value > 0 else None


def _count(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    try:
        value = int(raw) if raw else None
    except ValueError:
        log.warning("ignoring %s=%r: not a whole number", name, raw)
        return None
    return value if value is not None and value > 0 else None


def export_config(settings: Settings, environ: Mapping[str, str] | None = None) -> ExportConfig | None:
    """Where and how the gateway's telemetry goes, or None when it is off: on with ``telemetry.otlp``,
    ``server.tracing: true``, or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its ``_TRACES_`` form) in the environment;
    ``OTEL_SDK_DISABLED=true`` turns it off whatever else says."""
    from gateway import __version__

    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    otlp = settings.telemetry.otlp
    env_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    traces_url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    metrics_url = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "").strip()
    if otlp is None and not settings.server.tracing and not env_endpoint and not traces_url:
        return None
    from gateway.settings import OtlpSettings

    otlp = otlp or OtlpSettings()
    env_protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
    protocol: Literal["grpc", "http/protobuf"] = otlp.protocol or (
        "grpc" if env_protocol == "grpc" else "http/protobuf"
    )
    if env_protocol and env_protocol not in ("grpc", "http/protobuf") and otlp.protocol is None:
        log.warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=%r is not served (grpc or http/protobuf): using http/protobuf", env_protocol
        )
    default = "http://localhost:4317" if protocol == "grpc" else "http://localhost:4318"
    endpoint = (otlp.endpoint or env_endpoint or default).rstrip("/")
    if otlp.endpoint is not None:  # the config names the collector: the variables' per-signal URLs do not move it
        traces_url = metrics_url = ""
    headers = {k.lower(): v for k, v in _pairs(env.get("OTEL_EXPORTER_OTLP_HEADERS", "")).items()}
    headers.update({k.lower(): v for k, v in otlp.headers.items()})
    resource: dict[str, AttrValue] = {
        "service.name": "messages-gateway",
        "service.version": __version__,
        "service.instance.id": str(uuid.uuid4()),  # each worker process its own series
        "telemetry.sdk.name": "messages-gateway",
        "telemetry.sdk.language": "python",
        "telemetry.sdk.version": __version__,
    }
    resource.update(_pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    if env.get("OTEL_SERVICE_NAME", "").strip():
        resource["service.name"] = env["OTEL_SERVICE_NAME"].strip()
    resource.update(otlp.resource_attributes)
    fields = otlp.__struct_fields__
    given = {name for name in fields if getattr(otlp, name) != getattr(OtlpSettings(), name)}

    def pick(name: str, from_env: float | int | None) -> Any:
        return getattr(otlp, name) if name in given or from_env is None else from_env

    env_compression = env.get("OTEL_EXPORTER_OTLP_COMPRESSION", "").strip().lower()
    if env_compression and env_compression not in ("gzip", "none"):
        log.warning("ignoring OTEL_EXPORTER_OTLP_COMPRESSION=%r (gzip or none)", env_compression)
        env_compression = ""
    compression: Literal["gzip", "none"] = otlp.compression or ("none" if env_compression == "none" else "gzip")
    return ExportConfig(
        endpoint=endpoint,
        protocol=protocol,
        headers=headers,
        resource=resource,
        traces="traces" in otlp.signals,
        metrics="metrics" in otlp.signals,
        timeout_s=pick("timeout_s", _seconds(env, "OTEL_EXPORTER_OTLP_TIMEOUT")),
        schedule_delay_s=pick("schedule_delay_s", _seconds(env, "OTEL_BSP_SCHEDULE_DELAY")),
        max_queue=pick("max_queue", _count(env, "OTEL_BSP_MAX_QUEUE_SIZE")),
        max_batch=pick("max_batch", _count(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE")),
        metrics_interval_s=pick("metrics_interval_s", _seconds(env, "OTEL_METRIC_EXPORT_INTERVAL")),
        sample_ratio=otlp.sample_ratio,
        capture_content=otlp.capture_content,
        traces_url=traces_url,
        metrics_url=metrics_url,
        compression=compression,
    )


class ExportFailed(Exception):
    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class Transport(Protocol):
    async def send(self, signal: Signal, body: bytes, timeout_s: float) -> None:
        """Deliver one serialized ``Export*ServiceRequest``; ``ExportFailed`` when the collector did not take it."""
        ...

    async def aclose(self) -> None: ...


class MemoryTransport:
    """The in-memory twin: keeps what it is sent (``fail`` makes the next sends fail)."""

    def __init__(self) -> None:
        self.sent: list[tuple[Signal, bytes]] = []
        self.failures = 0

    async def send(self, signal: Signal, body: bytes, timeout_s: float) -> None:
        if self.failures:
            self.failures -= 1
            raise ExportFailed("refused (in-memory transport)", retryable=False)
        self.sent.append((signal, body))

    async def aclose(self) -> None:
        return None


class HttpTransport:
    """OTLP/HTTP with protobuf bodies, gzipped unless ``compression: none`` (``gzip_chunks``: on the event loop, a
    piece at a time)."""

    def __init__(self, config: ExportConfig) -> None:
        base = config.endpoint
        self._urls: dict[Signal, str] = {
            "traces": config.traces_url or f"{base}/v1/traces",
            "metrics": config.metrics_url or f"{base}/v1/metrics",
        }
        self._headers = {**config.headers, "content-type": "application/x-protobuf"}
        self._gzip = config.compression == "gzip"
        if self._gzip:
            self._headers["content-encoding"] = "gzip"
        self._session: aiohttp.ClientSession | None = None

    async def send(self, signal: Signal, body: bytes, timeout_s: float) -> None:
        import aiohttp

        if self._gzip:
            body = await gzip_chunks(body)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=None)
            )
        try:
            async with self._session.post(
                self._urls[signal], data=body, headers=self._headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                await resp.read()
                if not 200 <= resp.status < 300:
                    raise ExportFailed(f"HTTP {resp.status}", retryable=resp.status in _RETRYABLE_STATUS)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ExportFailed(f"{type(exc).__name__}: {exc}", retryable=True) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


_GZIP_CHUNK = 64 * 1024  # the most compressed between two turns of the event loop (isal: ~10 µs; zlib: ~0.1 ms)


class _Packer(Protocol):
    def compress(self, data: bytes | memoryview, /) -> bytes: ...
    def flush(self) -> bytes: ...


# python-isal (ISA-L's deflate, already a dependency for CRC-32): a batch of 512 spans in ~0.09 ms, against ~0.7-1.5
# ms at zlib's fastest level, and smaller (tests/unit/test_otlp_export.py inflates its output with the stdlib)
_compressobj: Callable[..., _Packer]
try:
    from isal.isal_zlib import compressobj as _compressobj

    GZIP = "isal"
except ImportError:  # pragma: no cover - isal is a dependency; zlib stays the fallback
    _compressobj = zlib.compressobj
    GZIP = "zlib"


def _packer() -> _Packer:
    # level 1 (spans are mostly their attributes' repeated keys: already ~25 times smaller); wbits 31: the gzip
    # wrapper; memLevel 9 (zlib: ~20 % quicker than its default 8)
    return _compressobj(1, zlib.DEFLATED, 31, 9)


def gzip_body(body: bytes) -> bytes:
    """``body`` as a gzip member."""
    packer = _packer()
    return packer.compress(body) + packer.flush()


async def gzip_chunks(body: bytes) -> bytes:
    """``gzip_body`` on the event loop, ``_GZIP_CHUNK`` at a time with a turn of the loop between pieces: no request
    waits behind more than a piece. (A worker thread was measured dearer: the handing over of the GIL
    between the loop's thread and the worker's cost the served gateway more than the compression itself.)"""
    packer = _packer()
    view = memoryview(body)
    parts = []
    for start in range(0, len(body), _GZIP_CHUNK):
        parts.append(packer.compress(view[start : start + _GZIP_CHUNK]))
        await asyncio.sleep(0)
    parts.append(packer.flush())
    return b"".join(parts)


_GRPC_METHODS: dict[Signal, str] = {
    "traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
}


class GrpcTransport:
    """OTLP/gRPC: the collector's ``Export`` methods called with the serialized requests (grpcio, the ``otel``
    extra); ``https://`` endpoints over TLS."""

    def __init__(self, config: ExportConfig) -> None:
        parts = urlsplit(config.endpoint)
        self._target = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 4317)}"
        self._secure = parts.scheme == "https"
        self._metadata = tuple(config.headers.items())
        self._gzip = config.compression == "gzip"
        self._channel: Any = None
        self._calls: dict[Signal, Any] = {}

    async def send(self, signal: Signal, body: bytes, timeout_s: float) -> None:
        import grpc

        if self._channel is None:
            self._channel = (
                grpc.aio.secure_channel(self._target, grpc.ssl_channel_credentials())
                if self._secure
                else grpc.aio.insecure_channel(self._target)
            )
        call = self._calls.get(signal)
        if call is None:  # no serializers: the body is the serialized request already
            call = self._calls[signal] = self._channel.unary_unary(_GRPC_METHODS[signal])
        try:
            compression = grpc.Compression.Gzip if self._gzip else grpc.Compression.NoCompression
            await call(body, timeout=timeout_s, metadata=self._metadata, compression=compression)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            retryable = code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.ABORTED,
            )
            raise ExportFailed(f"gRPC {code.name}: {exc.details()}", retryable=retryable) from None

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.close()


def transport_for(config: ExportConfig) -> Transport:
    return GrpcTransport(config) if config.protocol == "grpc" else HttpTransport(config)


class ExportCounters:
    """``gateway_otlp_*``: what became of the spans and exports (in the gateway's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge

        self.spans = Counter(
            "gateway_otlp_spans",
            "The gateway's own spans by what became of them: exported (the collector took them), failed (their "
            "export failed), dropped (the queue was full, or they were still queued at shutdown).",
            ["outcome"],
            registry=registry,
        )
        self.exports = Counter(
            "gateway_otlp_exports",
            "OTLP exports by signal and outcome (ok, failed).",
            ["signal", "outcome"],
            registry=registry,
        )
        self.queue = Gauge(
            "gateway_otlp_queue", "Spans waiting to be exported.", registry=registry, multiprocess_mode="livesum"
        )


class OtlpExporter:
    """Spans and GenAI metrics to one collector, in the background."""

    def __init__(self, config: ExportConfig, counters: ExportCounters, transport: Transport | None = None) -> None:
        self.config = config
        self._counters = counters
        self._transport = transport or transport_for(config)
        self._queue: deque[bytes] = deque()  # encode_span's: no object per attribute held
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.metrics_source: GenAiMetrics | None = None  # the tracer's histograms, when metrics are exported
        self.before_export: Callable[[], None] | None = None  # the tracer's: what it set aside, built now
        self._logged_at = -_LOG_EVERY_S
        self._unlogged = 0
        self._exported = counters.spans.labels("exported")
        self._dropped = counters.spans.labels("dropped")
        self._failed = counters.spans.labels("failed")

    def submit(self, spans: list[bytes]) -> None:
        queue = self._queue
        room = self.config.max_queue - len(queue)
        if room < len(spans):
            self._dropped.inc(len(spans) - max(room, 0))
            spans = spans[: max(room, 0)]
        queue.extend(spans)
        if len(queue) >= self.config.max_batch:
            self._wake.set()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if not self._tasks:
            if self.config.traces:
                self._tasks.append(loop.create_task(self._spans_loop()))
            if self.config.metrics:
                self._tasks.append(loop.create_task(self._metrics_loop()))

    async def _spans_loop(self) -> None:
        delay = self.config.schedule_delay_s
        while True:
            if len(self._queue) < self.config.max_batch:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
            self._flush()
            while self._queue:
                await self._export_spans()
                if len(self._queue) < self.config.max_batch:
                    break

    async def _metrics_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.metrics_interval_s)
            await self.export_metrics()

    async def _export_spans(self) -> None:
        queue, batch = self._queue, []
        for _ in range(min(len(queue), self.config.max_batch)):
            batch.append(queue.popleft())
        self._counters.queue.set(len(queue))
        try:
            body = encode_traces(self.config.resource, SCOPE, _version(), batch)
        except (TypeError, ValueError) as exc:  # an attribute OTLP cannot carry (a bug): the batch is counted failed
            self._failed.inc(len(batch))
            self._report("traces", f"a span could not be encoded: {exc}")
            return
        try:
            sent = await self._send("traces", body)
        except asyncio.CancelledError:  # the shutdown's time ran out with the batch in flight: counted, not lost
            self._dropped.inc(len(batch))
            raise
        if sent:
            self._exported.inc(len(batch))
        else:
            self._failed.inc(len(batch))

    def _flush(self) -> None:
        if self.before_export is not None:
            self.before_export()

    async def export_metrics(self) -> None:
        source = self.metrics_source
        if source is None:
            return
        self._flush()
        histograms = source.collect()
        if histograms:
            await self._send("metrics", encode_metrics(self.config.resource, SCOPE, _version(), histograms))

    async def _send(self, signal: Signal, body: bytes) -> bool:
        timeout = self.config.timeout_s
        deadline = time.monotonic() + timeout
        for attempt in (1, 2):
            try:
                await self._transport.send(signal, body, max(0.1, deadline - time.monotonic()))
            except ExportFailed as exc:
                retry = exc.retryable and attempt == 1 and time.monotonic() + _RETRY_AFTER_S < deadline
                if retry:
                    await asyncio.sleep(_RETRY_AFTER_S)
                    continue
                self._counters.exports.labels(signal, "failed").inc()
                self._report(signal, str(exc))
                return False
            self._counters.exports.labels(signal, "ok").inc()
            return True
        return False  # pragma: no cover - the loop returns

    def _report(self, signal: Signal, error: str) -> None:
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            log.warning(
                "telemetry.otlp: %d exports to %s failed since the last report (last: %s %s)",
                self._unlogged,
                self.config.endpoint,
                signal,
                error,
            )
            self._logged_at, self._unlogged = now, 0

    async def aclose(self, within: float = 5.0) -> None:
        """Stop; what is queued (and the metrics as they stand) is sent first, within ``within`` seconds."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        started = bool(self._tasks)
        self._tasks = []
        self._flush()
        if started:
            try:
                async with asyncio.timeout(within):
                    while self._queue and self.config.traces:
                        await self._export_spans()
                    if self.config.metrics:
                        await self.export_metrics()
            except TimeoutError:
                pass
        if self._queue:
            self._dropped.inc(len(self._queue))
            self._queue.clear()
        await self._transport.aclose()


def _version() -> str:
    from gateway import __version__

    return __version__

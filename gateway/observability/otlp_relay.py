"""Claude Code's OpenTelemetry telemetry (``POST /v1/metrics|logs|traces``), relayed to the operator's collectors.

``OtlpRelay.submit`` (what a route calls) never awaits and never raises: the body joins the queue of each collector
whose ``signals`` take it, at most ``telemetry.max_queue`` bodies each (over it the body is dropped for that
collector, counted), so a dead collector never holds up another. Background tasks POST each body unchanged (the same
bytes, Content-Type and Content-Encoding) to ``{url}/v1/{signal}`` with the collector's configured headers and
nothing else of the client's (a route hands over those two headers only: the bearer never leaves), within
``timeout_s``. A failure (connect error, timeout, any status but 2xx) is counted and logged at most once a minute per
collector; only a connection that got no answer is retried, once (OTLP is at least once).

Beyond Anthropic's gateway, which only relays, metrics bodies are also read, off the request path, by
``ClaudeCodeReader``: protobuf ``ExportMetricsServiceRequest`` or OTLP/JSON, gzip or not, with ``opentelemetry-proto``
(imported when the first body is read; without it metrics are only relayed, and a warning says so once). Claude
Code's own counters as https://code.claude.com/docs/en/monitoring-usage documents them (``claude_code.session.count``,
``.lines_of_code.count`` with ``type`` added/removed, ``.pull_request.count``, ``.commit.count``, ``.cost.usage`` in
USD, ``.token.usage`` with ``type`` input/output/cacheRead/cacheCreation, ``.active_time.total`` in seconds) become
``gateway_claude_code_*_total`` by the *signed-in* user and team, never the user the attributes claim. A delta point
adds its value; a cumulative point adds its increase over the last value of its series (user, metric, the resource's,
scope's and point's attributes, start time): a series' first point adds its whole value, a value below the last is a
restart and adds itself. Claude Code exports deltas unless ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` says
otherwise; a cumulative series read by several workers or replicas is counted by each from its first point, so
deltas are the choice behind more than one process. A body that cannot be read is relayed all the same, and counted.

The collectors are reached with aiohttp, not the providers' seam (``gateway.wire.upstream``): that seam logs every
connect failure, and a dead collector is logged once a minute, not once a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple
from urllib.parse import urlsplit

from gateway.observability.metrics import TelemetryMetrics
from gateway.settings import TelemetrySettings, TelemetryTarget

if TYPE_CHECKING:
    import aiohttp
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from prometheus_client import Counter

__all__ = ["SIGNALS", "ClaudeCodeReader", "OtlpRelay", "Signal", "decode_metrics"]

Signal = Literal["metrics", "logs", "traces"]
SIGNALS: tuple[Signal, ...] = ("metrics", "logs", "traces")

log = logging.getLogger("gateway")

_LOG_EVERY_S = 60.0
_SENDERS = 4  # bodies in flight per collector
_MAX_DECODED_BYTES = 32 * 1024 * 1024  # a gzip body inflating past this is not read (it is relayed all the same)
_MAX_SERIES = 100_000  # cumulative series remembered (the oldest is forgotten first)
_DELTA, _CUMULATIVE = 1, 2  # opentelemetry.proto.metrics.v1.AggregationTemporality
_OWN_HEADERS = frozenset({"content-type", "content-encoding", "content-length", "host", "transfer-encoding"})

# metric name -> (TelemetryMetrics attribute, the values its ``type`` label takes: others become "other"; None: no type)
_COUNTED: dict[str, tuple[str, frozenset[str] | None]] = {
    "claude_code.lines_of_code.count": ("lines", frozenset({"added", "removed"})),
    "claude_code.session.count": ("sessions", None),
    "claude_code.commit.count": ("commits", None),
    "claude_code.pull_request.count": ("pull_requests", None),
    "claude_code.cost.usage": ("cost", None),
    "claude_code.token.usage": ("tokens", frozenset({"input", "output", "cacheRead", "cacheCreation"})),
    "claude_code.active_time.total": ("active", None),
}


class _Body(NamedTuple):
    signal: Signal
    body: bytes
    content_type: str
    content_encoding: str | None
    user: str
    team: str


def decode_metrics(body: bytes, content_type: str, content_encoding: str | None) -> ExportMetricsServiceRequest:
    """An OTLP/HTTP metrics body as the message it holds; ``ValueError`` when it is not one (``ImportError`` when
    ``opentelemetry-proto`` is not installed)."""
    from google.protobuf import json_format  # type: ignore[import-untyped,unused-ignore]
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped,unused-ignore]
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = inflater.decompress(body, _MAX_DECODED_BYTES)
        except zlib.error as exc:
            raise ValueError(f"broken gzip: {exc}") from None
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError("a gzip body cut short or inflating too far")
    elif encoding != "identity":
        raise ValueError(f"content-encoding {encoding!r}")
    media = content_type.split(";", 1)[0].strip().lower()
    request = ExportMetricsServiceRequest()
    try:
        if media in ("application/x-protobuf", "application/protobuf"):
            request.ParseFromString(body)
        elif media == "application/json":
            json_format.Parse(body.decode("utf-8"), request, ignore_unknown_fields=True)
        else:
            raise ValueError(f"content-type {media!r}")
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not an OTLP metrics request: {type(exc).__name__}") from None
    return request


def _attributes(attributes: Iterable[Any]) -> tuple[tuple[str, bytes], ...]:
    """A series' attributes as a key: each value serialised, so every kind of AnyValue compares."""
    return tuple(sorted((kv.key, kv.value.SerializeToString(deterministic=True)) for kv in attributes))


def _type_label(attributes: Iterable[Any], allowed: frozenset[str]) -> str:
    for kv in attributes:
        if kv.key == "type":
            value = str(kv.value.string_value)
            return value if value in allowed else "other"
    return "other"


class ClaudeCodeReader:
    """Claude Code's ``claude_code.*`` counters read from OTLP metrics bodies into ``TelemetryMetrics``, per signed-in
    user and team. Sans-IO: ``read`` is called by the relay's background task (or a test) with one body at a time."""

    def __init__(self, metrics: TelemetryMetrics, *, max_series: int = _MAX_SERIES) -> None:
        self._metrics = metrics
        self._last: OrderedDict[tuple[Any, ...], float] = OrderedDict()  # cumulative series -> its last value
        self._max_series = max_series
        self.available: bool | None = None  # whether opentelemetry-proto is installed (None: not yet known)
        self._read = metrics.metrics_read.labels("read")
        self._undecodable = metrics.metrics_read.labels("undecodable")

    def read(self, body: bytes, content_type: str, content_encoding: str | None, *, user: str, team: str) -> bool:
        """Count the body's Claude Code metrics for ``user``; False when it could not be read (counted)."""
        try:
            request = decode_metrics(body, content_type, content_encoding)
        except ImportError:
            if self.available is None:
                log.warning("telemetry: opentelemetry-proto is not installed: metrics are relayed, not read")
            self.available = False
            return False
        except ValueError:
            self.available = True
            self._undecodable.inc()
            return False
        self.available = True
        for resource_metrics in request.resource_metrics:
            resource = _attributes(resource_metrics.resource.attributes)
            for scope_metrics in resource_metrics.scope_metrics:
                scope = (scope_metrics.scope.name, scope_metrics.scope.version)
                for metric in scope_metrics.metrics:
                    counted = _COUNTED.get(metric.name)
                    if counted is not None and metric.WhichOneof("data") == "sum":
                        self._count(metric, counted, (user, team, resource, scope), user, team)
        self._read.inc()
        return True

    def _count(
        self, metric: Any, counted: tuple[str, frozenset[str] | None], series: tuple[Any, ...], user: str, team: str
    ) -> None:
        attr, types = counted
        counter: Counter = getattr(self._metrics, attr)
        temporality = metric.sum.aggregation_temporality
        for point in metric.sum.data_points:
            kind = point.WhichOneof("value")
            value = float(point.as_double if kind == "as_double" else point.as_int if kind == "as_int" else math.nan)
            if not math.isfinite(value):
                continue
            if temporality == _CUMULATIVE:
                key = (*series, metric.name, _attributes(point.attributes), point.start_time_unix_nano)
                last = self._last.pop(key, None)
                self._last[key] = value
                if len(self._last) > self._max_series:
                    self._last.popitem(last=False)
                increase = value if last is None or value < last else value - last
            elif temporality == _DELTA:
                increase = value
            else:  # unspecified: neither rule is known to hold
                continue
            if increase > 0:
                child = (
                    counter.labels(user, team)
                    if types is None
                    else counter.labels(user, team, _type_label(point.attributes, types))
                )
                child.inc(increase)


class _Lane:
    """One collector: its queue and the tasks that send from it."""

    __slots__ = ("base", "headers", "inflight", "logged_at", "name", "queue", "target", "tasks", "unlogged", "wake")

    def __init__(self, target: TelemetryTarget) -> None:
        self.target = target
        self.base = target.url.rstrip("/")
        self.headers = {k: v for k, v in target.headers.items() if k.lower() not in _OWN_HEADERS}
        parts = urlsplit(target.url)
        self.name = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
        self.queue: deque[_Body] = deque()
        self.wake = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.inflight = 0
        self.unlogged = 0
        self.logged_at = -math.inf


class OtlpRelay:
    """The telemetry relay of one process (like the usage ledger, it outlives a config reload: ``use_settings``
    changes its collectors). ``start`` and ``aclose`` are called on the serving loop; ``submit`` from the routes."""

    def __init__(
        self,
        settings: TelemetrySettings,
        metrics: TelemetryMetrics,
        *,
        read_metrics: bool = True,
        retry_delay_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._reader = ClaudeCodeReader(metrics) if read_metrics else None
        self._unread: deque[_Body] = deque()
        self._unread_wake = asyncio.Event()
        self._idle = asyncio.Event()  # set when a body is done and nothing else is queued or in flight
        self._retry_delay = retry_delay_s
        self._clock = clock
        self._lanes: list[_Lane] = [_Lane(t) for t in settings.forward_to]
        self._pending = 0
        self._session: aiohttp.ClientSession | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._outcomes = {
            (s, o): metrics.bodies.labels(s, o) for s in SIGNALS for o in ("forwarded", "dropped", "failed")
        }
        self._unread_dropped = metrics.metrics_read.labels("dropped")

    @property
    def depth(self) -> int:
        """Bodies waiting: in the collectors' queues and the reader's."""
        return self._pending

    def submit(
        self, signal: Signal, body: bytes, content_type: str, content_encoding: str | None, user: str, team: str
    ) -> None:
        """Queue a body for each collector that takes ``signal`` (and, for metrics, for the reader); never awaits,
        never raises. Over ``max_queue`` (or once closed) it is dropped for that collector, and counted."""
        try:
            item = _Body(signal, body, content_type, content_encoding, user, team)
            limit = self._settings.max_queue
            for lane in self._lanes:
                if signal not in lane.target.signals:
                    continue
                if self._closed or len(lane.queue) >= limit:
                    self._outcomes[(signal, "dropped")].inc()
                    continue
                lane.queue.append(item)
                self._pending += 1
                lane.wake.set()
            if signal == "metrics" and self._reader is not None and self._reader.available is not False:
                if self._closed or len(self._unread) >= limit:
                    self._unread_dropped.inc()
                else:
                    self._unread.append(item)
                    self._pending += 1
                    self._unread_wake.set()
            self._metrics.queue.set(self._pending)
        except Exception:  # pragma: no cover - nothing above raises; a route must never feel the relay
            log.exception("telemetry: a body could not be queued")

    def use_settings(self, settings: TelemetrySettings) -> None:
        """A reloaded config: a collector configured as before keeps its queue; a new one gets its own; one no
        longer configured stops, and what it still had queued is dropped (counted)."""
        kept: list[_Lane] = []
        old = list(self._lanes)
        for target in settings.forward_to:
            lane = next((lane for lane in old if lane.target == target), None)
            if lane is not None:
                old.remove(lane)
            else:
                lane = _Lane(target)
                if self._started:
                    self._start_lane(lane)
            kept.append(lane)
        self._settings = settings
        self._lanes = kept
        for lane in old:
            self._stop_lane(lane)

    def start(self) -> None:
        """Start the background tasks on the running loop (bodies submitted before wait for them)."""
        if self._started:
            return
        self._started = True
        for lane in self._lanes:
            self._start_lane(lane)
        if self._reader is not None:
            self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    async def aclose(self, within: float = 5.0) -> None:
        """Stop taking bodies, relay (and read) what is queued for at most ``within`` seconds, then stop; what is
        left is dropped and counted."""
        self._closed = True
        if self._started:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    while self._busy():
                        self._idle.clear()
                        await self._idle.wait()
        for lane in self._lanes:
            self._stop_lane(lane)
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        self._pending -= len(self._unread)
        self._unread.clear()
        await asyncio.gather(*(t for lane in self._lanes for t in lane.tasks), return_exceptions=True)
        self._metrics.queue.set(self._pending)
        if self._session is not None:
            await self._session.close()

    def _busy(self) -> bool:
        return bool(self._unread) or any(lane.queue or lane.inflight for lane in self._lanes)

    def _settled(self) -> None:
        if self._closed and not self._busy():
            self._idle.set()

    def _start_lane(self, lane: _Lane) -> None:
        loop = asyncio.get_running_loop()
        lane.tasks = [loop.create_task(self._send_loop(lane)) for _ in range(_SENDERS)]

    def _stop_lane(self, lane: _Lane) -> None:
        for task in lane.tasks:
            task.cancel()
        for item in lane.queue:
            self._outcomes[(item.signal, "dropped")].inc()
        self._pending -= len(lane.queue)
        lane.queue.clear()
        self._metrics.queue.set(self._pending)

    async def _read_loop(self) -> None:
        reader = self._reader
        assert reader is not None
        while True:
            while not self._unread:
                self._unread_wake.clear()
                await self._unread_wake.wait()
            item = self._unread.popleft()
            self._pending -= 1
            self._metrics.queue.set(self._pending)
            try:
                reader.read(item.body, item.content_type, item.content_encoding, user=item.user, team=item.team)
            except Exception:  # pragma: no cover - a reader bug must not stop the relay
                log.exception("telemetry: reading a metrics body failed")
            if reader.available is False:
                self._pending -= len(self._unread)
                self._unread.clear()
            self._settled()
            await asyncio.sleep(0)  # one body at a time, between the loop's other work

    async def _send_loop(self, lane: _Lane) -> None:
        while True:
            while not lane.queue:
                lane.wake.clear()
                await lane.wake.wait()
            item = lane.queue.popleft()
            self._pending -= 1
            self._metrics.queue.set(self._pending)
            lane.inflight += 1
            try:
                outcome = await self._deliver(lane, item)
            except asyncio.CancelledError:  # the collector was removed, or the drain's time ran out
                self._outcomes[(item.signal, "dropped")].inc()
                raise
            finally:
                lane.inflight -= 1
            self._outcomes[(item.signal, outcome)].inc()
            self._settled()

    async def _deliver(self, lane: _Lane, item: _Body) -> Literal["forwarded", "failed"]:
        import aiohttp

        url = f"{lane.base}/v1/{item.signal}"
        headers = {**lane.headers, "Content-Type": item.content_type}
        if item.content_encoding:
            headers["Content-Encoding"] = item.content_encoding
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout_s)
        for attempt in (0, 1):
            try:
                session = self._client()
                async with session.post(
                    url, data=item.body, headers=headers, timeout=timeout, allow_redirects=False
                ) as resp:
                    await resp.read()
                    if 200 <= resp.status < 300:
                        return "forwarded"
                    error = f"HTTP {resp.status}"
            except TimeoutError:
                error = f"no answer within {self._settings.timeout_s:g} s"
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                if attempt == 0:  # nothing was answered: once more, on a fresh connection
                    await asyncio.sleep(self._retry_delay)
                    continue
            except Exception as exc:  # anything else (a header aiohttp refuses, ...): a failure, never a dead task
                error = f"{type(exc).__name__}: {exc}"
            break
        self._failed(lane, error)
        return "failed"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(),  # nothing of one collector's answers in the next request
                skip_auto_headers=("User-Agent",),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    def _failed(self, lane: _Lane, error: str) -> None:
        lane.unlogged += 1
        now = self._clock()
        if now - lane.logged_at >= _LOG_EVERY_S:  # once a minute per collector, however many bodies fail
            log.warning(
                "telemetry: %d bodies could not be relayed to %s since the last report (last: %s)",
                lane.unlogged,
                lane.name,
                error,
            )
            lane.logged_at = now
            lane.unlogged = 0

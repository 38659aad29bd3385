"""One place a finished request's usage goes out from: a ``Finished`` record, built once by the tally, handed to
each sink — the Prometheus metrics, the access line, the span, the usage ledger (and the limiter's usage
later). Each sink is one small class with one method; the fold stays pure (``gateway.wire.usage_fold``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from adapters.profiles import metric_feature
from gateway.governance.store import LedgerRow
from gateway.wire.events import Usage
from gateway.wire.usage_fold import total_tokens

if TYPE_CHECKING:
    from gateway.governance.ledger import Ledger
    from gateway.observability.metrics import Metrics

__all__ = [
    "AccessLogSink",
    "Finished",
    "KeyMetricsSink",
    "LedgerSink",
    "LimiterSink",
    "MetricsSink",
    "Recorder",
    "Sink",
    "access_line",
    "emit_access_line",
    "write_access_lines_to",
]

access_log = logging.getLogger("gateway.access")
"""One JSON line per request at INFO (``messages-gateway serve`` logs INFO; silence it with the logger's level)."""
_encode_line = msgspec.json.Encoder().encode
_gateway_log = logging.getLogger("gateway")
ACCESS_LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The format ``write_access_lines_to`` writes access lines in (``messages-gateway serve``'s log format)."""


class _DirectLines:
    """The access line written straight to the stream of the one handler ``messages-gateway serve`` sets up, in
    that handler's format and under its lock: the same bytes as ``access_log.info`` without a ``LogRecord``, the
    logger chain and the formatter (16 µs per line, measured, against 4). Used only while the logging set-up is
    still that one handler on the root logger and nothing else that could see the record: any handler or filter
    added anywhere on the way (a test's ``caplog``, an operator's config) sends lines through ``logging`` again."""

    __slots__ = ("handler", "second", "stamp")

    def __init__(self, handler: logging.StreamHandler[Any]) -> None:
        self.handler = handler
        self.second = -1
        self.stamp = ""

    def usable(self) -> bool:
        handler = self.handler
        return (
            logging.root.handlers == [handler]
            and not access_log.handlers
            and not _gateway_log.handlers
            and not handler.filters
            and not logging.root.filters
            and not access_log.filters
            and access_log.propagate
            and _gateway_log.propagate
            and handler.level <= logging.INFO
        )

    def write(self, line: str) -> bool:
        now = time.time()
        second = int(now)
        if second != self.second:  # logging's asctime: local time, then ",%03d" milliseconds
            self.second, self.stamp = second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        text = f"{self.stamp},{int((now - second) * 1000):03d} INFO gateway.access: {line}\n"
        handler = self.handler
        try:
            with handler.lock:  # type: ignore[union-attr]
                handler.stream.write(text)
                handler.stream.flush()
        except Exception:
            return False
        return True


_direct: _DirectLines | None = None


def write_access_lines_to(handler: logging.StreamHandler[Any] | None) -> None:
    """Write access lines straight to ``handler``'s stream (a ``StreamHandler`` in ``ACCESS_LINE_FORMAT``, the
    root logger's only one) while the logging set-up stays that; ``None``: through ``logging`` always."""
    global _direct
    formatter = handler.formatter if handler is not None else None
    usable = (
        handler is not None
        and type(handler) is logging.StreamHandler
        and formatter is not None
        and type(formatter) is logging.Formatter
        and formatter._fmt == ACCESS_LINE_FORMAT
        and formatter.datefmt is None
        and formatter.default_msec_format == "%s,%03d"
        and formatter.converter is time.localtime
    )
    _direct = _DirectLines(handler) if usable and handler is not None else None


def emit_access_line(line: str) -> None:
    """One request's access line at INFO on ``gateway.access`` (the caller has checked the level)."""
    direct = _direct
    if direct is not None and direct.usable() and direct.write(line):
        return
    access_log.info("%s", line)


class Finished(msgspec.Struct, kw_only=True):
    """Everything recorded of one request, once, when it ends."""

    started_at: float  # UTC seconds since the epoch
    request_id: str
    upstream_request_id: str
    method: str
    path: str
    key_name: str
    team: str
    user: str
    session_id: str
    agent_id: str
    alias: str
    provider: str
    model: str  # the upstream model id asked for (pricing, the access line, the ledger)
    model_label: str  # the configured target model, the metrics' label ("" when the client's name is forwarded)
    stream: bool
    routed: bool  # a Messages request that reached routing (token counts did not: they have no ledger row)
    outcome: str
    status: int
    usage: Usage
    cost_usd: float | None
    ttft: float | None  # seconds
    duration: float  # seconds
    attempts: int
    timed: bool  # observe the latency histograms (not for a token count)
    dropped: tuple[str, ...] = ()  # betas and fields the serving provider was not sent (adapters.profiles)
    lease: Any = None  # its hold on rate limits and budgets (gateway.governance.limits.Lease), settled by LimiterSink
    limit: str = ""  # the limit that refused it ("team budget", "key requests_per_minute"…); "" for none
    response_id: str = ""  # the answer's message id, model and stop reason, as the provider said them
    response_model: str = ""
    finish_reason: str = ""
    upstream_wait: float | None = None  # seconds from the serving attempt's start to the provider's first event
    panic: bool = False  # routed in panic mode (every target's breaker open)
    trace: Any = None  # its spans' ids and attempts (gateway.observability.tracing.RequestTrace) when traced


class Sink(Protocol):
    def record(self, finished: Finished) -> None: ...


class MetricsSink:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def record(self, finished: Finished) -> None:
        self._metrics.record_request(
            alias=finished.alias,
            provider=finished.provider,
            model=finished.model_label,
            outcome=finished.outcome,
            usage=finished.usage,
            duration=finished.duration,
            time_to_first_token=finished.ttft,
            timed=finished.timed,
            cost=finished.cost_usd,
        )
        for feature in finished.dropped:
            self._metrics.dropped_features.labels(finished.provider, metric_feature(feature)).inc()


class LimiterSink:
    """The tokens and cost a request ended with, counted against the limits that admitted it."""

    def record(self, finished: Finished) -> None:
        lease = finished.lease
        if lease is not None:
            lease.settle(total_tokens(finished.usage), finished.cost_usd)


class KeyMetricsSink:
    """Requests, tokens and cost per client key and/or team (``metrics.labels``), in their own families so the
    default series stay as they are."""

    def __init__(self, metrics: Metrics, labels: Sequence[str]) -> None:
        from prometheus_client import Counter

        self._labels = tuple(labels)
        registry = metrics.registry
        names = list(self._labels)
        self.requests = Counter(
            "gateway_key_requests", "Requests per client key/team.", [*names, "outcome"], registry=registry
        )
        self.tokens = Counter("gateway_key_tokens", "Tokens per client key/team.", [*names, "type"], registry=registry)
        self.cost = Counter("gateway_key_cost_usd", "Cost per client key/team.", names, registry=registry)

    def record(self, finished: Finished) -> None:
        values = [finished.key_name if label == "key" else finished.team for label in self._labels]
        self.requests.labels(*values, finished.outcome).inc()
        usage = finished.usage
        for kind, count in (
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_read", usage.cache_read_input_tokens),
            ("cache_creation", usage.cache_creation_input_tokens),
        ):
            if count:
                self.tokens.labels(*values, kind).inc(count)
        if finished.cost_usd:
            self.cost.labels(*values).inc(finished.cost_usd)


def access_line(
    *,
    request_id: str,
    method: str,
    path: str,
    status: int,
    outcome: str,
    duration: float,
    session_id: str = "",
    agent_id: str = "",
    upstream_request_id: str = "",
    alias: str = "",
    provider: str = "",
    model: str = "",
    ttft: float | None = None,
    usage: Usage | None = None,
    attempts: int = 0,
    key: str = "",
    dropped: tuple[str, ...] = (),
    limit: str = "",
) -> str:
    """One request as one JSON object, the same keys for every route: no prompt text, no keys (``key`` is the
    name of the client key that authenticated the request, "" for none), nothing from the client but its model
    name, method, path and Claude Code's session and agent ids. ``limit``: the limit that refused the request —
    its rule's scope and the limit's kind (``"key requests_per_minute"``, ``"team tokens_per_minute"``,
    ``"key max_inflight"``, ``"key budget"``, ``"team budget"``; ``"server max_inflight"`` for a request shed at
    ``server.max_inflight``), "" for a request no limit refused."""
    usage = usage or Usage()
    return _encode_line(
        {
            "request_id": request_id,
            "upstream_request_id": upstream_request_id,
            "key": key,
            "method": method,
            "path": path,
            "alias": alias,
            "provider": provider,
            "model": model,
            "status": status,
            "outcome": outcome,
            "ttft_ms": None if ttft is None else round(ttft * 1000, 2),
            "duration_ms": round(duration * 1000, 2),
            "input_tokens": usage.input_tokens or 0,
            "output_tokens": usage.output_tokens or 0,
            "cache_read_input_tokens": usage.cache_read_input_tokens or 0,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens or 0,
            "attempts": attempts,
            "session_id": session_id,
            "agent_id": agent_id,
            "dropped": dropped,  # a tuple: encoded as the array it is, nothing copied
            "limit": limit,
        }
    ).decode()


class AccessLogSink:
    def record(self, finished: Finished) -> None:
        if access_log.isEnabledFor(logging.INFO):
            f = finished
            emit_access_line(
                access_line(
                    request_id=f.request_id,
                    method=f.method,
                    path=f.path,
                    status=f.status,
                    outcome=f.outcome,
                    duration=f.duration,
                    session_id=f.session_id,
                    agent_id=f.agent_id,
                    upstream_request_id=f.upstream_request_id,
                    alias=f.alias,
                    provider=f.provider,
                    model=f.model,
                    ttft=f.ttft,
                    usage=f.usage,
                    attempts=f.attempts,
                    key=f.key_name,
                    dropped=f.dropped,
                    limit=f.limit,
                ),
            )


class Tracer(Protocol):
    """What writes a traced request's spans and GenAI metrics (``gateway.observability.tracing.Tracer``): its sink
    (``tracing.SpanSink``) is one of the recorder's."""

    def sink(self) -> Sink: ...


def ledger_row(f: Finished) -> LedgerRow:
    usage = f.usage
    return LedgerRow(
        started_ms=int(f.started_at * 1000),
        request_id=f.request_id,
        upstream_request_id=f.upstream_request_id,
        key_name=f.key_name,
        team=f.team,
        user=f.user,
        session_id=f.session_id,
        agent_id=f.agent_id,
        alias=f.alias,
        provider=f.provider,
        model=f.model,
        stream=f.stream,
        outcome=f.outcome,
        status=f.status,
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_input_tokens=usage.cache_read_input_tokens or 0,
        cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
        cost_usd=f.cost_usd,
        ttft_ms=None if f.ttft is None else round(f.ttft * 1000, 3),
        duration_ms=round(f.duration * 1000, 3),
        attempts=f.attempts,
    )


class LedgerSink:
    """A row for every request sent to a provider (at least one attempt), whatever its outcome. A request the
    gateway refused itself — a model the key may not use (403), a rate limit or budget (429), a body it could not
    read (400) — has no row: it spent nothing, and a refused key could otherwise write hundreds of rows a second;
    it is in ``gateway_requests_total`` and on the access line. Token counts have none either."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def record(self, finished: Finished) -> None:
        if finished.routed and finished.attempts:
            self.ledger.add(ledger_row(finished))


class Recorder:
    """The sinks a finished request goes to, in order."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = tuple(sinks)

    @classmethod
    def default(
        cls,
        metrics: Metrics,
        ledger: Ledger | None = None,
        *,
        key_labels: Sequence[str] = (),
        tracer: Tracer | None = None,
    ) -> Recorder:
        sinks: list[Sink] = [MetricsSink(metrics), AccessLogSink(), LimiterSink()]
        if tracer is not None:
            sinks.append(tracer.sink())
        if key_labels:
            sinks.append(KeyMetricsSink(metrics, key_labels))
        if ledger is not None:
            sinks.append(LedgerSink(ledger))
        return cls(sinks)

    def record(self, finished: Finished) -> None:
        for sink in self.sinks:
            sink.record(finished)

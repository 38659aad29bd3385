"""Prometheus metrics, one registry per app (so tests and several apps in a process stay apart)."""

from __future__ import annotations

import os
from bisect import bisect_left
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.governance.pricing import Prices
from gateway.settings import Price
from gateway.wire.events import Usage

__all__ = ["CONTENT_TYPE", "TOKEN_TYPES", "Metrics", "TelemetryMetrics", "bump", "multiprocess_dir"]

# The ``type`` label of gateway_tokens_total, in the order _Children holds them.
TOKEN_TYPES = ("input", "output", "cache_read", "cache_creation")


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class PlainValue:
    """prometheus-client's ``MutexValue`` without its lock: a metric's value in a process whose metrics only its
    event loop's thread writes (the gateway's: every ``inc`` and ``observe`` happens on the loop; worker threads
    sign, hash and read files, and touch no metric). Half the cost of an update (a counter's ``inc`` 0.34 → 0.17 µs,
    a histogram's ``observe`` 0.78 → 0.40 µs, measured), and ~10 updates a request; the exposition is the same
    bytes (``tests/unit/test_metrics_values.py``). Not used with several workers: prometheus-client's multiprocess
    value then writes to its files."""

    _multiprocess = False
    __slots__ = ("_exemplar", "_value")

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._value = 0.0
        self._exemplar: object = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: object) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> object:
        return self._exemplar


def use_plain_values() -> None:
    """The metrics made from now on hold ``PlainValue`` s, unless prometheus-client is in multiprocess mode."""
    from prometheus_client import values

    if not multiprocess_dir() and not values.ValueClass.__dict__.get("_multiprocess", False):
        values.ValueClass = PlainValue


def multiprocess_dir() -> str | None:
    """prometheus-client's multiprocess directory: set by the CLI for ``workers > 1`` (each worker writes its
    values there; a scrape merges them), or by the operator."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        use_plain_values()
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[str, str, str, str], _Children] = {}
        self._added: dict[tuple[str, str], Any] = {}
        r = self.registry
        self.requests = Counter(
            "gateway_requests", "Requests by outcome.", ["alias", "provider", "model", "outcome"], registry=r
        )
        self.tokens = Counter(
            "gateway_tokens",
            "Tokens by type (usage folded from the stream).",
            ["alias", "provider", "model", "type"],
            registry=r,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Whole request duration.",
            ["alias", "provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time to the first content delta.",
            ["alias", "provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # with several workers (multiprocess mode) the gauges are summed over the live worker processes
        self.inflight = Gauge(
            "gateway_inflight_requests", "Requests being served.", registry=r, multiprocess_mode="livesum"
        )
        self.violations = Counter(
            "gateway_stream_violations", "Upstream streams that broke the protocol.", ["provider", "rule"], registry=r
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors", "Errors from providers.", ["provider", "error_type"], registry=r
        )
        self.unknown_events = Counter(
            "gateway_unknown_events",
            "Events of types this gateway does not know, passed through.",
            ["provider", "type"],
            registry=r,
        )

        self.fallbacks = Counter(
            "gateway_fallbacks",
            "Requests handed to another target before their first byte.",
            ["alias", "from", "to", "reason"],
            registry=r,
        )
        self.panics = Counter(
            "gateway_breaker_panics",
            "Requests sent to a target whose breaker is open or that is throttled, because no target of the alias "
            "was available (the panic rule: the provider answers, never the gateway in its place).",
            ["alias"],
            registry=r,
        )
        self.added_latency = Histogram(
            "gateway_added_latency_seconds",
            "Time to first byte added by the gateway over the provider's own (retries and fallbacks included).",
            ["alias", "provider"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.cost = Counter(
            "gateway_cost_usd",
            "Cost of the tokens used, from the config's pricing table.",
            ["alias", "provider", "model"],
            registry=r,
        )
        self.ledger_rows_total = Counter(
            "gateway_ledger_rows",
            "Usage ledger rows by what became of them: written to the store, retried after a failed write "
            "(counted per attempt), dropped (the queue was full by rows or bytes, or still held rows at shutdown).",
            ["result"],
            registry=r,
        )
        self.ledger_queue_rows = Gauge(
            "gateway_ledger_queue_rows",
            "Usage ledger rows waiting to be written.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.dropped_features = Counter(
            "gateway_dropped_features",
            "Betas (beta:<name>) and body fields (field:<name>, tool_field:<name>) a request's provider was not sent "
            "because it does not take them (adapters/profiles.py), by provider.",
            ["provider", "feature"],
            registry=r,
        )
        self.client_ids_dropped = Counter(
            "gateway_client_ids_dropped",
            "x-claude-code-session-id and x-claude-code-agent-id values dropped at the edge (not 1-128 printable "
            "ASCII characters): the request is served without them.",
            ["header"],
            registry=r,
        )
        self.pools = PoolMetrics(r)
        self.limited = Counter(
            "gateway_limited",
            "Requests refused by a rate limit or budget, by limit and by the scope it was set on (key, team).",
            ["limit", "scope"],
            registry=r,
        )
        self.limit_store_errors = Counter(
            "gateway_limit_store_errors",
            "Admissions and settlements that could not reach the shared rate-limit store (limits.redis_url).",
            registry=r,
        )
        # collectors that read this process's live state at scrape time (the breakers): per worker
        self.live = CollectorRegistry()
        self.pricing = Prices(builtin=False)  # none until the gateway sets its config's (set_pricing)
        self.usage_mismatch = Counter(
            "gateway_usage_mismatch",
            "Streams whose provider-side token counts (Bedrock invocation metrics) disagree with the stream's usage.",
            ["provider"],
            registry=r,
        )

    def record_request(
        self,
        *,
        alias: str,
        provider: str,
        model: str,
        outcome: str,
        usage: Usage,
        duration: float,
        time_to_first_token: float | None,
        timed: bool = True,
        cost: float | None = None,
    ) -> None:
        """One request's outcome and tokens; ``timed``: observe its duration and time to first token too (not
        for a token count, whose latency is not a message's). ``model`` is a label, so it is the configured
        target model ("" for a target that forwards the client's name: a name a client invents never becomes a
        label value); ``cost``: its price in US dollars (``gateway.wire.usage_fold.cost_of`` of the model actually
        asked for), None without one."""
        children = self._children.get((alias, provider, model, outcome))
        if children is None:
            children = self._children[(alias, provider, model, outcome)] = _Children(
                self, alias, provider, model, outcome
            )
        timed = bool(provider) and timed
        if children.plain is not None:  # the same updates on the same values, without prometheus-client's wrappers
            _record_plain(children.plain, usage, duration if timed else None, time_to_first_token if timed else None)
        else:
            children.requests.inc()
            if usage.input_tokens:
                children.input.inc(usage.input_tokens)
            if usage.output_tokens:
                children.output.inc(usage.output_tokens)
            if usage.cache_read_input_tokens:
                children.cache_read.inc(usage.cache_read_input_tokens)
            if usage.cache_creation_input_tokens:
                children.cache_creation.inc(usage.cache_creation_input_tokens)
            if timed:
                children.duration.observe(duration)
                if time_to_first_token is not None:
                    children.ttft.observe(time_to_first_token)
        if cost:
            self.cost.labels(alias, provider, model).inc(cost)

    def added_latency_of(self, alias: str, provider: str) -> Any:
        """The labelled child of ``gateway_added_latency_seconds`` (looked up once: ``labels()`` is not free)."""
        child = self._added.get((alias, provider))
        if child is None:
            child = self._added[(alias, provider)] = self.added_latency.labels(alias, provider)
        return child

    def ledger_rows(self, result: str, n: int) -> None:
        self.ledger_rows_total.labels(result).inc(n)

    def ledger_queue(self, depth: int) -> None:
        """The ledger's queue depth (set at every row queued): its ``PlainValue`` directly, as ``bump`` does."""
        value = self.ledger_queue_rows._value
        if type(value) is PlainValue:
            value._value = float(depth)
        else:
            self.ledger_queue_rows.set(depth)

    def set_pricing(self, pricing: dict[str, Price], *, builtin: bool = True) -> None:
        """The config's ``pricing`` and ``builtin_pricing`` (gateway.governance.pricing): at start-up and on reload."""
        self.pricing = Prices(pricing, builtin=builtin)

    def price_of(self, model: str) -> Price | None:
        return self.pricing.price_of(model)

    def render(self) -> bytes:
        """The exposition: every worker's counters, histograms and gauges merged (multiprocess mode, when the
        CLI serves several workers), else this process's; then this process's live collectors."""
        return generate_latest(self._merged() or self.registry) + generate_latest(self.live)

    @staticmethod
    def _merged() -> CollectorRegistry | None:
        if not multiprocess_dir():
            return None
        from prometheus_client import multiprocess

        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        return merged

    def totals(self, counter: Counter, key: str) -> dict[tuple[str, str, str], dict[str, float]]:
        """A counter's current values as ``{(alias, provider, model): {<label key>: value}}``: what the status
        page shows, read from the same samples ``/metrics`` renders."""
        out: dict[tuple[str, str, str], dict[str, float]] = {}
        merged = self._merged()
        families = counter.collect() if merged is None else [f for f in merged.collect() if f.name == counter._name]
        for family in families:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    labels = sample.labels
                    row = out.setdefault((labels["alias"], labels["provider"], labels["model"]), {})
                    row[labels[key]] = row.get(labels[key], 0.0) + sample.value
        return out


class _Children:
    """The labelled children one kind of request writes to, looked up once (``labels()`` is not free); and, when
    they hold ``PlainValue`` s, those values themselves (``plain``): a request's ~8 updates then skip
    prometheus-client's wrappers (a call, the observable check and, for a histogram, a linear walk of its bounds)
    and add to the same values, so ``/metrics`` is the same bytes (``tests/unit/test_metrics_values.py``)."""

    __slots__ = ("cache_creation", "cache_read", "duration", "input", "output", "plain", "requests", "ttft")

    def __init__(self, metrics: Metrics, alias: str, provider: str, model: str, outcome: str) -> None:
        self.requests = metrics.requests.labels(alias, provider, model, outcome)
        tokens = metrics.tokens
        self.input, self.output, self.cache_read, self.cache_creation = (
            tokens.labels(alias, provider, model, token_type) for token_type in TOKEN_TYPES
        )
        self.duration = metrics.duration.labels(alias, provider)
        self.ttft = metrics.ttft.labels(alias, provider)
        self.plain: _Plain | None = None
        counters = (self.requests, self.input, self.output, self.cache_read, self.cache_creation)
        if all(type(c._value) is PlainValue for c in counters) and all(
            type(h._sum) is PlainValue for h in (self.duration, self.ttft)
        ):
            self.plain = (*(c._value for c in counters), _plain_histogram(self.duration), _plain_histogram(self.ttft))


_PlainHistogram = tuple[PlainValue, list[PlainValue], tuple[float, ...]]
"""A histogram child's sum, its (non-cumulative) buckets and their upper bounds, as prometheus-client keeps them."""
_Plain = tuple[PlainValue, PlainValue, PlainValue, PlainValue, PlainValue, _PlainHistogram, _PlainHistogram]
"""The requests counter, the four token counters (TOKEN_TYPES' order) and the duration and TTFT histograms."""


def _plain_histogram(child: Any) -> _PlainHistogram:
    return child._sum, child._buckets, tuple(child._upper_bounds)


def _add(value: PlainValue, amount: float) -> None:
    """``Counter.inc``'s check, then the add."""
    if amount < 0:
        raise ValueError("Counters can only be incremented by non-negative amounts.")
    value._value += amount


def _record_plain(plain: _Plain, usage: Usage, duration: float | None, ttft: float | None) -> None:
    """``record_request``'s updates on its children's ``PlainValue`` s (``duration`` None: not timed)."""
    requests, input_, output, cache_read, cache_creation, duration_h, ttft_h = plain
    requests._value += 1.0
    if usage.input_tokens:
        _add(input_, usage.input_tokens)
    if usage.output_tokens:
        _add(output, usage.output_tokens)
    if usage.cache_read_input_tokens:
        _add(cache_read, usage.cache_read_input_tokens)
    if usage.cache_creation_input_tokens:
        _add(cache_creation, usage.cache_creation_input_tokens)
    if duration is not None:
        _observe(duration_h, duration)
        if ttft is not None:
            _observe(ttft_h, ttft)


def _observe(histogram: _PlainHistogram, amount: float) -> None:
    """``Histogram.observe``: the sum, and the first bucket whose bound is at least ``amount`` (found by bisection;
    none for a NaN, as prometheus-client's walk finds none)."""
    total, buckets, bounds = histogram
    total._value += amount
    i = bisect_left(bounds, amount)
    if i < len(bounds) and amount <= bounds[i]:
        buckets[i]._value += 1.0


class TelemetryMetrics:
    """The CLI's telemetry relayed to the collectors (``gateway.observability.otlp_relay``) and Claude Code's own
    ``claude_code.*`` metrics read from it, per signed-in user and team, in an app's registry. One per registry (made
    beside the relay, which is process-wide like the ledger): a second in the same registry is refused by it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.bodies = Counter(
            "gateway_telemetry_bodies",
            "OTLP bodies (POST /v1/metrics|logs|traces) by signal and what became of them: forwarded (the collector "
            "answered 2xx) and failed (a connect error, a timeout or another status) count a body once per collector "
            "it was for; dropped counts a body the full queue refused, or one still queued at shutdown, once per "
            "collector too.",
            ["signal", "outcome"],
            registry=r,
        )
        self.queue = Gauge(
            "gateway_telemetry_queue_bodies",
            "OTLP bodies waiting to be relayed to a collector or read for Claude Code's metrics.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.metrics_read = Counter(
            "gateway_telemetry_metrics_read",
            "OTLP metrics bodies read for Claude Code's own metrics, by result: read, undecodable (not OTLP protobuf "
            "or JSON, or a broken gzip: relayed all the same), dropped (the reader's queue was full).",
            ["result"],
            registry=r,
        )
        self.lines = Counter(
            "gateway_claude_code_lines",
            "Lines of code Claude Code added or removed (claude_code.lines_of_code.count), by signed-in user.",
            ["user", "team", "type"],
            registry=r,
        )
        self.sessions = Counter(
            "gateway_claude_code_sessions",
            "Claude Code sessions started (claude_code.session.count), by signed-in user.",
            ["user", "team"],
            registry=r,
        )
        self.commits = Counter(
            "gateway_claude_code_commits",
            "Git commits Claude Code made (claude_code.commit.count), by signed-in user.",
            ["user", "team"],
            registry=r,
        )
        self.pull_requests = Counter(
            "gateway_claude_code_pull_requests",
            "Pull requests Claude Code opened (claude_code.pull_request.count), by signed-in user.",
            ["user", "team"],
            registry=r,
        )
        self.cost = Counter(
            "gateway_claude_code_cost_usd",
            "Cost Claude Code estimated for its sessions, in US dollars (claude_code.cost.usage), by signed-in user.",
            ["user", "team"],
            registry=r,
        )
        self.tokens = Counter(
            "gateway_claude_code_tokens",
            "Tokens Claude Code counted (claude_code.token.usage), by signed-in user and type (input, output, "
            "cacheRead, cacheCreation).",
            ["user", "team", "type"],
            registry=r,
        )
        self.active = Counter(
            "gateway_claude_code_active_seconds",
            "Time Claude Code was in active use, in seconds (claude_code.active_time.total), by signed-in user.",
            ["user", "team"],
            registry=r,
        )


class PoolMetrics:
    """The h1 client's connection pools (``gateway.wire.upstream.PoolObserver``), per origin (``scheme://host:port``:
    providers that share an origin share its pool): connections open and idle, made and reused."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._connections = Gauge(
            "gateway_upstream_connections",
            "Connections of the upstream client (h1) to providers' origins: open (idle ones included), and idle.",
            ["origin", "state"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._created = Counter(
            "gateway_upstream_connections_created",
            "Connections the upstream client (h1) opened (a TLS handshake each, for https).",
            ["origin"],
            registry=registry,
        )
        self._reused = Counter(
            "gateway_upstream_connections_reused",
            "Requests the upstream client (h1) sent on a pooled keep-alive connection.",
            ["origin"],
            registry=registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Any, Any, Any, Any]] = {}

    def _of(self, key: tuple[str, str, int]) -> tuple[Any, Any, Any, Any]:
        found = self._children.get(key)
        if found is None:
            scheme, host, port = key
            origin = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
            found = self._children[key] = (
                self._connections.labels(origin, "open"),
                self._connections.labels(origin, "idle"),
                self._created.labels(origin),
                self._reused.labels(origin),
            )
        return found

    def opened(self, key: tuple[str, str, int], conn: Any) -> None:
        opened, _, created, _ = self._of(key)
        opened.inc()
        created.inc()
        conn.lost = opened.dec

    def idle(self, key: tuple[str, str, int], change: int) -> None:
        bump(self._of(key)[1], change)

    def reused(self, key: tuple[str, str, int]) -> None:
        bump(self._of(key)[3], 1)


def bump(child: Any, amount: float) -> None:
    """A gauge's or counter's labelled child changed by ``amount`` (a counter's never negative): its ``PlainValue``
    directly, past the wrapper's call and observable check (the same bytes at a scrape), else through it."""
    value = child._value
    if type(value) is PlainValue:
        value._value += amount
    else:
        child.inc(amount)

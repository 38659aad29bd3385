"""The process's state, beneath the HTTP layer: the current ``Runtime``, the metrics, the upstream client, the
streams in flight; reload, watch and drain. The ASGI application (``gateway.http.app``) and every route handler take
a ``Gateway``; nothing here knows of HTTP routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters import Adapter
from gateway.context import DRAIN_CANCEL, RequestContext
from gateway.governance import limits
from gateway.governance.identity import Identity, IssuedKeys
from gateway.governance.keys import ClientKey
from gateway.governance.ledger import Ledger
from gateway.governance.limits import Counters, Limiter, RedisCounters, SeedPlan, budget_periods, seed_budgets
from gateway.governance.sessions import Sessions
from gateway.governance.signin_store import SigninStore, signin_store
from gateway.governance.spend_limits import SpendLimits
from gateway.governance.store import StoreError, open_store
from gateway.observability.metrics import Metrics, TelemetryMetrics
from gateway.observability.otlp_export import ExportCounters, OtlpExporter, export_config
from gateway.observability.otlp_relay import OtlpRelay
from gateway.observability.recording import Recorder
from gateway.observability.tracing import Tracer
from gateway.observability.usage import Outcome
from gateway.routing.resilience import Resilience
from gateway.routing.table import RouteTable
from gateway.runtime import Runtime, build_runtime
from gateway.settings import ConfigError, Settings, StoreSettings, load_settings
from gateway.wire.upstream import H1Client, HttpClient

if TYPE_CHECKING:
    from gateway.governance.signin import SignIn

__all__ = ["BreakerCollector", "Gateway"]


def _limiter(settings: Settings, metrics: Metrics) -> Limiter:
    defaults = settings.limits
    counters: Counters | None = None
    if defaults is not None and defaults.redis_url:
        counters = RedisCounters(defaults.redis_url)
    return Limiter(
        on_refusal=lambda limit, scope: metrics.limited.labels(limit, scope).inc(),
        counters=counters,
        on_store_error=defaults.on_store_error if defaults is not None else "allow",
        store_errors=metrics.limit_store_errors.inc,
    )


def _tracer(settings: Settings, metrics: Metrics) -> Tracer | None:
    """The gateway's tracing and GenAI metrics, when ``telemetry.otlp``, ``server.tracing`` or the ``OTEL_*``
    variables turn them on (``gateway.observability.otlp_export.export_config``)."""
    config = export_config(settings)
    if config is None:
        return None
    exporter = OtlpExporter(config, ExportCounters(metrics.registry))
    return Tracer(
        exporter,
        sample_ratio=config.sample_ratio,
        traces=config.traces,
        metrics=config.metrics,
        capture_content=config.capture_content,
    )


def _ledger(settings: StoreSettings, metrics: Metrics) -> Ledger | None:
    if not settings.enabled:
        return None
    store = open_store(settings.resolved_url())
    return Ledger(
        store,
        metrics,
        flush_interval_s=settings.flush_interval_s,
        max_queue=settings.max_queue_rows,
        max_queue_bytes=settings.max_queue_bytes,
        retention_days=settings.retention_days,
    )


log = logging.getLogger("gateway")


class Gateway:
    """The process's state: the current ``Runtime`` (one config's keys, routes, adapters…), the metrics, the
    upstream client and the streams in flight. A request takes ``runtime`` once and keeps it to its end;
    ``reload`` builds a new runtime (off the event loop, from ``watch`` and SIGHUP) and swaps it in with one
    assignment, and the replaced one closes its adapters when its last request ends. ``begin_drain`` (SIGTERM)
    ends the streams still running after the drain timeout with an ``error``.
    """

    def __init__(
        self,
        settings: Settings,
        client: HttpClient,
        metrics: Metrics,
        resilience: Resilience | None = None,
        *,
        config_path: str | Path | None = None,
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.config_path = Path(config_path) if config_path is not None else None
        self._fixed_resilience = resilience
        self.streams: dict[asyncio.Task[Any], RequestContext] = {}  # in-flight streaming requests, for the drain
        self.draining = False
        self.active = 0  # Messages-route requests in this process, for server.max_inflight
        self.reloads = 0
        self._tasks: set[asyncio.Task[Any]] = set()  # reloads started by SIGHUP: referenced until they end
        self._retired: set[Runtime] = set()  # replaced runtimes whose adapters are not closed yet
        if isinstance(client, H1Client):  # its pools in /metrics, sized for what this process serves at once
            client.metrics = metrics.pools
            if settings.server.max_inflight is not None:
                client.pool = settings.server.max_inflight
        self.runtime = build_runtime(settings, client, metrics, resilience)
        self._adopt(self.runtime)
        metrics.live.register(BreakerCollector(self))
        self.ledger = _ledger(settings.store, metrics)  # process-wide: a reload does not move it
        # the gateway's own traces and GenAI metrics over OTLP (process-wide, read at start-up), when configured
        self.tracer = _tracer(settings, metrics)
        # where every finished request is recorded
        self.recorder = Recorder.default(metrics, self.ledger, key_labels=settings.metrics.labels, tracer=self.tracer)
        self._ledger_task: asyncio.Task[None] | None = None
        self._reseed_task: asyncio.Task[None] | None = None
        # process-wide counters (a reload changes the limits, not what has been counted against them); in Redis
        # when `limits.redis_url` names one (read at start-up), shared by every worker and replica
        self.limiter = _limiter(settings, metrics)
        # who a request is: the runtime's config keys, the keys issued at run time (in the ledger's store), JWTs
        issued = IssuedKeys(self.ledger.ready) if self.ledger is not None else None
        if issued is not None:
            issued.use_teams(settings.teams)
        # Claude Code's /login: its state in the same store; the bearers checked by `identity`
        self._signin_store: SigninStore | None = None
        sessions = Sessions(self.signin_store) if self.ledger is not None else None
        self.identity = Identity(issued, sessions)
        # the spend limits set at run time (/v1/organizations/spend_limits), in the same store, enforced by the limiter
        self.spend_limits = (
            SpendLimits(self.ledger.ready, self.limiter, teams=lambda: self.settings.teams)
            if self.ledger is not None
            else None
        )
        self._spend_task: asyncio.Task[None] | None = None
        self._signin: SignIn | None = None  # built on first use
        self._keys_task: asyncio.Task[None] | None = None
        self._sessions_task: asyncio.Task[None] | None = None
        # Claude Code's telemetry (POST /v1/metrics|logs|traces), relayed to the collectors off the request path
        self.relay = OtlpRelay(settings.telemetry, TelemetryMetrics(metrics.registry))

    async def signin_store(self) -> SigninStore:
        """Sign-in's state, beside the ledger (``StoreError`` when the store is off or cannot be opened)."""
        if self._signin_store is None:
            if self.ledger is None:
                raise StoreError("the store is off (store.enabled: false)")
            self._signin_store = signin_store(await self.ledger.ready())
        return self._signin_store

    @property
    def signin(self) -> SignIn | None:
        """The device flow of the running ``login`` config (None: sign-in is off), rebuilt when a reload changes it."""
        login = self.runtime.settings.login
        sessions = self.identity.sessions
        if login is None or sessions is None:
            return None
        if self._signin is None or self._signin.settings != login:
            from gateway.governance.signin import SignIn  # Authlib and PyJWT only where sign-in is on

            self._signin = SignIn(login, self.signin_store, sessions)
        return self._signin

    # the current runtime's parts, for the routes that read one of them once (a request that reads several
    # takes `runtime` itself)
    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    @property
    def keys(self) -> list[ClientKey]:
        return self.runtime.keys

    @property
    def admin_keys(self) -> list[ClientKey]:
        return self.runtime.admin_keys

    @property
    def routes(self) -> RouteTable:
        return self.runtime.routes

    @property
    def resilience(self) -> Resilience:
        return self.runtime.resilience

    @property
    def adapters(self) -> dict[str, Adapter]:
        return self.runtime.adapters

    def _adopt(self, runtime: Runtime) -> None:
        self.metrics.set_pricing(runtime.settings.pricing, builtin=runtime.settings.builtin_pricing)

    def _load(self, path: Path) -> Runtime | None:
        """The new runtime for ``path``, or None (a broken file, or adapters that cannot be built: logged, the
        running config stays). Blocking: ``reload_async`` runs it in a worker thread."""
        try:
            settings = load_settings(path)
        except ConfigError as exc:
            log.error("config reload rejected, keeping the running config: %s", exc)
            return None
        try:
            return build_runtime(settings, self.client, self.metrics, self._fixed_resilience)
        except Exception:  # an adapter that cannot be built (credentials, a region…): the running table stays
            log.exception("config reload from %s failed, keeping the running config", path)
            return None

    def _swap(self, runtime: Runtime, path: Path) -> None:
        old, settings = self.runtime, runtime.settings
        if settings.auth.open and old.keys:
            # the file asks for it (a file without keys must say `open: true`): applied, but said loudly
            log.warning(
                "config reload from %s opens the gateway: it had %d keys and now serves anyone", path, len(old.keys)
            )
        server, running = settings.server, old.settings.server
        if (server.host, server.port, server.workers) != (running.host, running.port, running.workers):
            log.warning("server.host/port/workers changed in %s: they take effect on restart only", path)
        if (settings.telemetry.otlp, server.tracing) != (old.settings.telemetry.otlp, running.tracing):
            log.warning("telemetry.otlp / server.tracing changed in %s: they take effect on restart only", path)
        self._adopt(runtime)
        if self.identity.issued is not None:
            self.identity.issued.use_teams(settings.teams)
        self.runtime = runtime  # one assignment: a request sees the old runtime or the new one, never a mix
        self.relay.use_settings(settings.telemetry)
        sessions = self.identity.sessions
        if sessions is not None and settings.login is not None and self._sessions_task is None:
            with contextlib.suppress(RuntimeError):  # sign-in turned on by a reload: its revocations polled too
                self._sessions_task = asyncio.get_running_loop().create_task(sessions.run())
        self._retired.add(old)
        old.retire(on_closed=self._retired.discard)  # closed, and forgotten, when its last request ends
        self.reloads += 1
        log.info(
            "config reloaded from %s: %d providers, %d model routes",
            path,
            len(settings.providers),
            len(settings.models),
        )

    def _path(self, path: str | Path | None) -> Path | None:
        chosen = path or self.config_path
        return None if chosen is None else Path(chosen)

    def reload(self, path: str | Path | None = None) -> bool:
        """Load the config again, on the calling thread; a broken file is logged and the running table stays."""
        chosen = self._path(path)
        runtime = None if chosen is None else self._load(chosen)
        if runtime is None or chosen is None:
            return False
        self._swap(runtime, chosen)
        return True

    async def reload_async(self, path: str | Path | None = None) -> bool:
        """``reload`` with the loading and building in a worker thread (they may block for milliseconds: a
        botocore session per AWS provider), the swap on the loop."""
        chosen = self._path(path)
        if chosen is None:
            return False
        runtime = await asyncio.to_thread(self._load, chosen)
        if runtime is None:
            return False
        self._swap(runtime, chosen)
        return True

    def reload_soon(self) -> None:
        """SIGHUP: a reload, off the loop, referenced until it ends."""
        task = asyncio.get_running_loop().create_task(self.reload_async())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def watch(self, interval: float = 1.0) -> None:
        """Reload when the config file's modification time or size changes."""
        if self.config_path is None:
            return
        last = _stamp(self.config_path)
        while True:
            await asyncio.sleep(interval)
            stamp = _stamp(self.config_path)
            if stamp != last:
                last = stamp
                try:
                    await self.reload_async()
                except Exception:  # whatever a reload raises, the watcher goes on watching
                    log.exception("config reload from %s failed; still watching it", self.config_path)

    def begin_drain(self, timeout: float | None = None) -> None:
        """Stop taking work (the server stops accepting); streams still running after ``timeout`` get an
        ``error`` event and end."""
        if self.draining:
            return
        self.draining = True
        timeout = self.settings.server.drain_timeout_s if timeout is None else timeout
        log.info("draining: %d streams in flight, %g s to finish", len(self.streams), timeout)
        asyncio.get_running_loop().call_later(timeout, self._end_streams)

    def _end_streams(self) -> None:
        for task, context in list(self.streams.items()):
            context.cancel_outcome = Outcome.TIMEOUT  # the drain timeout ran out
            task.cancel(DRAIN_CANCEL)

    def start(self) -> None:
        """Background work of a serving process: the ledger's writer, and the poll of the issued keys."""
        loop = asyncio.get_running_loop()
        if self.ledger is not None and self._ledger_task is None:
            self._ledger_task = loop.create_task(self.ledger.run())
        if self.identity.issued is not None and self._keys_task is None:
            self._keys_task = loop.create_task(self.identity.issued.run())
        if self.identity.sessions is not None and self.settings.login is not None and self._sessions_task is None:
            self._sessions_task = loop.create_task(self.identity.sessions.run())
        self.relay.start()
        if self.tracer is not None:
            self.tracer.exporter.start()
        if self.spend_limits is not None and self._spend_task is None:
            self._spend_task = loop.create_task(self.spend_limits.run())
        limiter = self.limiter
        budgets = bool(budget_periods(self.settings)) or self.spend_limits is not None  # (spend limits: in the store)
        if self.ledger is not None and limiter.seeding is None and budgets:
            limiter.seeding = loop.create_task(self._seed_budgets())  # a restart hands out no new budget (issue 33)
            if isinstance(limiter.counters, RedisCounters) and self._reseed_task is None:
                self._reseed_task = loop.create_task(self._reseed_budgets())  # and a Redis that lost them neither

    async def _seed_budgets(self, *, quiet: bool = False) -> None:
        assert self.ledger is not None
        try:
            store = await self.ledger.ready()
            plans: list[SeedPlan] = []
            if self.spend_limits is not None:
                with contextlib.suppress(StoreError):  # the limits in force, so their spend is seeded too
                    await self.spend_limits.refresh()
                plans = self.spend_limits.seed_plans()
            seeded = await seed_budgets(self.limiter, self.settings, store, plans=plans)
        except Exception as exc:  # the store (or Redis) is down: budgets count from what is counted
            if not quiet:
                log.warning("budgets: the ledger's spend could not be seeded (%s); budgets count from now", exc)
            return
        if not quiet:
            log.info("budgets: %d spend counters seeded from the ledger", seeded)

    async def _reseed_budgets(self) -> None:
        """Every ``RESEED_S``: the ledger's spend raised into Redis again (never lowered), so a Redis flushed or
        failed over gets its budgets back within that long, not at the next window."""
        while True:
            await asyncio.sleep(limits.RESEED_S)
            await self._seed_budgets(quiet=True)

    async def aclose(self) -> None:
        seeding = self.limiter.seeding if isinstance(self.limiter.seeding, asyncio.Task) else None
        tasks = (self._keys_task, self._sessions_task, self._spend_task, self._ledger_task, seeding, self._reseed_task)
        for background in tasks:
            if background is not None:
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
        await self.relay.aclose(within=5.0)
        if self.tracer is not None:  # the spans still queued, and the metrics as they stand, go first
            await self.tracer.exporter.aclose(within=5.0)
        if self.ledger is not None:  # what is queued is written before the process goes
            await self.ledger.aclose(within=max(5.0, self.settings.server.drain_timeout_s))
        await self.limiter.aclose()
        for task in list(self._tasks):
            task.cancel()
        for runtime in [*self._retired, self.runtime]:
            runtime.retire()
            await runtime.closed()
        await self.client.aclose()


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_mtime, stat.st_size)


_STATE_VALUE = {"closed": 0.0, "half_open": 1.0, "open": 2.0}


class BreakerCollector:
    """``gateway_target_state{alias,provider,model}`` (0 closed, 1 half-open, 2 open) and
    ``gateway_target_inflight``, read from the live route table at scrape time (so a reload shows at once)."""

    def __init__(self, gw: Gateway) -> None:
        self._gw = gw

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["alias", "provider", "model"]
        state = GaugeMetricFamily(
            "gateway_target_state", "Circuit breaker: 0 closed, 1 half-open, 2 open.", labels=labels
        )
        inflight = GaugeMetricFamily("gateway_target_inflight", "Requests in flight per target.", labels=labels)
        now = self._gw.resilience.clock()
        for route in self._gw.routes.all_routes():
            for target in route.targets:
                values = [route.alias, target.provider, target.model or ""]
                state.add_metric(values, _STATE_VALUE[target.health.state(now)])
                inflight.add_metric(values, float(target.health.inflight))
        yield state
        yield inflight

"""The telemetry relay (``gateway.observability.otlp_relay``) against real HTTP collectors on 127.0.0.1 (aiohttp
servers that keep the bytes as they arrived): bodies byte for byte with their content headers and the collector's
own headers, never the client's bearer; signals per collector; a full queue, a dead collector and a hanging one;
Claude Code's ``claude_code.*`` counters read from protobuf, JSON and gzip bodies (cumulative and delta, two users),
and from what the OpenTelemetry SDK's own OTLP/HTTP exporter sends."""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from google.protobuf import json_format  # type: ignore[import-untyped,unused-ignore]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client import CollectorRegistry

from gateway.observability.metrics import TelemetryMetrics
from gateway.observability.otlp_relay import ClaudeCodeReader, OtlpRelay
from gateway.settings import TelemetrySettings, TelemetryTarget

CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA


# --- a collector ------------------------------------------------------------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Collector:
    """An OTLP/HTTP collector that records each request as it arrived (its body not inflated)."""

    status: int = 200
    hang: asyncio.Event | None = None  # answer only once it is set
    drop_first: bool = False  # close the first connection without an answer
    seen: list[Seen] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    answered: int = 0
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(Seen(request.path, {k.lower(): v for k, v in request.headers.items()}, await request.read()))
        self.arrived.set()
        if self.drop_first and len(self.seen) == 1:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if self.hang is not None:
            await self.hang.wait()
        self.answered += 1
        return web.Response(status=self.status)

    def bodies(self, path: str) -> list[bytes]:
        return [s.body for s in self.seen if s.path == path]


@asynccontextmanager
async def serving(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handler)
    runner = web.AppRunner(app, auto_decompress=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def collector(**kwargs: Any) -> AsyncIterator[Collector]:
    c = Collector(**kwargs)
    async with serving(c.handle) as url:
        c.url = url
        try:
            yield c
        finally:
            if c.hang is not None:
                c.hang.set()


def relay_for(*targets: TelemetryTarget, **settings: Any) -> tuple[OtlpRelay, CollectorRegistry]:
    registry = CollectorRegistry()
    relay = OtlpRelay(
        TelemetrySettings(forward_to=list(targets), **settings), TelemetryMetrics(registry), retry_delay_s=0.01
    )
    return relay, registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def until(check: Callable[[], bool], within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, "not within the time"
        await asyncio.sleep(0.005)


# --- OTLP metrics bodies ----------------------------------------------------------------------------------------


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def export(
    points: dict[str, list[tuple[float, dict[str, str]]]],
    *,
    temporality: metrics_pb2.AggregationTemporality.ValueType,
    session: str = "s1",
    start: int = 1_000,
    claimed_user: str = "someone-else@example.com",
) -> ExportMetricsServiceRequest:
    """An export request of Claude Code's shape: one resource, one scope, a monotonic sum per metric."""
    metrics = []
    for name, values in points.items():
        data_points = []
        for value, attributes in values:
            attrs = [kv("session.id", session), kv("user.email", claimed_user)]
            attrs += [kv(k, v) for k, v in attributes.items()]
            point = metrics_pb2.NumberDataPoint(attributes=attrs, start_time_unix_nano=start, time_unix_nano=start + 1)
            if isinstance(value, int):
                point.as_int = value
            else:
                point.as_double = value
            data_points.append(point)
        metrics.append(
            metrics_pb2.Metric(
                name=name,
                sum=metrics_pb2.Sum(data_points=data_points, aggregation_temporality=temporality, is_monotonic=True),
            )
        )
    resource = Resource(attributes=[kv("service.name", "claude-code"), kv("service.version", "2.1.0")])
    scope = metrics_pb2.ScopeMetrics(scope=InstrumentationScope(name="com.anthropic.claude_code"), metrics=metrics)
    return ExportMetricsServiceRequest(
        resource_metrics=[metrics_pb2.ResourceMetrics(resource=resource, scope_metrics=[scope])]
    )


PROTOBUF = "application/x-protobuf"


# --- relaying ---------------------------------------------------------------------------------------------------


def test_bodies_are_relayed_unchanged_with_the_collectors_headers_and_only_the_signals_it_takes() -> None:
    async def main() -> None:
        async with collector() as every, collector() as logs_only:
            relay, registry = relay_for(
                TelemetryTarget(url=every.url, headers={"x-api-key": "k-every", "Content-Type": "text/plain"}),
                TelemetryTarget(
                    url=logs_only.url + "/otlp/", headers={"Authorization": "Basic b3A="}, signals=["logs"]
                ),
            )
            relay.start()
            metrics_body = gzip.compress(
                export({"claude_code.session.count": [(1, {})]}, temporality=DELTA).SerializeToString()
            )
            relay.submit("metrics", metrics_body, PROTOBUF, "gzip", "alice", "red")
            relay.submit("logs", b"\x0a\x00logs-bytes", PROTOBUF, None, "alice", "red")
            relay.submit("traces", b'{"resourceSpans": []}', "application/json", None, "alice", "red")
            await relay.aclose()

        assert every.bodies("/v1/metrics") == [metrics_body]
        assert every.bodies("/v1/logs") == [b"\x0a\x00logs-bytes"]
        assert every.bodies("/v1/traces") == [b'{"resourceSpans": []}']
        by_path = {s.path: s.headers for s in every.seen}
        assert by_path["/v1/metrics"]["content-type"] == PROTOBUF
        assert by_path["/v1/metrics"]["content-encoding"] == "gzip"
        assert by_path["/v1/traces"]["content-type"] == "application/json"
        assert "content-encoding" not in by_path["/v1/logs"]
        for headers in by_path.values():
            assert headers["x-api-key"] == "k-every"
            assert "authorization" not in headers
        # the second collector: its base path, its own Authorization, logs only
        assert [(s.path, s.body) for s in logs_only.seen] == [("/otlp/v1/logs", b"\x0a\x00logs-bytes")]
        assert logs_only.seen[0].headers["authorization"] == "Basic b3A="

        assert sample(registry, "gateway_telemetry_bodies_total", signal="metrics", outcome="forwarded") == 1
        assert sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="forwarded") == 2
        assert sample(registry, "gateway_telemetry_bodies_total", signal="traces", outcome="forwarded") == 1
        assert sample(registry, "gateway_telemetry_queue_bodies") == 0
        # read on the way, by the signed-in user
        assert sample(registry, "gateway_claude_code_sessions_total", user="alice", team="red") == 1

    asyncio.run(main())


def test_a_full_queue_drops_and_counts_and_the_rest_is_relayed() -> None:
    async def main() -> None:
        async with collector() as c:
            relay, registry = relay_for(TelemetryTarget(url=c.url), max_queue=2)
            for i in range(5):  # not started yet: nothing leaves the queue
                relay.submit("logs", b"body-%d" % i, PROTOBUF, None, "alice", "red")
            assert relay.depth == 2
            assert sample(registry, "gateway_telemetry_queue_bodies") == 2
            assert sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="dropped") == 3
            relay.start()
            await relay.aclose()
        assert sorted(c.bodies("/v1/logs")) == [b"body-0", b"body-1"]
        assert sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="forwarded") == 2
        assert sample(registry, "gateway_telemetry_queue_bodies") == 0

    asyncio.run(main())


def test_a_hanging_collector_never_holds_up_submit_and_times_out_as_a_counted_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with collector(hang=asyncio.Event()) as hung, collector() as healthy:
            relay, registry = relay_for(TelemetryTarget(url=hung.url), TelemetryTarget(url=healthy.url), timeout_s=0.5)
            relay.start()
            relay.submit("logs", b"first", PROTOBUF, None, "alice", "red")
            await hung.arrived.wait()  # the relay is waiting on the collector now
            relay.submit("logs", b"second", PROTOBUF, None, "alice", "red")  # returns at once: it never awaits
            assert hung.answered == 0 and relay.depth >= 1
            # the healthy collector is not held up by the hanging one
            await until(lambda: len(healthy.seen) == 2)
            await until(
                lambda: sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="failed") == 2
            )
            assert hung.answered == 0
            await relay.aclose()
        assert sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="forwarded") == 2

    with caplog.at_level(logging.WARNING, logger="gateway"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if "could not be relayed" in r.getMessage()]
    assert len(warnings) == 1 and "no answer within 0.5 s" in warnings[0]  # two failures, one line


def test_a_dead_collector_is_retried_once_counted_and_logged_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    now = [0.0]

    async def main() -> CollectorRegistry:
        registry = CollectorRegistry()
        relay = OtlpRelay(
            TelemetrySettings(forward_to=[TelemetryTarget(url=dead, signals=["traces"])]),
            TelemetryMetrics(registry),
            retry_delay_s=0.01,
            clock=lambda: now[0],
        )
        relay.start()
        for _ in range(3):
            relay.submit("traces", b"t", PROTOBUF, None, "alice", "red")
        await until(lambda: sample(registry, "gateway_telemetry_bodies_total", signal="traces", outcome="failed") == 3)
        now[0] = 61.0  # a minute later: the next failure is reported with the count since the last report
        relay.submit("traces", b"t", PROTOBUF, None, "alice", "red")
        await until(lambda: sample(registry, "gateway_telemetry_bodies_total", signal="traces", outcome="failed") == 4)
        await relay.aclose()
        return registry

    with caplog.at_level(logging.WARNING, logger="gateway"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if "could not be relayed" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(f"telemetry: 1 bodies could not be relayed to {dead}")
    assert warnings[1].startswith(f"telemetry: 3 bodies could not be relayed to {dead}")
    assert "ClientConnectorError" in warnings[0]


def test_a_connection_closed_without_an_answer_is_retried_once_and_a_refusal_is_not() -> None:
    async def main() -> None:
        async with collector(drop_first=True) as flaky, collector(status=503) as refusing:
            relay, registry = relay_for(
                TelemetryTarget(url=flaky.url, signals=["logs"]), TelemetryTarget(url=refusing.url, signals=["logs"])
            )
            relay.start()
            relay.submit("logs", b"once", PROTOBUF, None, "alice", "red")
            await relay.aclose()
        assert flaky.bodies("/v1/logs") == [b"once", b"once"]  # at least once: the retry sent it again
        assert refusing.bodies("/v1/logs") == [b"once"]  # a status is an answer: never retried
        assert sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="forwarded") == 1
        assert sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="failed") == 1

    asyncio.run(main())


def test_a_reload_changes_the_collectors() -> None:
    async def main() -> None:
        async with collector() as a, collector() as b:
            relay, registry = relay_for(TelemetryTarget(url=a.url))
            relay.start()
            relay.submit("logs", b"to-a", PROTOBUF, None, "alice", "red")
            await until(lambda: len(a.seen) == 1)
            relay.use_settings(TelemetrySettings(forward_to=[TelemetryTarget(url=b.url, signals=["logs"])]))
            relay.submit("logs", b"to-b", PROTOBUF, None, "alice", "red")
            relay.submit("metrics", b"", PROTOBUF, None, "alice", "red")  # b does not take metrics
            await relay.aclose()
        assert [s.body for s in a.seen] == [b"to-a"]
        assert [s.body for s in b.seen] == [b"to-b"]
        assert sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="forwarded") == 2

    asyncio.run(main())


def test_the_drain_has_a_deadline_and_what_it_leaves_is_counted_as_dropped() -> None:
    async def main() -> None:
        async with collector(hang=asyncio.Event()) as hung:
            relay, registry = relay_for(TelemetryTarget(url=hung.url), timeout_s=30)
            relay.start()
            for i in range(6):  # four in flight (the senders of a collector), two queued
                relay.submit("logs", b"body-%d" % i, PROTOBUF, None, "alice", "red")
            await until(lambda: len(hung.seen) == 4)
            async with asyncio.timeout(5):
                await relay.aclose(within=0.1)
            assert relay.depth == 0
        assert sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="dropped") == 6
        assert sample(registry, "gateway_telemetry_queue_bodies") == 0

    asyncio.run(main())


def test_after_close_bodies_are_dropped_and_counted() -> None:
    async def main() -> None:
        async with collector() as c:
            relay, registry = relay_for(TelemetryTarget(url=c.url))
            relay.start()
            await relay.aclose()
            relay.submit("logs", b"late", PROTOBUF, None, "alice", "red")
        assert c.seen == []
        assert sample(registry, "gateway_telemetry_bodies_total", signal="logs", outcome="dropped") == 1

    asyncio.run(main())


# --- Claude Code's metrics --------------------------------------------------------------------------------------


def reader() -> tuple[ClaudeCodeReader, CollectorRegistry]:
    registry = CollectorRegistry()
    return ClaudeCodeReader(TelemetryMetrics(registry)), registry


def test_cumulative_sums_add_their_increase_and_delta_sums_their_value_per_signed_in_user() -> None:
    r, registry = reader()
    # alice's exporter is cumulative: each export repeats the running total of its series
    for tokens, added, cost, sessions in ((100, 10, 0.25, 1), (150, 14, 0.5, 1), (400, 14, 1.25, 1)):
        body = export(
            {
                "claude_code.token.usage": [(tokens, {"type": "input"}), (tokens // 10, {"type": "output"})],
                "claude_code.lines_of_code.count": [(added, {"type": "added"}), (3, {"type": "removed"})],
                "claude_code.cost.usage": [(cost, {"model": "claude-sonnet-4-5"})],
                "claude_code.session.count": [(sessions, {})],
            },
            temporality=CUMULATIVE,
        )
        assert r.read(body.SerializeToString(), PROTOBUF, None, user="alice", team="red")
    # bob's is delta: each export holds what happened since the last one
    for tokens, commits in ((30, 1), (12, 0), (8, 2)):
        body = export(
            {
                "claude_code.token.usage": [(tokens, {"type": "cacheRead"})],
                "claude_code.commit.count": [(commits, {})],
                "claude_code.pull_request.count": [(1, {})],
                "claude_code.active_time.total": [(2.5, {"type": "user"}), (1.5, {"type": "cli"})],
            },
            temporality=DELTA,
            session="s2",
        )
        assert r.read(body.SerializeToString(), PROTOBUF, None, user="bob", team="blue")

    def get(name: str, **labels: str) -> float:
        return sample(registry, f"gateway_claude_code_{name}_total", **labels)

    assert get("tokens", user="alice", team="red", type="input") == 400
    assert get("tokens", user="alice", team="red", type="output") == 40
    assert get("lines", user="alice", team="red", type="added") == 14
    assert get("lines", user="alice", team="red", type="removed") == 3
    assert get("cost_usd", user="alice", team="red") == pytest.approx(1.25)
    assert get("sessions", user="alice", team="red") == 1
    assert get("tokens", user="bob", team="blue", type="cacheRead") == 50
    assert get("commits", user="bob", team="blue") == 3
    assert get("pull_requests", user="bob", team="blue") == 3
    assert get("active_seconds", user="bob", team="blue") == pytest.approx(12.0)
    # the user the attributes claim never becomes a label
    assert get("tokens", user="someone-else@example.com", team="red", type="input") == 0
    assert sample(registry, "gateway_telemetry_metrics_read_total", result="read") == 6


def test_cumulative_series_restart_and_stay_apart() -> None:
    r, registry = reader()

    def read(value: int, *, session: str = "s1", start: int = 1_000, user: str = "alice") -> None:
        body = export(
            {"claude_code.token.usage": [(value, {"type": "output"})]},
            temporality=CUMULATIVE,
            session=session,
            start=start,
        )
        r.read(body.SerializeToString(), PROTOBUF, None, user=user, team="red")

    read(50)
    read(80)  # +30
    read(20, start=2_000)  # a new start time: a new series, counted whole
    read(25, start=2_000)  # +5
    read(10)  # lower than the last of its series: a restart, counted whole
    read(70, session="s9")  # another session of the same user: its own series
    read(70, user="carol")  # the same series' attributes from another user: carol's own
    read(70, user="carol")  # no increase
    assert sample(registry, "gateway_claude_code_tokens_total", user="alice", team="red", type="output") == (
        80 + 25 + 10 + 70
    )
    assert sample(registry, "gateway_claude_code_tokens_total", user="carol", team="red", type="output") == 70


def test_json_and_gzip_bodies_are_read_and_unknown_types_and_metrics_are_bounded() -> None:
    r, registry = reader()
    body = export(
        {
            "claude_code.token.usage": [(7, {"type": "input"}), (5, {"type": "a-label-a-client-made-up"})],
            "claude_code.code_edit_tool.decision": [(9, {"decision": "accept"})],  # not one of those counted
            "someone.elses.metric": [(1, {})],
        },
        temporality=DELTA,
    )
    as_json = json_format.MessageToJson(body).encode()
    assert b'"resourceMetrics"' in as_json
    assert r.read(as_json, "application/json; charset=utf-8", None, user="alice", team="red")
    assert r.read(gzip.compress(body.SerializeToString()), PROTOBUF, "gzip", user="alice", team="red")
    assert r.read(gzip.compress(as_json), "application/json", "gzip", user="alice", team="red")
    assert sample(registry, "gateway_claude_code_tokens_total", user="alice", team="red", type="input") == 21
    assert sample(registry, "gateway_claude_code_tokens_total", user="alice", team="red", type="other") == 15
    families = {m.name for m in registry.collect() if m.samples}
    assert not any("decision" in name or "elses" in name for name in families)


def test_undecodable_bodies_are_relayed_all_the_same_and_counted() -> None:
    broken = [
        (b"\xff\xff\xff\xff", PROTOBUF, None),  # a varint that never ends
        (b"{not json", "application/json", None),
        (b"\x1f\x8b\x08\x00broken", PROTOBUF, "gzip"),
        (gzip.compress(b"x" * 100)[:-8], PROTOBUF, "gzip"),  # cut short
        (b"", "text/plain", None),
        (b"", PROTOBUF, "br"),
    ]

    async def main() -> None:
        async with collector() as c:
            relay, registry = relay_for(TelemetryTarget(url=c.url))
            relay.start()
            for body, content_type, encoding in broken:
                relay.submit("metrics", body, content_type, encoding, "alice", "red")
            await relay.aclose()
        assert c.bodies("/v1/metrics") == [body for body, _, _ in broken]
        assert sample(registry, "gateway_telemetry_metrics_read_total", result="undecodable") == len(broken)
        assert sample(registry, "gateway_telemetry_bodies_total", signal="metrics", outcome="forwarded") == len(broken)

    asyncio.run(main())


def test_without_opentelemetry_proto_metrics_are_relayed_not_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry.proto.collector.metrics.v1.metrics_service_pb2", None)
    body = export({"claude_code.session.count": [(1, {})]}, temporality=DELTA).SerializeToString()

    async def main() -> None:
        async with collector() as c:
            relay, registry = relay_for(TelemetryTarget(url=c.url))
            relay.start()
            for _ in range(3):
                relay.submit("metrics", body, PROTOBUF, None, "alice", "red")
                await asyncio.sleep(0.01)
            await relay.aclose()
        assert c.bodies("/v1/metrics") == [body] * 3
        assert sample(registry, "gateway_claude_code_sessions_total", user="alice", team="red") == 0

    with caplog.at_level(logging.WARNING, logger="gateway"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records if "opentelemetry-proto" in r.getMessage()] == [
        "telemetry: opentelemetry-proto is not installed: metrics are relayed, not read"
    ]


# --- what a real exporter sends ---------------------------------------------------------------------------------


@dataclass
class SdkClient:
    """A Claude Code stand-in: the OpenTelemetry SDK with its OTLP/HTTP exporter, and Claude Code's counters."""

    provider: Any
    attributes: dict[str, str]
    tokens: Any
    lines: Any
    sessions: Any


def test_the_opentelemetry_sdk_exporter_is_read_exactly() -> None:
    """The SDK's OTLP/HTTP exporter (protobuf, gzip or not, cumulative or delta) sends to a gateway-like server that
    authenticates its bearer and hands the body to the relay; the relay forwards it and counts it per user."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import Counter, MeterProvider
    from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    principals = {"Bearer tok-alice": ("alice", "red"), "Bearer tok-bob": ("bob", "blue")}

    async def main() -> None:
        async with collector() as c:
            relay, registry = relay_for(TelemetryTarget(url=c.url, headers={"x-api-key": "collector-key"}))
            relay.start()

            async def ingest(request: web.Request) -> web.StreamResponse:
                user, team = principals[request.headers["Authorization"]]
                relay.submit(
                    "metrics",
                    await request.read(),
                    request.headers["Content-Type"],
                    request.headers.get("Content-Encoding"),
                    user,
                    team,
                )
                return web.Response()

            async with serving(ingest) as gateway_url:

                def client(token: str, session: str, *, delta: bool, gzipped: bool) -> SdkClient:
                    exporter = OTLPMetricExporter(
                        endpoint=f"{gateway_url}/v1/metrics",
                        headers={"Authorization": token},
                        compression=Compression.Gzip if gzipped else Compression.NoCompression,
                        preferred_temporality={Counter: AggregationTemporality.DELTA} if delta else None,
                    )
                    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
                    resource = Resource.create({"service.name": "claude-code", "service.version": "2.1.0"})
                    provider = MeterProvider(resource=resource, metric_readers=[reader])
                    meter = provider.get_meter("com.anthropic.claude_code", "2.1.0")
                    return SdkClient(
                        provider,
                        {"session.id": session, "user.email": "claimed@example.com"},
                        meter.create_counter("claude_code.token.usage", unit="tokens"),
                        meter.create_counter("claude_code.lines_of_code.count"),
                        meter.create_counter("claude_code.session.count"),
                    )

                clients = [
                    client("Bearer tok-alice", "s-a", delta=False, gzipped=True),
                    client("Bearer tok-bob", "s-b", delta=True, gzipped=False),
                ]
                try:
                    for round_ in range(3):
                        for sdk in clients:
                            attrs = sdk.attributes
                            sdk.tokens.add(100, {**attrs, "type": "input", "model": "claude-opus-4-1"})
                            sdk.tokens.add(7, {**attrs, "type": "output", "model": "claude-opus-4-1"})
                            sdk.lines.add(5, {**attrs, "type": "added"})
                            if round_ == 0:
                                sdk.sessions.add(1, attrs)
                            assert await asyncio.to_thread(sdk.provider.force_flush)
                    await until(lambda: sample(registry, "gateway_telemetry_metrics_read_total", result="read") == 6)
                finally:
                    await asyncio.gather(*(asyncio.to_thread(sdk.provider.shutdown) for sdk in clients))
            await relay.aclose()

        assert len(c.bodies("/v1/metrics")) >= 6
        gzipped = [s for s in c.seen if s.headers.get("content-encoding") == "gzip"]
        assert gzipped and all(s.headers["content-type"] == PROTOBUF for s in c.seen)
        assert all(s.headers["x-api-key"] == "collector-key" and "authorization" not in s.headers for s in c.seen)
        for user, team in (("alice", "red"), ("bob", "blue")):
            labels = {"user": user, "team": team}
            assert sample(registry, "gateway_claude_code_tokens_total", **labels, type="input") == 300
            assert sample(registry, "gateway_claude_code_tokens_total", **labels, type="output") == 21
            assert sample(registry, "gateway_claude_code_lines_total", **labels, type="added") == 15
            assert sample(registry, "gateway_claude_code_sessions_total", **labels) == 1
        assert sample(registry, "gateway_telemetry_metrics_read_total", result="undecodable") == 0

    asyncio.run(main())

"""``python -m bench.run``: direct-to-upstream and through-the-gateway, measured side by side.

The fake upstream (:mod:`bench.upstream`) and this process (the load generator, :mod:`bench.loadgen`)
run pinned to one core, the gateway to the other (``taskset``). Every scenario runs the same load
twice, first straight at the upstream, then through the gateway (and, with ``--litellm``, through
LiteLLM's proxy; with ``--tracing``, through a second gateway process exporting its OpenTelemetry spans
to :mod:`bench.otlp_sink`), and reports both with their ratio, the gateway's CPU per stream / request /
event (utime + stime of its process tree from ``/proc``), its peak RSS, and the upstream's own CPU per
request. Results go to ``bench/results/<timestamp>.{json,md}``. See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fnmatch
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import procstat
from bench.governed import IdentityProvider, governed_yaml
from bench.loadgen import Load, PhaseResult, Target, run_phase

__all__ = ["SCENARIOS", "Scenario", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HOST = "127.0.0.1"

# --- scenarios -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    kind: str  # burst | paced | json | ttft | mem | soak
    model: str
    concurrency: int
    about: str
    stream: bool = True
    warmup_s: tuple[float, float] = (1.0, 0.5)  # (full run, --quick)
    duration_s: tuple[float, float] = (8.0, 2.5)
    ramp_s: tuple[float, float] = (0.0, 0.0)
    per: str = "stream"  # the unit of the gateway's CPU figure: stream | request | event
    litellm: bool = False  # also run against LiteLLM with --litellm
    fresh: bool = False  # restart the gateway first, so its memory figures are this scenario's alone
    shape: str = "messages"  # how the clients speak: messages | bedrock (InvokeModelWithResponseStream)
    compare: tuple[str, ...] = ()  # scenarios whose gateway CPU per stream in the same run this one's is put against


def _burst(c: int) -> Scenario:
    about = f"{c} concurrent 200-delta streams, the whole stream in one upstream write"
    return Scenario(f"burst-c{c}", "burst", "bench-d200", c, about, litellm=c <= 10)  # LiteLLM: ~4 streams/s


SCENARIOS: tuple[Scenario, ...] = (
    *(_burst(c) for c in (1, 10, 50, 200)),
    Scenario(
        "paced1-c10", "paced", "bench-d200-p1", 10, "200-delta streams, 1 ms between events", per="event",
        warmup_s=(1.5, 1.0), duration_s=(8.0, 3.0),
    ),
    Scenario(
        "paced1-c50", "paced", "bench-d200-p1", 50, "200-delta streams, 1 ms between events", per="event",
        warmup_s=(1.5, 1.0), duration_s=(8.0, 3.0),
    ),
    Scenario(
        "paced5-c10", "paced", "bench-d200-p5", 10, "200-delta streams, 5 ms between events", per="event",
        warmup_s=(2.5, 1.5), duration_s=(10.0, 4.0),
    ),
    Scenario(
        "bedrock-burst-c10", "burst", "bedrock-bench-d200", 10,
        "10 concurrent 200-delta streams from Bedrock (event-stream → SSE, SigV4-signed); direct = the same SSE",
    ),
    Scenario(
        "bedrock-paced1-c50", "paced", "bedrock-bench-d200-p1", 50,
        "Bedrock 200-delta streams, 1 ms between event-stream frames", per="event",
        warmup_s=(1.5, 1.0), duration_s=(8.0, 3.0),
    ),
    Scenario(
        "bedrock-in-burst-c10", "burst", "us.anthropic.bench-d200", 10,
        "10 concurrent Bedrock-shaped streams in (InvokeModelWithResponseStream), the burst-c10 target: SSE "
        "re-encoded to event-stream; direct = the same requests to the fake's Bedrock route",
        shape="bedrock", compare=("burst-c10",),
    ),
    Scenario(
        "bedrock-in-pass-c10", "burst", "us.anthropic.bedrock-bench-d200", 10,
        "10 concurrent Bedrock-shaped streams in, the bedrock-burst-c10 target: its event-stream frames passed "
        "through byte for byte; direct = the same requests to the fake's Bedrock route",
        shape="bedrock", compare=("burst-c10", "bedrock-burst-c10"),
    ),
    Scenario(
        "json-c10", "json", "bench-d200", 10, "non-streamed requests (the same 200-token answer as JSON)",
        stream=False, per="request", litellm=True,
    ),
    Scenario(
        "ttft-c1", "ttft", "bench-d200", 1, "C=1, repeats of 200 streams each: added time to first token",
        litellm=True,
    ),
    Scenario(
        "mem-c200", "mem", "bench-d200-p5", 200, "200 concurrent paced streams (~1 s each): peak RSS",
        per="event", warmup_s=(2.5, 2.0), duration_s=(8.0, 4.0), ramp_s=(0.5, 0.5), fresh=True,
    ),
    Scenario(
        "mem-c1000", "mem", "bench-d20-p100", 1000, "1,000 concurrent slow streams (100 ms/event, ~2.5 s): peak RSS",
        per="event", warmup_s=(3.0, 2.0), duration_s=(10.0, 5.0), ramp_s=(2.0, 1.0), fresh=True,
    ),
    Scenario(
        "soak", "soak", "bench-d200-p5", 50, "C=50 paced streams for --soak-seconds: RSS growth",
        per="event", warmup_s=(5.0, 2.0), fresh=True,
    ),
)  # fmt: skip
BY_NAME = {s.name: s for s in SCENARIOS}
DEFAULT = [s.name for s in SCENARIOS]


# --- child processes --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for children: no proxies (only 127.0.0.1 is ever contacted)."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in {"http_proxy", "https_proxy", "all_proxy"}}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


class Proc:
    """A child process pinned to a core, with its log and its process tree's CPU and memory."""

    def __init__(self, name: str, argv: list[str], log: Path, *, cpu: int | None, env: dict[str, str]) -> None:
        self.name = name
        self.argv = (["taskset", "-c", str(cpu)] if cpu is not None else []) + argv
        self.log = log
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None
        self._pids: list[int] = []
        self._pids_at = 0.0
        self.starts = 0

    def start(self) -> None:
        with open(self.log, "ab") as log:
            log.write(f"\n--- start {datetime.now(UTC).isoformat()}: {shlex.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT, start_new_session=True
            )
        self.starts += 1
        self._pids = []

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def pids(self, max_age: float = 2.0) -> list[int]:
        now = time.monotonic()
        if not self._pids or now - self._pids_at > max_age:
            self._pids, self._pids_at = procstat.tree(self.pid), now
        return self._pids

    def cpu(self) -> float:
        return procstat.cpu_seconds(self.pids(max_age=0.0))

    def cpu_split(self) -> tuple[float, float]:
        return procstat.cpu_split(self.pids(max_age=0.0))

    def rss(self) -> procstat.TreeSample:
        return procstat.rss(self.pids())

    def stop(self) -> None:
        if self.popen is None:
            return
        pids = procstat.tree(self.pid) if self.alive() else []
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)
        for pid in pids[1:]:  # workers left behind, by their own ids
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


async def http_get(port: int, path: str, *, headers: dict[str, str] | None = None, limit_s: float = 5.0) -> bytes:
    """A one-off GET to 127.0.0.1 (no proxy logic anywhere near it); raises unless the status is 200."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), limit_s)
    try:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(f"GET {path} HTTP/1.1\r\nhost: {HOST}:{port}\r\n{extra}connection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(-1), limit_s)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
        raise ConnectionError(head.split(b"\r\n", 1)[0].decode(errors="replace") or "no answer")
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    return body


def _dechunk(body: bytes) -> bytes:
    out, rest = [], body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2 :]
    return b"".join(out)


async def wait_ready(proc: Proc, port: int, path: str, limit_s: float, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + limit_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen and proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            await http_get(port, path, headers=headers, limit_s=2.0)
            return
        except (OSError, ConnectionError, TimeoutError) as exc:
            last = exc
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{proc.name} not ready on port {port} after {limit_s:.0f} s ({last}):\n{proc.log_tail()}")


def _redis_proc(name: str, port: int, work: Path, cpu: int | None) -> Proc:
    """A ``redis-server`` without persistence on ``port``, pinned to ``cpu`` (the load core)."""
    argv = ["redis-server", "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    return Proc(name, argv, work / f"{name}.log", cpu=cpu, env=child_env())


async def _wait_tcp(proc: Proc, port: int, limit_s: float) -> None:
    """Until ``port`` takes a connection (a server that speaks no HTTP: redis-server)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen and proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            _, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise RuntimeError(f"{proc.name} not listening on port {port} after {limit_s:.0f} s:\n{proc.log_tail()}")


def _ledger_rows(path: Path) -> int | None:
    """Rows in a SQLite ledger (``requests``: the governed gateway's, after it stopped), or None when it cannot be
    read."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return int(db.execute("SELECT count(*) FROM requests").fetchone()[0])
    except (sqlite3.Error, OSError):
        return None


def _limits_yaml(limits: str) -> str:
    if limits == "off":
        return ""
    redis = f', redis_url: "{limits}"' if limits.startswith("redis") else ""
    return f"limits: {{requests_per_minute: 100000000, tokens_per_minute: 100000000000, max_inflight: 100000{redis}}}\n"


def gateway_config(
    port: int, upstream_port: int, store: str = "off", limits: str = "off", auth: str = "auth: {open: true}\n"
) -> str:
    """``store``: the usage ledger — ``off``, or a ``store.url`` (``sqlite:///…``, ``postgresql://…``).
    ``limits``: ``off``, ``memory`` (limits no request reaches, counted in the process) or a ``redis://`` URL.
    ``auth``: the ``auth`` block (open: no key asked; the governed gateway's: JWTs)."""
    ledger = "store: {enabled: false}\n" if store == "off" else f'store: {{url: "{store}"}}\n'
    return (
        f"server: {{host: {HOST}, port: {port}}}\n" + auth + ledger + _limits_yaml(limits) + "providers:\n"
        f'  up: {{kind: anthropic, api_key: bench, base_url: "http://{HOST}:{upstream_port}"}}\n'
        f'  bedrock: {{kind: bedrock, region: us-east-1, base_url: "http://{HOST}:{upstream_port}", '
        "access_key_id: AKIDBENCH, secret_access_key: bench-secret}\n"
        "models:\n"
        '  "bedrock-*": {targets: [{provider: bedrock}]}\n'
        '  "*": {targets: [{provider: up}]}\n'
    )


TRACED = "gateway-traced"  # the second gateway process of --tracing: the same config plus telemetry.otlp
GOVERNED = "gateway-governed"  # ledger on SQLite, limits over Redis, JWTs (bench.governed): in every report


def tracing_yaml(sink_port: int, options: str = "") -> str:
    """``telemetry.otlp`` to the sink, everything else at its default (sample_ratio 1.0: every request traced;
    a batch leaves every max_batch 512 spans or schedule_delay_s 5 s; the GenAI histograms every 60 s)."""
    more = "".join(f"    {line.strip()}\n" for line in options.split(";") if line.strip())
    return f'telemetry:\n  otlp:\n    endpoint: "http://{HOST}:{sink_port}"\n    protocol: http/protobuf\n{more}'


def gateway_argv(config: Path, port: int, workers: int, profile: Path | None = None) -> list[str]:
    """``profile``: run the gateway under cProfile, its stats written there when it stops (one worker)."""
    exe = Path(sys.executable).parent / "messages-gateway"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
    if profile is not None:
        base = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "gateway.cli"]
    return [*base, "serve", "--config", str(config), "--port", str(port), "--workers", str(workers)]


def profile_summary(path: Path, top: int = 25) -> dict[str, Any]:
    """The functions of a cProfile stats file that cost most: by own time (``tottime``) and, among the
    project's own (gateway/, adapters/, surfaces/), by time including callees (``cumtime``)."""
    import pstats

    stats = pstats.Stats(str(path))
    total = float(stats.total_tt) or 1e-9  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        name = file
        for root in (str(ROOT) + "/", "/site-packages/", os.path.dirname(os.__file__) + "/"):
            if root in name:
                name = name.split(root, 1)[1]
                break
        where = f"{name}:{line}({func})" if line else func
        rows.append({"function": where, "ncalls": ncalls, "tottime_s": tottime, "cumtime_s": cumtime, "file": file})
    own = ("/gateway/", "/adapters/", "/surfaces/")
    by_cum = sorted((r for r in rows if any(p in r["file"] for p in own)), key=lambda r: -r["cumtime_s"])
    clean = [{k: v for k, v in r.items() if k != "file"} for r in rows]
    return {
        "file": str(path),
        "total_s": round(total, 3),
        "by_tottime": sorted(clean, key=lambda r: -r["tottime_s"])[:top],
        "by_cumtime_own": [{k: v for k, v in r.items() if k != "file"} for r in by_cum[:top]],
    }


# --- measuring ----------------------------------------------------------------------------------------------


@dataclass
class System:
    """What is running: the upstream, the systems under test, the cores."""

    upstream: Proc
    upstream_port: int
    load_cpu: int | None
    sut_cpu: int | None
    suts: dict[str, tuple[Proc, Target]] = field(default_factory=dict)  # gateway, litellm
    restart: dict[str, Callable[[], Awaitable[None]]] = field(default_factory=dict)
    crashes: list[dict[str, str]] = field(default_factory=list)
    load_extra: list[Proc] = field(default_factory=list)  # more of ours on the load core (the OTLP sink)
    sink_port: int | None = None  # the OTLP sink (--tracing)

    def direct(self) -> Target:
        return Target("direct", HOST, self.upstream_port)


class RssSampler:
    """Samples a process tree's summed VmRSS in the background; keeps the peak (and a series if asked)."""

    def __init__(self, proc: Proc, interval: float, keep_series: bool = False) -> None:
        self.proc = proc
        self.interval = interval
        self.keep_series = keep_series
        self.peak_kb = 0
        self.series: list[tuple[float, int]] = []
        self._task: asyncio.Task[None] | None = None
        self._t0 = time.perf_counter()

    def sample(self) -> int:
        kb = self.proc.rss().rss_kb
        self.peak_kb = max(self.peak_kb, kb)
        if self.keep_series:
            self.series.append((round(time.perf_counter() - self._t0, 2), kb))
        return kb

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self._t0 = time.perf_counter()
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        self.sample()


def _mb(kb: int | None) -> float | None:
    return None if kb is None else round(kb / 1024.0, 1)


async def measure(
    system: System, target_name: str, load: Load, *, label: str, rss_interval: float = 0.2
) -> dict[str, Any]:
    """One phase against ``direct`` or a system under test, with CPU and memory figures around it."""
    sut: Proc | None = None
    if target_name == "direct":
        target = system.direct()
    else:
        sut, target = system.suts[target_name]
        if not sut.alive():
            system.crashes.append({"target": target_name, "before": label, "log": sut.log_tail()})
            restart = system.restart.get(target_name)
            if restart is None:
                dead = PhaseResult(target=target_name, model=load.model, concurrency=load.concurrency, errors=1)
                dead.error_samples.append(f"{target_name} is not running (exit code {sut.popen and sut.popen.poll()})")
                return dead.summary()
            await restart()
    up = system.upstream

    async def snapshot() -> dict[str, Any]:
        snap: dict[str, Any] = {
            "t": time.perf_counter(),
            "upstream_cpu": up.cpu(),
            "extra_load_cpu": sum(p.cpu() for p in system.load_extra if p.alive()),
            "cores": procstat.core_busy_seconds(),
        }
        if sut is not None:
            snap["sut_user"], snap["sut_sys"] = sut.cpu_split()
            snap["sut_cpu"] = snap["sut_user"] + snap["sut_sys"]
        try:
            stats = json.loads(await http_get(system.upstream_port, "/cpu", limit_s=2.0))
            snap |= {"upstream_requests": stats["requests"], "upstream_connections": stats["connections"]}
        except (OSError, ConnectionError, TimeoutError, ValueError, KeyError):
            pass
        if target_name == TRACED and system.sink_port is not None:
            snap["sink"] = await sink_counts(system.sink_port)
        return snap

    before_kb = peak_reset = None
    if sut is not None:
        before_kb = sut.rss().rss_kb
        peak_reset = procstat.reset_peak(sut.pids(max_age=0.0))
    otlp_before = await otlp_counters(target.port) if target_name == TRACED else None  # outside the window
    sampler = RssSampler(sut, rss_interval) if sut is not None else None
    with sampler or contextlib.nullcontext():
        result = await run_phase(target, load, on_window_start=snapshot, on_window_end=snapshot)
    otlp_after = await otlp_counters(target.port) if target_name == TRACED else None
    out = result.summary()
    start, end = result.hooks["start"], result.hooks["end"]
    window = result.window_s or 1e-9
    up_cpu = end["upstream_cpu"] - start["upstream_cpu"]
    out["upstream_cpu_s"] = round(up_cpu, 3)
    out["upstream_us_per_request"] = _per(up_cpu * 1e6, result.completed)
    if "upstream_requests" in start and "upstream_requests" in end:
        out["upstream_requests"] = end["upstream_requests"] - start["upstream_requests"]
        # new connections the upstream accepted in the window (less the closing /cpu probe's own)
        out["upstream_new_connections"] = end["upstream_connections"] - start["upstream_connections"] - 1
    out["load_core_busy_pct"] = round(100.0 * (up_cpu + result.load_cpu_s) / window, 1)
    # Everything else that ran on the two cores in the window (another benchmark, a test run…): if it is
    # more than a few %, the figures of this phase are not to be trusted.
    cores = {c: end["cores"].get(c, 0.0) - start["cores"].get(c, 0.0) for c in start["cores"]}
    extra_cpu = end["extra_load_cpu"] - start["extra_load_cpu"]
    ours = {system.load_cpu: up_cpu + result.load_cpu_s + extra_cpu}
    if sut is not None:
        ours[system.sut_cpu] = ours.get(system.sut_cpu, 0.0) + end["sut_cpu"] - start["sut_cpu"]
    foreign = {c: max(0.0, cores.get(c, 0.0) - ours.get(c, 0.0)) for c in (system.sut_cpu, system.load_cpu)}
    out["foreign_busy_pct"] = {str(c): round(100.0 * v / window, 1) for c, v in foreign.items() if c is not None}
    if sut is not None and sampler is not None:
        cpu = end["sut_cpu"] - start["sut_cpu"]
        hwm_kb = sut.rss().hwm_kb if peak_reset else None
        out |= {
            "cpu_s": round(cpu, 3),
            "core_busy_pct": round(100.0 * cpu / window, 1),
            "kernel_pct_of_cpu": round(100.0 * (end["sut_sys"] - start["sut_sys"]) / cpu, 1) if cpu else None,
            "cpu_ms_per_request": _per(cpu * 1e3, result.completed),
            "cpu_us_per_event": _per(cpu * 1e6, result.events),
            "rss_before_mb": _mb(before_kb),
            "rss_peak_sampled_mb": _mb(sampler.peak_kb),
            "rss_hwm_mb": _mb(hwm_kb),
            "rss_peak_mb": _mb(max(sampler.peak_kb, hwm_kb or 0)),
            "alive_after": sut.alive(),
        }
    if target_name == TRACED:
        out["tracing"] = _tracing_phase(start.get("sink"), end.get("sink"), otlp_before, otlp_after, extra_cpu)
    return out


async def sink_counts(port: int) -> dict[str, Any] | None:
    """The OTLP sink's counts (``GET /counts``), or None when it does not answer."""
    try:
        counts: dict[str, Any] = json.loads(await http_get(port, "/counts", limit_s=2.0))
        return counts
    except (OSError, ConnectionError, TimeoutError, ValueError):
        return None


async def otlp_counters(port: int) -> dict[str, float]:
    """The gateway's ``gateway_otlp_*`` series (``name{labels}`` → value) from its ``/metrics``."""
    try:
        text = (await http_get(port, "/metrics", limit_s=5.0)).decode()
    except (OSError, ConnectionError, TimeoutError):
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gateway_otlp_") and not line.startswith("gateway_otlp_queue"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def _tracing_phase(
    sink0: dict[str, Any] | None,
    sink1: dict[str, Any] | None,
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    sink_cpu: float,
) -> dict[str, Any]:
    """What the traced gateway exported in a phase: the sink's POSTs and bytes in the measured window, and the
    gateway's own span counters over the whole phase (warm-up, window and drain; read outside the window)."""
    out: dict[str, Any] = {"sink_cpu_s": round(sink_cpu, 3)}
    if sink0 and sink1:
        for kind in ("traces", "metrics"):
            out[f"sink_{kind}_posts"] = sink1[kind]["requests"] - sink0[kind]["requests"]
            out[f"sink_{kind}_bytes"] = sink1[kind]["bytes"] - sink0[kind]["bytes"]
    if before is not None and after is not None:
        for outcome in ("exported", "dropped", "failed"):
            key = f'gateway_otlp_spans_total{{outcome="{outcome}"}}'
            out[f"spans_{outcome}"] = int(after.get(key, 0.0) - before.get(key, 0.0))
    return out


def _per(total: float, count: int) -> float | None:
    return round(total / count, 3) if count else None


# --- scenarios --------------------------------------------------------------------------------------------


@dataclass
class Options:
    quick: bool
    soak_s: float
    ttft_repeats: int
    ttft_requests: int
    litellm: bool
    tracing_pairs: int = 0
    tracing_together: bool = False


def _load(s: Scenario, opts: Options, **over: Any) -> Load:
    i = 1 if opts.quick else 0
    kw: dict[str, Any] = {
        "model": s.model,
        "stream": s.stream,
        "concurrency": s.concurrency,
        "duration_s": s.duration_s[i],
        "warmup_s": s.warmup_s[i],
        "ramp_s": s.ramp_s[i],
        "shape": s.shape,
    }
    kw.update(over)
    return Load(**kw)


def _floor_runs(s: Scenario) -> bool:
    """The floor (``--floor``) forwards Messages requests to the fake's Claude API route: the scenarios of that
    shape whose CPU and time to first token the issue's targets name."""
    return s.kind in ("burst", "paced", "json", "ttft") and s.shape == "messages" and not s.model.startswith("bedrock")


def _tracing_runs(s: Scenario) -> bool:
    """The traced gateway (``--tracing``) runs every scenario but the soak (the plain gateway's RSS over time)."""
    return s.kind != "soak"


def _governed_runs(s: Scenario) -> bool:
    """The governed gateway runs the scenarios issue 36's governance target names: burst-c10 and json-c10."""
    return s.name in ("burst-c10", "json-c10")


def _targets(system: System, s: Scenario) -> list[str]:
    return [
        name
        for name in system.suts
        if name == "gateway"
        or (name == "litellm" and s.litellm)
        or (name == "floor" and _floor_runs(s))
        or (name == TRACED and _tracing_runs(s))
        or (name == GOVERNED and _governed_runs(s))
    ]


async def run_scenario(system: System, s: Scenario, opts: Options) -> dict[str, Any]:
    if s.kind == "ttft":
        return await _run_ttft(system, s, opts)
    if s.kind == "soak":
        return await _run_soak(system, s, opts)
    phases = {"direct": await measure(system, "direct", _load(s, opts), label=s.name)}
    for name in _targets(system, s):
        await asyncio.sleep(0.3)
        load = _load(s, opts)
        if name == "litellm":  # ~50 ms of CPU per stream: a short window would complete none at C >= 10
            load = _load(s, opts, duration_s=max(10.0, load.duration_s or 0.0), warmup_s=max(2.0, load.warmup_s))
        phases[name] = await measure(system, name, load, label=s.name)
    entry = {"scenario": s.name, "kind": s.kind, "about": s.about, "per": s.per, "phases": phases}
    if TRACED in phases and opts.tracing_pairs:
        entry["tracing_pairs"] = await _tracing_pairs(system, s, opts)
    return entry


def _cpu_us(phase: dict[str, Any], per: str) -> float | None:
    """A phase's gateway CPU per unit in µs (per event for the paced scenarios, else per request or stream)."""
    if per == "event":
        value = phase.get("cpu_us_per_event")
        return None if value is None else float(value)
    ms = phase.get("cpu_ms_per_request")
    return None if ms is None else ms * 1e3


async def _tracing_pairs(system: System, s: Scenario, opts: Options) -> list[dict[str, Any]]:
    """``--tracing-pairs N``: N more windows of each gateway, alternating (plain then traced, then traced then
    plain, ...), each pair's difference taken within the pair — the host's drift over a run (this machine's CPU
    per request moves by tens of µs from one minute to the next) falls on both sides of a pair alike."""
    pairs: list[dict[str, Any]] = []
    for k in range(opts.tracing_pairs):
        order = ["gateway", TRACED] if k % 2 == 0 else [TRACED, "gateway"]
        got: dict[str, dict[str, Any]] = {}
        if opts.tracing_together:  # both at once, each under the scenario's whole load, sharing the gateway core
            await asyncio.sleep(0.3)
            phases = [measure(system, name, _load(s, opts), label=f"{s.name} pair {k + 1}") for name in order]
            got = dict(zip(order, await asyncio.gather(*phases), strict=True))
        for name in order:
            if name in got:
                continue
            await asyncio.sleep(0.3)
            got[name] = await measure(system, name, _load(s, opts), label=f"{s.name} pair {k + 1}")
        off, on = _cpu_us(got["gateway"], s.per), _cpu_us(got[TRACED], s.per)
        pairs.append(
            {
                "order": order,
                "off_us": None if off is None else round(off, 1),
                "on_us": None if on is None else round(on, 1),
                "difference_us": None if off is None or on is None else round(on - off, 1),
                "errors": got["gateway"].get("errors", 0) + got[TRACED].get("errors", 0),
                "off_rps": got["gateway"].get("rps"),
                "on_rps": got[TRACED].get("rps"),
            }
        )
    return pairs


async def _run_ttft(system: System, s: Scenario, opts: Options) -> dict[str, Any]:
    load = _load(s, opts, duration_s=None, requests=opts.ttft_requests, warmup_requests=20, warmup_s=0.0, drain_s=10.0)
    names = ["direct", *_targets(system, s)]
    repeats: list[dict[str, Any]] = []
    for _ in range(opts.ttft_repeats):
        repeats.append({name: await measure(system, name, load, label=s.name) for name in names})
    phases: dict[str, Any] = {}
    for name in names:
        runs = [r[name] for r in repeats]
        p50s = [r["ttft_ms"]["p50"] for r in runs if r["ttft_ms"]["p50"] is not None]
        merged = dict(runs[-1])
        merged["ttft_p50_repeats_ms"] = p50s
        for key in ("ttfb_ms", "ttft_ms", "total_ms"):  # each percentile: its median over the repeats
            merged[key] = {
                q: _median([r[key][q] for r in runs if r[key][q] is not None]) for q in ("p50", "p90", "p99")
            }
        merged["errors"] = sum(r["errors"] for r in runs)
        merged["error_samples"] = [e for r in runs for e in r["error_samples"]][:5]
        # Each repeat's window is short (~0.3 s against 4 ms CPU ticks): CPU figures are summed over repeats.
        window = sum(r["window_s"] for r in runs) or 1e-9
        completed = sum(r["completed"] for r in runs)
        load_cpu = sum(r["upstream_cpu_s"] + r["load_cpu_s"] for r in runs)
        merged |= {
            "window_s": round(window, 3),
            "completed": completed,
            "rps": round(completed / window, 1),
            "load_core_busy_pct": round(100.0 * load_cpu / window, 1),
            "upstream_us_per_request": _per(sum(r["upstream_cpu_s"] for r in runs) * 1e6, completed),
        }
        cores = {c for r in runs for c in r.get("foreign_busy_pct", {})}
        merged["foreign_busy_pct"] = {
            c: round(sum(r["foreign_busy_pct"].get(c, 0.0) * r["window_s"] for r in runs) / window, 1) for c in cores
        }
        if name == TRACED:  # the sink's and the gateway's counts, summed over the repeats
            keys = {k for r in runs for k in r.get("tracing", {})}
            merged["tracing"] = {k: round(sum(r.get("tracing", {}).get(k, 0) for r in runs), 3) for k in keys}
        if name != "direct":
            cpu = sum(r["cpu_s"] for r in runs)
            merged |= {
                "cpu_s": round(cpu, 3),
                "cpu_ms_per_request": _per(cpu * 1e3, completed),
                "core_busy_pct": round(100.0 * cpu / window, 1),
            }
        phases[name] = merged
        if name != "direct":
            added = [
                round(r[name]["ttft_ms"]["p50"] - r["direct"]["ttft_ms"]["p50"], 3)
                for r in repeats
                if r[name]["ttft_ms"]["p50"] is not None and r["direct"]["ttft_ms"]["p50"] is not None
            ]
            merged["added_ttft_p50_repeats_ms"] = added
            merged["added_ttft_p50_ms"] = _median(added)
    return {"scenario": s.name, "kind": s.kind, "about": s.about, "per": s.per, "phases": phases, "repeats": repeats}


async def _run_soak(system: System, s: Scenario, opts: Options) -> dict[str, Any]:
    direct_s = max(5.0, min(30.0, opts.soak_s / 4))
    phases = {"direct": await measure(system, "direct", _load(s, opts, duration_s=direct_s), label=s.name)}
    sut, _ = system.suts["gateway"]
    interval = min(5.0, max(1.0, opts.soak_s / 20))
    series_sampler = RssSampler(sut, interval, keep_series=True)
    with series_sampler:
        phases["gateway"] = await measure(system, "gateway", _load(s, opts, duration_s=opts.soak_s), label=s.name)
    series = series_sampler.series
    warm = _load(s, opts).warmup_s + _load(s, opts).ramp_s
    base_window = min(60.0, opts.soak_s / 4)
    base = [kb for t, kb in series if warm <= t <= warm + base_window] or [kb for _, kb in series[:1]]
    base_kb = statistics.median(base) if base else 0
    end_kb = series[-1][1] if series else 0
    phases["gateway"] |= {
        "rss_series_mb": [(t, _mb(kb)) for t, kb in series],
        "rss_baseline_mb": _mb(int(base_kb)),
        "rss_baseline_window_s": [round(warm, 1), round(warm + base_window, 1)],
        "rss_end_mb": _mb(end_kb),
        "rss_growth_pct": round(100.0 * (end_kb - base_kb) / base_kb, 2) if base_kb else None,
        "soak_s": opts.soak_s,
        "sample_interval_s": interval,
    }
    return {"scenario": s.name, "kind": s.kind, "about": s.about, "per": s.per, "phases": phases}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


# --- report -------------------------------------------------------------------------------------------------


def machine_facts() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "gateway", "adapters"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        commit += " (gateway/adapters modified)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit,
    }


def _fmt(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}" if isinstance(value, int) else f"{value}{unit}"


def _headline(entry: dict[str, Any], name: str) -> tuple[str, Any, Any, str, str, str]:
    """(metric, direct value, sut value, ratio, sut CPU per unit, added TTFT p50) for the summary table."""
    d, g = entry["phases"]["direct"], entry["phases"][name]
    kind = entry["kind"]
    if kind in ("paced", "mem", "soak"):
        metric, dv, gv = "events/s", d["events_per_s"], g["events_per_s"]
    elif kind == "ttft":
        metric, dv, gv = "TTFT p50 ms", d["ttft_ms"]["p50"], g["ttft_ms"]["p50"]
    else:
        metric, dv, gv = ("streams/s" if entry["per"] == "stream" else "requests/s"), d["rps"], g["rps"]
    ratio = f"{gv / dv:.2f}" if dv and gv is not None else "—"
    if entry["per"] == "event":
        cpu = f"{_fmt(g.get('cpu_us_per_event'), ' µs/event')} ({_fmt(g.get('cpu_ms_per_request'), ' ms/stream', 2)})"
    else:
        cpu = _fmt(g.get("cpu_ms_per_request"), f" ms/{entry['per']}", 3)
    if kind == "ttft":
        added = _fmt(g.get("added_ttft_p50_ms"), " ms", 3)
    else:
        dp, gp = d["ttft_ms"]["p50"], g["ttft_ms"]["p50"]
        added = _fmt(gp - dp, " ms", 3) if dp is not None and gp is not None else "—"
    return metric, dv, gv, ratio, cpu, added


def cpu_versus(entry: dict[str, Any], results: list[dict[str, Any]], scenario: Scenario) -> dict[str, Any]:
    """The gateway's CPU per stream of ``entry`` against that of each of ``scenario.compare`` in the same run:
    ``{name: {"cpu_ms": this, "other_cpu_ms": that, "ratio": this / that}}``, for those that ran (and measured)."""
    mine = entry["phases"].get("gateway", {}).get("cpu_ms_per_request")
    out: dict[str, Any] = {}
    for other in scenario.compare:
        done = next((r for r in results if r["scenario"] == other), None)
        theirs = done["phases"].get("gateway", {}).get("cpu_ms_per_request") if done else None
        if mine and theirs:
            out[other] = {"cpu_ms": mine, "other_cpu_ms": theirs, "ratio": round(mine / theirs, 3)}
    return out


def _versus(entry: dict[str, Any]) -> str:
    return ", ".join(f"CPU per stream vs {name} {v['ratio']:.2f}x" for name, v in entry.get("cpu_vs", {}).items())


def _summary_table(results: list[dict[str, Any]], name: str) -> list[str]:
    label = "gateway" if name == "gateway" else name
    lines = [
        f"| scenario | metric | direct | {label} | ratio | {label} CPU | added TTFT p50 | {label} peak RSS "
        "| core busy (sut / load) | errors (direct / {0}) |".replace("{0}", label),
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for entry in results:
        if name not in entry["phases"]:
            continue
        metric, dv, gv, ratio, cpu, added = _headline(entry, name)
        d, g = entry["phases"]["direct"], entry["phases"][name]
        lines.append(
            f"| {entry['scenario']} | {metric} | {_fmt(dv)} | {_fmt(gv)} | {ratio} | {cpu} | {added} "
            f"| {_fmt(g.get('rss_peak_mb'), ' MB')} | {_fmt(g.get('core_busy_pct'), '%', 0)} / "
            f"{_fmt(g.get('load_core_busy_pct'), '%', 0)} | {d['errors']} / {g['errors']} |"
        )
    return lines


def _floor_table(results: list[dict[str, Any]]) -> list[str]:
    """The gateway against the floor measured in the same run: the features' cost over a bare pass-through."""
    lines = [
        "## The gateway vs the floor (a bare Python pass-through, same run)",
        "",
        "`bench/floor.py`: uvicorn + the gateway's own upstream client, the bytes forwarded unchanged, no checks. "
        "Gateway minus floor: what its features cost per unit; gateway / floor: how far it is from the floor.",
        "",
        "| scenario | gateway CPU | floor CPU | difference | gateway / floor | added TTFT p50 (gw / floor) |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for entry in results:
        if "floor" not in entry["phases"]:
            continue
        g, f = entry["phases"]["gateway"], entry["phases"]["floor"]
        key, unit, digits = (
            ("cpu_us_per_event", " µs/event", 1) if entry["per"] == "event" else ("cpu_ms_per_request", " ms", 3)
        )
        gc, fc = g.get(key), f.get(key)
        added = [_headline(entry, name)[5] for name in ("gateway", "floor")]
        lines.append(
            f"| {entry['scenario']} | {_fmt(gc, unit, digits)} | {_fmt(fc, unit, digits)} "
            f"| {_fmt(gc - fc if gc is not None and fc is not None else None, unit, digits)} "
            f"| {f'{gc / fc:.2f}x' if gc and fc else '—'} | {added[0]} / {added[1]} |"
        )
    return lines


def tracing_versus(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The gateway's CPU per unit with tracing off (``gateway``) and on (``gateway-traced``) in the same run:
    ``{"unit", "off_us", "on_us", "difference_us", "ratio", "rps_off", "rps_on", "exported": {…}}``."""
    phases = entry["phases"]
    if TRACED not in phases or "gateway" not in phases:
        return None
    off, on = phases["gateway"], phases[TRACED]
    if entry["per"] == "event":
        unit, a, b = "event", off.get("cpu_us_per_event"), on.get("cpu_us_per_event")
    else:
        ms_off, ms_on = off.get("cpu_ms_per_request"), on.get("cpu_ms_per_request")
        unit = entry["per"]
        a = None if ms_off is None else round(ms_off * 1e3, 1)
        b = None if ms_on is None else round(ms_on * 1e3, 1)
    pairs = [p["difference_us"] for p in entry.get("tracing_pairs", []) if p["difference_us"] is not None]
    return {
        "pairs": len(pairs),
        "pairs_median_us": _median(pairs),
        "pairs_range_us": [min(pairs), max(pairs)] if pairs else None,
        "unit": unit,
        "off_us": a,
        "on_us": b,
        "difference_us": round(b - a, 1) if a is not None and b is not None else None,
        "ratio": round(b / a, 3) if a and b is not None else None,
        "rps_off": off.get("rps"),
        "rps_on": on.get("rps"),
        "errors_off": off.get("errors"),
        "errors_on": on.get("errors"),
        "exported": on.get("tracing", {}),
    }


def governed_versus(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The gateway's CPU per unit without governance (``gateway``) and with it (``gateway-governed``), same run."""
    phases = entry["phases"]
    if GOVERNED not in phases or "gateway" not in phases:
        return None
    off, on = _cpu_us(phases["gateway"], entry["per"]), _cpu_us(phases[GOVERNED], entry["per"])
    return {
        "unit": entry["per"],
        "off_us": None if off is None else round(off, 1),
        "on_us": None if on is None else round(on, 1),
        "difference_us": round(on - off, 1) if off is not None and on is not None else None,
        "ratio": round(on / off, 3) if off and on is not None else None,
        "rps_off": phases["gateway"].get("rps"),
        "rps_on": phases[GOVERNED].get("rps"),
        "errors_off": phases["gateway"].get("errors"),
        "errors_on": phases[GOVERNED].get("errors"),
    }


def _governed_table(report: dict[str, Any]) -> list[str]:
    g = report.get("governed", {})
    lines = [
        "## Governance on vs off (same run)",
        "",
        f"`{GOVERNED}`: a second gateway process (same core, fresh) with the usage ledger on SQLite, limits over Redis "
        "(a `redis-server` of the run's own on the load core; limits no request reaches, so every request is "
        "admitted, counted and settled) and its identity provider's JWT (RS256, verified once, then remembered "
        "until it expires) as the bearer instead of no key, measured right after the plain gateway. Issue 36's "
        "target: at most +10 %.",
        "",
        "| scenario | per | off µs | governed µs | difference µs | governed / off | req/s off / governed "
        "| errors off / governed |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for entry in report["results"]:
        v = entry.get("governed")
        if not v:
            continue
        ratio = f"{v['ratio']:.3f}x" if v["ratio"] else "—"
        lines.append(
            f"| {entry['scenario']} | {v['unit']} | {_fmt(v['off_us'])} | {_fmt(v['on_us'])} "
            f"| {_fmt(v['difference_us'])} | {ratio} | {_fmt(v['rps_off'])} / {_fmt(v['rps_on'])} "
            f"| {v['errors_off']} / {v['errors_on']} |"
        )
    if g.get("error"):
        lines += ["", f"The governed gateway did not run: {g['error']}"]
    if g.get("ledger_rows") is not None:
        lines += [
            "",
            f"Its ledger at the end: {_fmt(g['ledger_rows'])} rows; JWKS fetched {g.get('jwks_fetches')} times.",
        ]
    if g.get("log_problems"):
        lines += ["", f"Problems in its log (`{g.get('log')}`):", "", "```", *g["log_problems"], "```"]
    return lines


def _tracing_table(report: dict[str, Any]) -> list[str]:
    results = report["results"]
    tr = report.get("tracing", {})
    lines = [
        "## Tracing: on vs off (same run)",
        "",
        *(
            [
                "**A/A control (`--tracing-control`)**: the second gateway runs *without* `telemetry.otlp`; the "
                "difference below is the measurement's own bias and noise, not tracing's cost.",
                "",
            ]
            if report["config"].get("tracing_control")
            else []
        ),
        f"`{TRACED}`: a second gateway process (same config, same core, fresh) with `telemetry.otlp` "
        f"(`http/protobuf` to `bench/otlp_sink.py` on the load core; every request traced, batches of 512 spans or "
        f"every 5 s), measured right after the plain gateway in each scenario. Off / on: the gateway process tree's "
        f"CPU per unit; difference = on - off. Sink: its `POST /v1/traces` (and bytes) received in the measured "
        f"window; spans: the traced gateway's `gateway_otlp_spans_total` over the phase (warm-up to drain).",
        "",
        "| scenario | per | off µs | on µs | difference µs | on / off | req/s off / on | sink traces POSTs "
        "(KB) in window | spans exported / dropped / failed | errors off / on |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for entry in results:
        v = entry.get("tracing")
        if not v:
            continue
        x = v["exported"]
        kb = x.get("sink_traces_bytes")
        ratio = f"{v['ratio']:.3f}x" if v["ratio"] else "—"
        lines.append(
            f"| {entry['scenario']} | {v['unit']} | {_fmt(v['off_us'])} | {_fmt(v['on_us'])} "
            f"| {_fmt(v['difference_us'])} | {ratio} "
            f"| {_fmt(v['rps_off'])} / {_fmt(v['rps_on'])} "
            f"| {_fmt(x.get('sink_traces_posts'))} ({_fmt(kb / 1024 if kb is not None else None, digits=0)}) "
            f"| {_fmt(x.get('spans_exported'))} / {_fmt(x.get('spans_dropped'))} / {_fmt(x.get('spans_failed'))} "
            f"| {v['errors_off']} / {v['errors_on']} |"
        )
    paired = [e for e in results if (e.get("tracing") or {}).get("pairs")]
    if paired:
        lines += [
            "",
            "Alternating pairs (`--tracing-pairs`): more windows of each gateway after the first two, plain then "
            "traced, then traced then plain, and so on; each difference is taken within its pair, so the host's drift "
            "over the run falls on both sides alike.",
            "",
            "| scenario | pairs | median difference µs | range µs | each pair: off → on (difference) |",
            "|---|--:|--:|--:|---|",
        ]
        for entry in paired:
            v = entry["tracing"]
            low, high = v["pairs_range_us"]
            each = ", ".join(
                f"{_fmt(p['off_us'])} → {_fmt(p['on_us'])} ({_fmt(p['difference_us'])})" for p in entry["tracing_pairs"]
            )
            lines.append(
                f"| {entry['scenario']} | {v['pairs']} | **{_fmt(v['pairs_median_us'])}** "
                f"| {_fmt(low)} … {_fmt(high)} | {each} |"
            )
    end = tr.get("sink_at_end") or {}
    if end:
        t, m = end.get("traces", {}), end.get("metrics", {})
        lines += [
            "",
            f"The sink over the whole run (after the traced gateway stopped and flushed): `/v1/traces` "
            f"{_fmt(t.get('requests'))} POSTs, {_fmt(t.get('bytes'))} bytes; `/v1/metrics` "
            f"{_fmt(m.get('requests'))} POSTs, {_fmt(m.get('bytes'))} bytes; {_fmt(end.get('connections'))} "
            f"connections (the runner's probes of `/counts` and `/healthz` included); "
            f"its CPU {_fmt(end.get('process_time'), ' s', 2)}.",
        ]
    if tr.get("counters"):
        lines += ["", "The traced gateway's OTLP counters at the end (before it stopped):", "", "```"]
        lines += [*tr["counters"], "```"]
    if tr.get("log_problems"):
        lines += ["", f"Problems in its log (`{tr.get('log')}`):", "", "```", *tr["log_problems"], "```"]
    if tr.get("error"):
        lines += ["", f"Tracing did not run: {tr['error']}"]
    return lines


def _busy(phase: dict[str, Any]) -> str:
    busy = _fmt(phase.get("core_busy_pct"), "%", 0)
    kernel = phase.get("kernel_pct_of_cpu")
    return busy if kernel is None else f"{busy} ({kernel:.0f}%)"


def _foreign(phase: dict[str, Any]) -> str:
    values = phase.get("foreign_busy_pct") or {}
    return " / ".join(f"{v:.0f}%" for _, v in sorted(values.items())) or "—"


def _disturbed(results: list[dict[str, Any]], limit: float = 10.0) -> list[str]:
    """Phases during which something outside this benchmark kept a core busy (windows under 1 s are too
    short for the 10 ms accounting ticks to tell)."""
    out = []
    for entry in results:
        for name, p in entry["phases"].items():
            if p.get("window_s", 0.0) < 1.0:
                continue
            worst = max((p.get("foreign_busy_pct") or {}).values(), default=0.0)
            if worst > limit:
                out.append(f"{entry['scenario']} / {name} ({worst:.0f}%)")
    return out


def _detail_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| scenario | target | req/s | events/s | TTFB p50 / p90 / p99 ms | TTFT p50 / p90 / p99 ms | total p50 ms "
        "| sut core (kernel share) | load core | other load on cores 0 / 1 | upstream µs/req | upstream new conns "
        "| errors |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for entry in results:
        for name, p in entry["phases"].items():
            tb, tt = p["ttfb_ms"], p["ttft_ms"]
            lines.append(
                f"| {entry['scenario']} | {name} | {_fmt(p['rps'])} | {_fmt(p['events_per_s'], digits=0)} "
                f"| {_fmt(tb['p50'], digits=2)} / {_fmt(tb['p90'], digits=2)} / {_fmt(tb['p99'], digits=2)} "
                f"| {_fmt(tt['p50'], digits=2)} / {_fmt(tt['p90'], digits=2)} / {_fmt(tt['p99'], digits=2)} "
                f"| {_fmt(p['total_ms']['p50'], digits=2)} | {_busy(p)} "
                f"| {_fmt(p.get('load_core_busy_pct'), '%', 0)} | {_foreign(p)} "
                f"| {_fmt(p.get('upstream_us_per_request'), digits=0)} "
                f"| {_fmt(p.get('upstream_new_connections'))} | {p['errors']} |"
            )
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    m, cfg = report["machine"], report["config"]
    results = report["results"]
    out = [
        f"# messages-gateway benchmark — {report['started']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['nproc']} cores, {m['cpu_model']}, Python {m['python']}, Linux {m['kernel']}; "
        f"gateway commit {m['commit']}.",
        f"Gateway: {cfg['workers']} worker(s), upstream client `{cfg['upstream_client']}`, pinned to core "
        f"{cfg['gateway_cpu']}; fake upstream + load generator pinned to core {cfg['load_cpu']}. "
        f"Gateway idle RSS {_fmt(report.get('gateway_idle_rss_mb'), ' MB')}.",
        "",
        "## Gateway vs direct",
        "",
        *_summary_table(results, "gateway"),
        "",
        "CPU = the gateway process tree's utime+stime over the measured window divided by the streams/requests "
        "completed (or SSE events delivered) in it. Core busy = CPU seconds / wall seconds of the window: "
        "`sut` is the gateway's core, `load` the fake upstream + load generator's core. Direct burst/json phases "
        "run the load core at ~100 %: their throughput is the load side's ceiling, so those ratios only say the "
        "gateway saturates first (its core at ~100 %). Ratios of paced scenarios compare like with like.",
        "",
    ]
    for entry in results:
        g = entry["phases"].get("gateway", {})
        if entry["kind"] == "ttft":
            out.append(
                f"- **ttft-c1**: added TTFT p50 per repeat (gateway - direct): "
                f"{g.get('added_ttft_p50_repeats_ms')} ms; "
                f"median {_fmt(g.get('added_ttft_p50_ms'), ' ms', 3)}. "
                f"Direct p50s {entry['phases']['direct'].get('ttft_p50_repeats_ms')}, "
                f"gateway p50s {g.get('ttft_p50_repeats_ms')}."
            )
        if entry["kind"] == "soak":
            out.append(
                f"- **soak** (fresh gateway): {g.get('soak_s')} s at C=50; "
                f"RSS baseline {_fmt(g.get('rss_baseline_mb'), ' MB')} "
                f"(median over {g.get('rss_baseline_window_s')} s), end {_fmt(g.get('rss_end_mb'), ' MB')}, "
                f"growth {_fmt(g.get('rss_growth_pct'), ' %', 2)}; peak {_fmt(g.get('rss_peak_mb'), ' MB')}."
            )
        if BY_NAME.get(entry["scenario"]) and BY_NAME[entry["scenario"]].compare:
            compared = entry.get("cpu_vs", {})
            parts = [
                f"CPU per stream vs {other} (same run): "
                + (
                    f"{_fmt(compared[other]['cpu_ms'], ' ms', 3)} / {_fmt(compared[other]['other_cpu_ms'], ' ms', 3)}"
                    f" = **{compared[other]['ratio']:.2f}x**"
                    if other in compared
                    else f"— ({other} not measured in this run)"
                )
                for other in BY_NAME[entry["scenario"]].compare
            ]
            out.append(f"- **{entry['scenario']}**: " + "; ".join(parts) + ".")
        if entry["kind"] == "mem":
            out.append(
                f"- **{entry['scenario']}** (fresh gateway): RSS before {_fmt(g.get('rss_before_mb'), ' MB')}, peak "
                f"{_fmt(g.get('rss_peak_mb'), ' MB')} (sampled {_fmt(g.get('rss_peak_sampled_mb'), ' MB')}, "
                f"VmHWM {_fmt(g.get('rss_hwm_mb'), ' MB')})."
            )
    if any("floor" in entry["phases"] for entry in results):
        out += ["", *_floor_table(results)]
    if "tracing" in report:
        out += ["", *_tracing_table(report)]
    if "governed" in report:
        out += ["", *_governed_table(report)]
    if "litellm" in report:
        out += ["", "## LiteLLM proxy vs direct (same load)", ""]
        lt = report["litellm"]
        if lt.get("error"):
            out.append(f"LiteLLM did not run: {lt['error']}")
        else:
            out.append(f"LiteLLM {lt.get('version')}, one worker, pinned to core {cfg['gateway_cpu']}.")
            out += ["", *_summary_table(results, "litellm")]
    disturbed = _disturbed(results)
    if disturbed or report.get("concurrent_processes"):
        out += ["", "## Warning: the machine was not quiet", ""]
        if disturbed:
            out.append("Other processes kept a core more than 10 % busy during: " + ", ".join(disturbed) + ".")
        out += [f"- concurrent: `{c}`" for c in report.get("concurrent_processes", [])]
    out += ["", "## All phases", "", *_detail_table(results), ""]
    errors = [
        (entry["scenario"], name, p["error_samples"])
        for entry in results
        for name, p in entry["phases"].items()
        if p["errors"]
    ]
    if errors or report.get("crashes"):
        out += ["## Errors", ""]
        out += [f"- {sc} / {name}: " + "; ".join(f"`{e}`" for e in samples) for sc, name, samples in errors]
        out += [f"- {c['target']} was found dead before {c['before']} and restarted" for c in report.get("crashes", [])]
        out.append("")
    for prof in report.get("profiles", []):
        out += ["## Gateway profile (cProfile)", ""]
        out.append(
            f"`{prof['file']}`: {prof['total_s']} s of profiled time over the gateway's whole life (start-up, idle "
            "direct phases and every scenario of the run; cProfile's per-call overhead inflates small Python calls)."
        )
        for key, title in (("by_tottime", "own time"), ("by_cumtime_own", "time with callees, the project's own")):
            out += ["", f"By {title}:", "", "| function | calls | tottime s | cumtime s |", "|---|--:|--:|--:|"]
            out += [
                f"| `{r['function']}` | {r['ncalls']:,} | {r['tottime_s']:.3f} | {r['cumtime_s']:.3f} |"
                for r in prof[key]
            ]
        out.append("")
    if report.get("gateway_metrics"):
        out += ["## The gateway's own counters", ""]
        out.append("Read before each restart (scenarios marked fresh get a new gateway process) and at the end.")
        for snap in report["gateway_metrics"]:
            out += ["", f"Before {snap['until']}:" if snap["until"] != "end" else "At the end:", "", "```"]
            out += [*snap["lines"], "```"]
        out.append("")
    return "\n".join(out)


async def gateway_counters(port: int) -> list[str]:
    try:
        text = (await http_get(port, "/metrics")).decode()
    except (OSError, ConnectionError, TimeoutError) as exc:
        return [f"(metrics unavailable: {exc})"]
    keep = (
        "gateway_requests_total{",
        "gateway_upstream_errors_total{",
        "gateway_stream_violations_total{",
        "gateway_otlp_spans_total{",
        "gateway_otlp_exports_total{",
    )
    return [line for line in text.splitlines() if line.startswith(keep)]


# --- main ---------------------------------------------------------------------------------------------------


def _raise_nofile(target: int = 65536) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _concurrent(procs: list[Proc]) -> list[str]:
    mine = procstat.ancestors(os.getpid()) | {pid for proc in procs if proc.alive() for pid in proc.pids(max_age=0.0)}
    return procstat.others_like(
        ("bench.run", "bench.upstream", "bench.floor", "bench.otlp_sink", "messages-gateway serve", "litellm --config"),
        mine,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short windows: the default run takes ~2 minutes")
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=None,
        help=f"names or globs, comma or space separated (default: all): {DEFAULT}",
    )
    parser.add_argument("--litellm", action="store_true", help="also run burst/json/ttft through LiteLLM's proxy")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run burst/paced/json/ttft through a bare Python pass-through (bench/floor.py) on the gateway's core",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="also run every scenario but the soak through a second gateway with telemetry.otlp on (every request "
        "traced, exported to bench/otlp_sink.py): its CPU per request against the plain gateway's, same run",
    )
    parser.add_argument(
        "--tracing-control",
        action="store_true",
        help="with --tracing: the second gateway without telemetry.otlp (an A/A run: what measuring it second, in a "
        "fresh process, shows with nothing traced)",
    )
    parser.add_argument(
        "--tracing-limits",
        metavar="LIMITS",
        help="with --tracing: the second gateway's limits (off, memory, redis or a redis:// URL) in place of the "
        "run's --limits; with --tracing-control and --tracing-together, what the limits alone cost a request, "
        "measured in pairs as tracing is",
    )
    parser.add_argument(
        "--tracing-together",
        action="store_true",
        help="with --tracing-pairs: each pair's two windows at the same time, both gateways loaded at once on the "
        "gateway core (which the scheduler shares between them): the host's noise falls on both alike, at the "
        "scheduler's time scale rather than a window's",
    )
    parser.add_argument(
        "--tracing-options",
        default="",
        metavar="YAML",
        help="with --tracing: more telemetry.otlp settings for the traced gateway, ';'-separated "
        "('sample_ratio: 0; signals: [metrics]'): which part of tracing costs what",
    )
    parser.add_argument(
        "--tracing-pairs",
        type=int,
        default=0,
        metavar="N",
        help="with --tracing: N more windows of each gateway per scenario, alternating, the difference taken within "
        "each pair; the report gives their median and range",
    )
    parser.add_argument(
        "--no-governed",
        action="store_true",
        help="leave out the governed gateway (ledger on SQLite, limits over Redis, JWTs) that burst-c10 and json-c10 "
        "otherwise also run through",
    )
    parser.add_argument("--upstream-client", choices=("aiohttp", "h1", "httpx", "httpx-aiohttp"), default=None)
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes (--workers)")
    parser.add_argument("--soak-seconds", type=float, default=None, help="soak length (default 600; --quick 20)")
    parser.add_argument("--ttft-repeats", type=int, default=None, help="ttft-c1 repeats (default 6; --quick 4)")
    parser.add_argument("--ttft-requests", type=int, default=200, help="streams per ttft-c1 repeat and target")
    parser.add_argument("--gateway-cpu", type=int, default=0, help="core for the gateway (and LiteLLM)")
    parser.add_argument(
        "--no-pin", action="store_true", help="pin nothing (for --workers N: the workers may use every core)"
    )
    parser.add_argument("--load-cpu", type=int, default=1, help="core for the fake upstream and the load generator")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for <timestamp>.json and .md")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--limits",
        default="off",
        help="rate limits the requests never reach, to measure their cost: off (default), memory, redis (a "
        "redis-server of the run's own, on the load core) or a redis:// URL",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the gateway under cProfile (one worker; figures inflated by it): stats in the logs directory, "
        "the top functions in the report (select one scenario to profile it alone)",
    )
    parser.add_argument(
        "--store",
        default="off",
        help="the gateway's usage ledger: off (default), sqlite (a file in the run's directory) or a store.url",
    )
    return parser.parse_args(argv)


def select(patterns: list[str] | None) -> list[Scenario]:
    if not patterns:
        return list(SCENARIOS)
    wanted = [p for arg in patterns for p in re.split(r"[,\s]+", arg) if p]
    chosen: list[Scenario] = []
    for pattern in wanted:
        hits = [s for s in SCENARIOS if fnmatch.fnmatchcase(s.name, pattern)]
        if not hits:
            raise SystemExit(f"unknown scenario {pattern!r}; known: {', '.join(DEFAULT)}")
        chosen += [s for s in hits if s not in chosen]
    return [s for s in SCENARIOS if s in chosen]  # always in the canonical order


async def run(args: argparse.Namespace) -> dict[str, Any]:
    main_task = asyncio.current_task()
    if main_task is not None:  # SIGTERM cancels the run: its `finally` stops the upstream, gateway and LiteLLM
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    scenarios = select(args.scenarios)
    opts = Options(
        quick=args.quick,
        soak_s=args.soak_seconds if args.soak_seconds is not None else (20.0 if args.quick else 600.0),
        ttft_repeats=args.ttft_repeats or (4 if args.quick else 6),
        ttft_requests=args.ttft_requests,
        litellm=args.litellm,
        tracing_pairs=args.tracing_pairs,
        tracing_together=args.tracing_together,
    )
    floor_requested = args.floor and any(_floor_runs(s) for s in scenarios)
    tracing_requested = args.tracing and any(_tracing_runs(s) for s in scenarios)
    governed_requested = not args.no_governed and any(_governed_runs(s) for s in scenarios)
    cores = os.cpu_count() or 1
    pin = cores >= 2 and not args.no_pin
    load_cpu, gw_cpu = (args.load_cpu, args.gateway_cpu) if pin else (None, None)
    if load_cpu is not None:
        os.sched_setaffinity(0, {load_cpu})
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    work = Path(tempfile.mkdtemp(prefix=f"bench-{stamp}-"))
    client = args.upstream_client or os.environ.get("MESSAGES_GATEWAY_UPSTREAM_CLIENT") or "h1"
    report: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench.run", *sys.argv[1:]]),
        "machine": machine_facts(),
        "config": {
            "quick": args.quick,
            "workers": args.workers,
            "upstream_client": client,
            "gateway_cpu": gw_cpu,
            "load_cpu": load_cpu,
            "soak_s": opts.soak_s,
            "ttft_repeats": opts.ttft_repeats,
            "ttft_requests": opts.ttft_requests,
            "scenarios": [s.name for s in scenarios],
            "store": args.store,
            "limits": args.limits,
            "tracing": tracing_requested,
            "tracing_control": bool(tracing_requested and args.tracing_control),
            "tracing_options": args.tracing_options if tracing_requested else "",
            "tracing_together": bool(tracing_requested and args.tracing_together),
            "governed": governed_requested,
            "logs": str(work),
        },
        "results": [],
    }
    up_port, gw_port = _free_port(), _free_port()
    upstream = Proc(
        "upstream",
        [sys.executable, "-m", "bench.upstream", "--port", str(up_port)],
        work / "upstream.log",
        cpu=load_cpu,
        env=child_env(),
    )
    # --limits redis: a redis-server of the run's own, on the load core beside the fake upstream (in production
    # Redis is another machine's: unpinned, it would share the gateway's core and its CPU would inflate the
    # gateway's — measured: +60 µs a JSON request unpinned, +42-49 on the load core)
    limits = args.limits
    redis: Proc | None = None
    if limits == "redis":
        redis_port = _free_port()
        limits = f"redis://{HOST}:{redis_port}/0"
        redis = _redis_proc("redis", redis_port, work, load_cpu)
    second_limits = limits  # the second gateway's (--tracing-limits)
    second_redis: Proc | None = None
    if args.tracing_limits == "redis" and redis is not None:
        second_limits = limits  # the run's own redis-server, shared
    elif args.tracing_limits == "redis":
        second_port = _free_port()
        second_limits = f"redis://{HOST}:{second_port}/0"
        second_redis = _redis_proc("redis-second", second_port, work, load_cpu)
    elif args.tracing_limits is not None:
        second_limits = args.tracing_limits
    config = work / "gateway.yaml"
    store = args.store
    if store == "sqlite":
        store = f"sqlite:///{work}/ledger.db"
    config.write_text(gateway_config(gw_port, up_port, store, limits))
    if args.profile and args.workers != 1:
        raise SystemExit("--profile profiles one gateway process: use it with --workers 1")
    profile = work / "gateway.prof" if args.profile else None
    profiles: list[Path] = []
    gateway = Proc(
        "gateway",
        gateway_argv(config, gw_port, args.workers, profile),
        work / "gateway.log",
        cpu=gw_cpu,
        env=child_env({"MESSAGES_GATEWAY_UPSTREAM_CLIENT": client}),
    )
    system = System(upstream=upstream, upstream_port=up_port, load_cpu=load_cpu, sut_cpu=gw_cpu)
    procs = [upstream, gateway]

    async def start_gateway() -> None:
        if profile is not None and profile.exists():  # the stats of the process that stopped: kept aside
            profiles.append(profile.rename(work / f"gateway-{len(profiles) + 1}.prof"))
        gateway.start()
        await wait_ready(gateway, gw_port, "/healthz", 60.0)

    # --tracing: the OTLP sink on the load core, and a second gateway (same config + telemetry.otlp) on the
    # gateway's core, started once here and restarted with the gateway before fresh scenarios.
    traced: Proc | None = None
    tr_port = _free_port() if tracing_requested else 0
    tracing: dict[str, Any] = {}

    async def start_traced() -> None:
        assert traced is not None
        traced.start()
        await wait_ready(traced, tr_port, "/healthz", 60.0)

    async def start_tracing() -> None:
        nonlocal traced
        sink_port = _free_port()
        sink = Proc(
            "otlp-sink",
            [sys.executable, "-m", "bench.otlp_sink", "--port", str(sink_port)],
            work / "otlp-sink.log",
            cpu=load_cpu,
            env=child_env(),
        )
        procs.append(sink)
        sink.start()
        await wait_ready(sink, sink_port, "/healthz", 30.0)
        system.load_extra.append(sink)
        system.sink_port = sink_port
        traced_config = work / "gateway-traced.yaml"
        telemetry = "" if args.tracing_control else tracing_yaml(sink_port, args.tracing_options)
        traced_config.write_text(gateway_config(tr_port, up_port, store, second_limits) + telemetry)
        traced = Proc(
            TRACED,
            gateway_argv(traced_config, tr_port, args.workers),
            work / "gateway-traced.log",
            cpu=gw_cpu,
            env=child_env({"MESSAGES_GATEWAY_UPSTREAM_CLIENT": client}),
        )
        procs.append(traced)
        tracing.update(
            {
                "config": telemetry,
                "limits": second_limits,
                "sink_port": sink_port,
                "port": tr_port,
                "log": str(traced.log),
                "sink_log": str(sink.log),
            }
        )
        report["tracing"] = tracing
        await start_traced()
        # the plain gateway first, then the traced one, in every scenario's phases
        suts = dict(system.suts)
        system.suts.clear()
        system.suts["gateway"] = suts.pop("gateway")
        system.suts[TRACED] = (traced, Target(TRACED, HOST, tr_port))
        system.suts.update(suts)
        system.restart[TRACED] = start_traced
        await asyncio.sleep(0.5)
        tracing["idle_rss_mb"] = _mb(traced.rss().rss_kb)
        print(f"[bench] otlp sink :{sink_port} (pid {sink.pid}), gateway with tracing :{tr_port} (pid {traced.pid})")

    async def start_redis(proc: Proc, port: int) -> None:
        """A redis-server of the run's own, on the load core: counted there as ours, stopped with the rest."""
        procs.append(proc)
        proc.start()
        await _wait_tcp(proc, port, 30.0)
        system.load_extra.append(proc)

    # The governed gateway (issue 36): in every run that has burst-c10 or json-c10, unless --no-governed
    governed: Proc | None = None
    gv_port = _free_port()
    idp: IdentityProvider | None = None
    governed_info: dict[str, Any] = {}

    async def start_governed() -> None:
        assert governed is not None
        governed.start()
        await wait_ready(governed, gv_port, "/healthz", 60.0)

    async def start_governance() -> None:
        nonlocal governed, idp
        report["governed"] = governed_info
        if shutil.which("redis-server") is None:
            governed_info["error"] = "no redis-server on this machine"
            return
        gv_redis_port = _free_port()
        await start_redis(_redis_proc("governed-redis", gv_redis_port, work, load_cpu), gv_redis_port)
        idp = IdentityProvider(HOST)
        await idp.start()
        ledger = work / "governed-ledger.db"
        config_text = gateway_config(
            gv_port, up_port, f"sqlite:///{ledger}", f"redis://{HOST}:{gv_redis_port}/0", governed_yaml(idp)
        )
        gv_config = work / "gateway-governed.yaml"
        gv_config.write_text(config_text)
        governed = Proc(
            GOVERNED,
            gateway_argv(gv_config, gv_port, args.workers),
            work / "gateway-governed.log",
            cpu=gw_cpu,
            env=child_env({"MESSAGES_GATEWAY_UPSTREAM_CLIENT": client}),
        )
        procs.append(governed)
        governed_info.update({"config": config_text, "port": gv_port, "log": str(governed.log), "ledger": str(ledger)})
        await start_governed()
        system.suts[GOVERNED] = (
            governed,
            Target(GOVERNED, HOST, gv_port, headers=(("authorization", f"Bearer {idp.token()}"),)),
        )
        system.restart[GOVERNED] = start_governed
        await asyncio.sleep(0.5)
        governed_info["idle_rss_mb"] = _mb(governed.rss().rss_kb)
        print(f"[bench] governed gateway :{gv_port} (pid {governed.pid}), its redis :{gv_redis_port}, JWKS :{idp.port}")

    try:
        if redis is not None:
            await start_redis(redis, redis_port)
            print(f"[bench] redis-server :{redis_port} (pid {redis.pid}) on the load core")
        if second_redis is not None:
            await start_redis(second_redis, second_port)
            print(f"[bench] the second gateway's redis-server :{second_port} (pid {second_redis.pid}) on the load core")
        upstream.start()
        await wait_ready(upstream, up_port, "/healthz", 30.0)
        await start_gateway()
        system.suts["gateway"] = (gateway, Target("gateway", HOST, gw_port))
        system.restart["gateway"] = start_gateway
        await asyncio.sleep(0.5)
        report["gateway_idle_rss_mb"] = _mb(gateway.rss().rss_kb)
        concurrent = set(_concurrent(procs))
        if concurrent:
            print("[bench] WARNING: another benchmark or gateway is running; figures will be disturbed:")
            print("\n".join(f"[bench]   {c}" for c in sorted(concurrent)))
        print(f"[bench] upstream :{up_port} (pid {upstream.pid}), gateway :{gw_port} (pid {gateway.pid}); logs {work}")
        if tracing_requested:
            await start_tracing()
        if governed_requested:
            await start_governance()
        if floor_requested:
            fl_port = _free_port()
            floor = Proc(
                "floor",
                [sys.executable, "-m", "bench.floor", "--port", str(fl_port), "--upstream", f"http://{HOST}:{up_port}"],
                work / "floor.log",
                cpu=gw_cpu,
                env=child_env(),
            )
            procs.append(floor)
            floor.start()
            await wait_ready(floor, fl_port, "/healthz", 30.0)
            system.suts["floor"] = (floor, Target("floor", HOST, fl_port))
            print(f"[bench] floor (a bare pass-through) :{fl_port} (pid {floor.pid})")
        if opts.litellm:
            from bench import litellm

            info: dict[str, Any] = {}
            report["litellm"] = info
            try:
                lt_proc, lt_target, version = await litellm.start(
                    work, up_port, [s.model for s in scenarios if s.litellm], cpu=gw_cpu, env=child_env()
                )
                procs.append(lt_proc)
                system.suts["litellm"] = (lt_proc, lt_target)
                info |= {"version": version, "idle_rss_mb": _mb(lt_proc.rss().rss_kb)}
                print(f"[bench] litellm {version} on :{lt_target.port} (pid {lt_proc.pid})")
            except Exception as exc:  # optional: report why and carry on without it
                info["error"] = f"{type(exc).__name__}: {exc}"
                print(f"[bench] litellm unavailable: {info['error']}")
        counters: list[dict[str, Any]] = []
        for i, s in enumerate(scenarios):
            t0 = time.perf_counter()
            print(f"[bench] {s.name}: {s.about} …", flush=True)
            if s.fresh and i > 0:
                counters.append({"until": s.name, "lines": await gateway_counters(gw_port)})
                gateway.stop()
                await start_gateway()
                if traced is not None and _tracing_runs(s):
                    traced.stop()
                    await start_traced()
                if governed is not None and _governed_runs(s):
                    governed.stop()
                    await start_governed()
                await asyncio.sleep(0.5)
            entry = await run_scenario(system, s, opts)
            if s.compare:
                entry["cpu_vs"] = cpu_versus(entry, report["results"], s)
            versus_tracing = tracing_versus(entry)
            if versus_tracing is not None:
                entry["tracing"] = versus_tracing
            versus_governed = governed_versus(entry)
            if versus_governed is not None:
                entry["governed"] = versus_governed
            report["results"].append(entry)
            for name in entry["phases"]:
                if name == "direct":
                    continue
                metric, dv, gv, ratio, cpu, added = _headline(entry, name)
                errs = "/".join(str(entry["phases"][n]["errors"]) for n in entry["phases"])
                versus = _versus(entry) if name == "gateway" else ""
                if name == GOVERNED and entry.get("governed"):
                    v = entry["governed"]
                    versus = f"governed vs off {_fmt(v['on_us'])} / {_fmt(v['off_us'])} µs per {v['unit']}"
                if name == TRACED and entry.get("tracing"):
                    v = entry["tracing"]
                    versus = (
                        f"tracing on vs off {_fmt(v['on_us'])} / {_fmt(v['off_us'])} µs per {v['unit']} "
                        f"(+{_fmt(v['difference_us'])} µs), spans exported {v['exported'].get('spans_exported')}"
                    )
                print(
                    f"[bench]   {name}: {metric} direct {_fmt(dv)} vs {_fmt(gv)} (ratio {ratio}), CPU {cpu}, "
                    f"{versus + ', ' if versus else ''}added TTFT {added}, errors {errs}  "
                    f"[{time.perf_counter() - t0:.0f} s]",
                    flush=True,
                )
        counters.append({"until": "end", "lines": await gateway_counters(gw_port)})
        report["gateway_metrics"] = counters
        report["concurrent_processes"] = sorted(concurrent | set(_concurrent(procs)))
        report["crashes"] = system.crashes
        report["gateway_alive_at_end"] = gateway.alive()
        report["gateway_log_problems"] = [
            line for line in gateway.log_tail(400).splitlines() if re.search(r"ERROR|Traceback|Exception", line)
        ][:20]
        if traced is not None:
            tracing["counters"] = [
                line for line in await gateway_counters(tr_port) if line.startswith("gateway_otlp_")
            ] or ["(no gateway_otlp_* series in its /metrics)"]
            tracing["alive_at_end"] = traced.alive()
            traced.stop()  # SIGTERM: it sends what is still queued (and its histograms) before it exits
            assert system.sink_port is not None
            tracing["sink_at_end"] = await sink_counts(system.sink_port)
            tracing["log_problems"] = [
                line
                for line in traced.log_tail(400).splitlines()
                if re.search(r"ERROR|WARNING|Traceback|Exception|otlp", line)
            ][:20]
        if governed is not None:
            governed_info["alive_at_end"] = governed.alive()
            governed_info["jwks_fetches"] = idp.fetches if idp is not None else None
            governed_info["log_problems"] = [
                line for line in governed.log_tail(400).splitlines() if re.search(r"ERROR|Traceback|Exception", line)
            ][:20]
            governed.stop()
            governed_info["ledger_rows"] = _ledger_rows(Path(governed_info["ledger"]))
    finally:
        for proc in reversed(procs):
            proc.stop()
        if idp is not None:
            await idp.aclose()
    if profile is not None:
        if profile.exists():
            profiles.append(profile.rename(work / f"gateway-{len(profiles) + 1}.prof"))
        report["profiles"] = [profile_summary(p) for p in profiles]
    return report


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:12} {s.model:16} C={s.concurrency:<5} {s.about}")
        return
    _raise_nofile()
    import uvloop

    try:
        report = uvloop.run(run(args))
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("[bench] interrupted: the upstream, gateway and LiteLLM were stopped; nothing written", file=sys.stderr)
        raise SystemExit(130) from None
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / datetime.fromisoformat(report["started"]).strftime("%Y%m%d-%H%M%S")
    markdown = render_markdown(report)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown)
    print()
    print(markdown)
    print(f"[bench] wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()

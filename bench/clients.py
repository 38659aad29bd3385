"""``python -m bench.clients``: the gateway's own clients against the libraries they replace, in two code versions.

The gateway speaks HTTP/1.1 to providers through its own client (``make_client("h1")``, ``gateway/wire/upstream.py``)
and admits a request under shared limits over Redis through its own client (``gateway/governance/redis_client.py``,
one ``EVALSHA`` of the limiter's admission script per request: ``RedisCounters.admit``). This measures what each
costs the process that uses it, next to aiohttp and httpx (behind the same seam, ``make_client``) and to redis-py's
asyncio client (hiredis parsing its replies when installed) running the same script with the same keys and
arguments, and does it for two trees of the code (by default the working tree and ``/tmp/base37``, a worktree of
the commit before issue 37's fixes), so that a fix's cost shows as new / old, client by client.

What runs where: the fake provider (:mod:`bench.upstream`, ``taskset -c 1``) and ``redis-server`` (``--save ''
--appendonly no``, ``taskset -c 1``) on core 1; each measurement in a child process of its own that pins itself to
core 0, imports ``gateway`` from one tree (``PYTHONPATH=<tree>``, ``python -P``: nothing else on the path first),
runs uvloop, and for each unit does a warm-up, then N requests (or admissions) at concurrency 1 or 10
(``asyncio.gather`` of 10 workers), and reads its own CPU (``getrusage(RUSAGE_SELF)``, user + sys, every thread)
before and after. The figure is µs of that CPU per request: the client's whole cost in the process, event loop
included, the server's excluded. One child per (client, tree, repeat); in each repeat the two trees of a client run
back to back, old first in even repeats and new first in odd ones, so that drift of the host falls on both.

Units: ``json`` (a non-streamed answer, ``bench-d200``, read whole with ``resp.read()``), ``stream`` (200 deltas,
206 events, in one upstream write: ``bench-d200`` with ``stream: true``, read with ``resp.chunks()``), ``paced``
(the same stream one event per millisecond, C = 10 only: one read per event, the per-read cost), and ``admit``
(one admission: 3 checks, 2 adds, a never-reached limit). Results go to ``bench/results/clients-<timestamp>.{json,md}``.

    python -m bench.clients                         # 2000 JSON requests / admissions, 500 streams per unit, 3 repeats
    python -m bench.clients --requests 500 --repeats 1 --units 'h1-*' 'ours-*'
    python -m bench.clients --old /tmp/base37 --new .   # the trees (each needs its compiled extensions)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fnmatch
import gc
import json
import os
import platform
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["UNITS", "Unit", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HOST = "127.0.0.1"
CLIENT_CORE = 0
SERVER_CORE = 1
MODEL = "bench-d200"
PACED_MODEL = "bench-d200-p1"
EVENTS = 206  # message_start, content_block_start, ping, 200 deltas, content_block_stop, message_delta, message_stop
HTTP_CLIENTS = ("h1", "aiohttp", "httpx")
REDIS_CLIENTS = ("ours", "redis-py")
OURS = {"http": "h1", "redis": "ours"}


@dataclass(frozen=True, slots=True)
class Unit:
    name: str  # <client>-<kind>-c<concurrency>
    client: str  # h1 | aiohttp | httpx | ours | redis-py
    kind: str  # json | stream | paced | admit
    concurrency: int

    @property
    def family(self) -> str:
        return "redis" if self.kind == "admit" else "http"


def _units() -> tuple[Unit, ...]:
    out = []
    for client in HTTP_CLIENTS:
        for kind in ("json", "stream"):
            out += [Unit(f"{client}-{kind}-c{c}", client, kind, c) for c in (1, 10)]
        out.append(Unit(f"{client}-paced-c10", client, "paced", 10))
    for client in REDIS_CLIENTS:
        out += [Unit(f"{client}-admit-c{c}", client, "admit", c) for c in (1, 10)]
    return tuple(out)


UNITS = _units()

# --- the child: one client, one tree, its units -----------------------------------------------------------------

_HEADERS = {
    "content-type": "application/json",
    "x-api-key": "sk-ant-bench-0000000000000000",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "prompt-caching-2024-07-31",
}


def _body(model: str, stream: bool) -> bytes:
    request = {
        "model": model,
        "max_tokens": 1024,
        "stream": stream,
        "messages": [{"role": "user", "content": "Say the benchmark tokens."}],
    }
    return json.dumps(request, separators=(",", ":")).encode()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _gather(concurrency: int, total: int, one: Callable[[], Awaitable[int]]) -> int:
    """``total`` calls of ``one`` by ``concurrency`` workers, each awaiting its own in turn; the sum of their sizes."""

    async def worker(count: int) -> int:
        size = 0
        for _ in range(count):
            size += await one()
        return size

    if concurrency == 1:
        return await worker(total)
    shares = [total // concurrency + (1 if i < total % concurrency else 0) for i in range(concurrency)]
    return sum(await asyncio.gather(*(worker(n) for n in shares)))


async def _timed(unit: dict[str, Any], one: Callable[[], Awaitable[int]]) -> dict[str, Any]:
    concurrency, count, warm = unit["concurrency"], unit["count"], unit["warmup"]
    await _gather(concurrency, warm, one)
    gc.collect()
    cpu0, wall0 = _cpu(), time.perf_counter()
    size = await _gather(concurrency, count, one)
    cpu1, wall1 = _cpu(), time.perf_counter()
    per = count * (EVENTS if unit["kind"] == "paced" else 1)  # a paced stream: per event, as bench.run reports it
    return {
        "name": unit["name"],
        "count": count,
        "cpu_s": cpu1 - cpu0,
        "wall_s": wall1 - wall0,
        "us": (cpu1 - cpu0) / per * 1e6,
        "bytes": size,
    }


async def _http_unit(unit: dict[str, Any], port: int) -> dict[str, Any]:
    from gateway.wire.upstream import Timeouts, make_client

    client = make_client(unit["client"])
    timeouts = Timeouts(10, 60)
    url = f"http://{HOST}:{port}/v1/messages"
    kind = unit["kind"]
    body = _body(PACED_MODEL if kind == "paced" else MODEL, kind != "json")
    headers = {**_HEADERS, "accept": "application/json" if kind == "json" else "text/event-stream"}

    async def one() -> int:
        resp = await client.send("POST", url, headers=headers, body=body, timeouts=timeouts)
        if resp.status != 200:
            raise RuntimeError(f"{unit['name']}: status {resp.status}")
        if kind == "json":
            size = len(await resp.read())
        else:
            size = 0
            async for chunk in resp.chunks():
                size += len(chunk)
        await resp.aclose()
        return size

    try:
        return await _timed(unit, one)
    finally:
        await client.aclose()


def _admission(scope: str) -> tuple[list[tuple[str, float]], list[tuple[str, float, int]]]:
    """One key's admission as ``Limiter._plan`` makes it for requests, tokens and in-flight limits that are never
    reached: 3 checks, 2 adds."""
    minute = int(time.time() // 60)
    checks = [(f"{scope}|requests|{minute}", 1e12), (f"{scope}|tokens|{minute}", 1e12), (f"{scope}|inflight", 1e12)]
    adds = [(f"{scope}|requests|{minute}", 1.0, 120), (f"{scope}|inflight", 1.0, 3600)]
    return checks, adds


async def _redis_unit(unit: dict[str, Any], port: int) -> dict[str, Any]:
    from gateway.governance import limits

    checks, adds = _admission("key:bench-" + unit["client"])
    url = f"redis://{HOST}:{port}/0"
    if unit["client"] == "ours":
        counters = limits.RedisCounters(url)

        async def one() -> int:
            failed, values = await counters.admit(checks, adds)
            if failed >= 0:
                raise RuntimeError(f"refused at check {failed}")
            return len(values)

        close: Callable[[], Awaitable[None]] = counters.aclose
    else:  # redis-py, as the limiter used it before its own client (73d8c5b): the same script, keys and arguments
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url, socket_timeout=limits.STORE_TIMEOUT)
        script = client.register_script(limits._ADMIT)
        prefix = "mgw:"

        async def one() -> int:
            keys = [prefix + k for k, _ in checks] + [prefix + k for k, _, _ in adds]
            args = [len(checks), *(v for _, v in checks), *(a for _, a, _ in adds), *(t for _, _, t in adds)]
            failed, values = await script(keys=keys, args=args)
            if int(failed) >= 0:
                raise RuntimeError(f"refused at check {failed}")
            return len([float(v) for v in values])

        close = client.aclose
    try:
        return await _timed(unit, one)
    finally:
        await close()


async def _child(spec: dict[str, Any]) -> dict[str, Any]:
    import gateway

    out: dict[str, Any] = {"gateway": gateway.__file__, "pid": os.getpid(), "units": []}
    if spec["units"] and spec["units"][0]["client"] == "redis-py":
        import redis.utils

        out["hiredis"] = bool(redis.utils.HIREDIS_AVAILABLE)
    for unit in spec["units"]:
        if unit["kind"] == "admit":
            out["units"].append(await _redis_unit(unit, spec["redis_port"]))
        else:
            out["units"].append(await _http_unit(unit, spec["upstream_port"]))
    return out


def child_main(spec_json: str) -> None:
    os.sched_setaffinity(0, {CLIENT_CORE})
    import uvloop

    result = uvloop.run(_child(json.loads(spec_json)))
    print(json.dumps(result), flush=True)


# --- the parent: servers, children, the report ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, limit_s: float = 15.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"[clients] {what} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise SystemExit(f"[clients] {what} did not listen on {port} within {limit_s:.0f} s")


@contextlib.contextmanager
def _servers(logs: Path, redis_server: str) -> Iterator[tuple[int, int]]:
    """The fake provider and redis-server on core 1; their ports."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        up_port, redis_port = _free_port(), _free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(logs / "upstream.log", "wb") as log:
            cmd = ["taskset", "-c", str(SERVER_CORE), sys.executable, "-m", "bench.upstream", "--port", str(up_port)]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        _wait_port(up_port, procs[-1], "bench.upstream")
        with open(logs / "redis.log", "wb") as log:
            cmd = ["taskset", "-c", str(SERVER_CORE), redis_server, "--port", str(redis_port), "--bind", HOST]
            cmd += ["--save", "", "--appendonly", "no", "--dir", str(logs)]
            procs.append(subprocess.Popen(cmd, cwd=logs, stdout=log, stderr=subprocess.STDOUT))
        _wait_port(redis_port, procs[-1], "redis-server")
        yield up_port, redis_port
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _core_busy(core: int) -> float:
    from bench import procstat

    return procstat.core_busy_seconds().get(core, 0.0)


def _run_child(tree: Path, spec: dict[str, Any], logs: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # no proxy of the host's on loopback
    env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    busy0, mine0 = _core_busy(CLIENT_CORE), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, timeout=600, check=False)
    wall = time.perf_counter() - t0
    busy1, mine1 = _core_busy(CLIENT_CORE), resource.getrusage(resource.RUSAGE_CHILDREN)
    (logs / f"child-{os.getpid()}-{time.monotonic_ns()}.err").write_bytes(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"[clients] child failed ({tree}): {proc.stderr.decode(errors='replace')[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    if not str(result["gateway"]).startswith(str(tree.resolve()) + os.sep):
        raise SystemExit(f"[clients] the child imported {result['gateway']}, not from {tree}")
    result["wall_s"] = wall
    result["core0_busy_s"] = busy1 - busy0  # every process's time on the client's core in the child's lifetime
    child = (mine1.ru_utime - mine0.ru_utime) + (mine1.ru_stime - mine0.ru_stime)
    result["child_cpu_s"] = child  # the child's whole CPU, its imports and warm-ups included
    result["core0_others"] = max(0.0, result["core0_busy_s"] - child) / wall  # the share of core 0 others took
    return result


def _expected_bytes() -> dict[str, int]:
    from bench.upstream import canonical_body

    return {
        "json": len(canonical_body(MODEL, False)),
        "stream": len(canonical_body(MODEL, True)),
        "paced": len(canonical_body(PACED_MODEL, True)),
    }


def _rev(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, check=False)
    rev = out.stdout.decode().strip() or "?"
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no", "--", "gateway", "adapters"],
        capture_output=True,
        check=False,
    )
    return rev + (" + uncommitted changes" if dirty.stdout.strip() else "")


def _count(unit: Unit, args: argparse.Namespace) -> int:
    if unit.kind == "paced":
        return int(args.paced)
    if unit.kind == "stream":
        return int(args.streams)
    return int(args.requests)


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _fmt(s: dict[str, float]) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f} to {s['max']:.1f})"


def _ratio(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f} to {s['max']:.2f})"


def _what(unit: Unit) -> str:
    per = {"json": "request", "stream": "stream", "paced": "event", "admit": "admission"}[unit.kind]
    return f"{unit.kind} c{unit.concurrency} (per {per})"


def _report(
    units: list[Unit], data: dict[str, dict[str, list[float]]], meta: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The markdown and the JSON summary: per unit and tree the median and range of µs per request; new / old per
    unit (the ratio of the medians, and the range of the repeats' paired ratios); the competitors over ours."""
    rows: dict[str, Any] = {}
    for unit in units:
        old, new = data[unit.name]["old"], data[unit.name]["new"]
        paired = [n / o for o, n in zip(old, new, strict=True)]
        rows[unit.name] = {
            "old": _summary(old),
            "new": _summary(new),
            "new_over_old": {**_summary(paired), "median": statistics.median(new) / statistics.median(old)},
        }
    lines = [
        f"# bench.clients — {meta['started']}",
        "",
        f"`{meta['command']}`",
        "",
        f"old: `{meta['old']['tree']}` ({meta['old']['rev']}); new: `{meta['new']['tree']}` ({meta['new']['rev']}). "
        f"{meta['repeats']} repeats, alternating; µs of the client process's CPU (user + sys) per request / stream / "
        "admission: median (min to max of the repeats). new / old: ratio of the medians (range of the paired ratios).",
        "",
        "| unit | client | old µs | new µs | new / old |",
        "|---|---|--:|--:|--:|",
    ]
    for unit in units:
        r = rows[unit.name]
        what = _what(unit)
        lines.append(f"| {what} | {unit.client} | {_fmt(r['old'])} | {_fmt(r['new'])} | {_ratio(r['new_over_old'])} |")
    lead_lines = ["", "The lead: a competitor's µs over ours in the same tree (medians).", ""]
    lead_lines += [
        "| unit | competitor / ours | old tree | new tree | competitor old tree / ours new tree |",
        "|---|---|--:|--:|--:|",
    ]
    leads: dict[str, Any] = {}
    for unit in units:
        ours = OURS[unit.family]
        if unit.client == ours:
            continue
        mine = f"{ours}-{unit.kind}-c{unit.concurrency}"
        if mine not in rows:
            continue
        lead = {tree: rows[unit.name][tree]["median"] / rows[mine][tree]["median"] for tree in ("old", "new")}
        lead["cross"] = rows[unit.name]["old"]["median"] / rows[mine]["new"]["median"]
        leads[f"{unit.name}/{mine}"] = lead
        what = _what(unit)
        lead_lines.append(
            f"| {what} | {unit.client} / {ours} | {lead['old']:.2f} | {lead['new']:.2f} | {lead['cross']:.2f} |"
        )
    lines += lead_lines
    lines += [
        "",
        f"Client on core {CLIENT_CORE}, fake provider and redis-server on core {SERVER_CORE}; warm-up "
        f"{meta['warmup']} before each unit; per unit {meta['counts']}. Busiest share of core {CLIENT_CORE} taken by "
        f"other processes during a child: {meta['core0_others_max']:.0%}. Started {meta['started']}, "
        f"ended {meta['ended']}.",
    ]
    if meta["odd"]:
        lines += ["", "Odd:", *(f"- {o}" for o in meta["odd"])]
    return "\n".join(lines) + "\n", {"rows": rows, "leads": leads}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.clients", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="JSON requests and admissions per unit")
    parser.add_argument("--streams", type=int, default=None, help="streams per unit (default: requests / 4)")
    parser.add_argument("--paced", type=int, default=None, help="paced streams per unit (default: requests / 10)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--old", type=Path, default=Path("/tmp/base37"), help="the older tree (a git worktree)")
    parser.add_argument("--new", type=Path, default=ROOT, help="the newer tree (default: this one)")
    parser.add_argument("--units", nargs="*", default=["*"], help="unit names or globs (e.g. 'h1-*' '*-admit-*')")
    parser.add_argument("--redis-server", default="redis-server")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for clients-<timestamp>.json and .md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child)
    args.streams = args.streams if args.streams is not None else max(10, args.requests // 4)
    args.paced = args.paced if args.paced is not None else max(10, args.requests // 10)
    if shutil.which(args.redis_server) is None:
        raise SystemExit(f"[clients] no {args.redis_server} on PATH")
    units = [u for u in UNITS if any(fnmatch.fnmatch(u.name, p) for p in args.units)]
    if not units:
        raise SystemExit(f"[clients] no unit matches {args.units}; there are {', '.join(u.name for u in UNITS)}")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for tree in trees.values():
        if not (tree / "gateway" / "__init__.py").exists():
            raise SystemExit(f"[clients] {tree} holds no gateway package")
    groups: dict[str, list[Unit]] = {}
    for unit in units:
        groups.setdefault(unit.client, []).append(unit)
    expected = _expected_bytes()
    revs = {which: _rev(tree) for which, tree in trees.items()}
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    data: dict[str, dict[str, list[float]]] = {u.name: {"old": [], "new": []} for u in units}
    runs: list[dict[str, Any]] = []
    odd: list[str] = []
    hiredis: bool | None = None
    logs = Path(tempfile.mkdtemp(prefix="bench-clients-"))
    print(f"[clients] {len(units)} units, {args.repeats} repeats, logs in {logs}", flush=True)
    with _servers(logs, args.redis_server) as (up_port, redis_port):
        for rep in range(args.repeats):
            order = ("old", "new") if rep % 2 == 0 else ("new", "old")
            for client, members in groups.items():
                spec_units = [
                    {
                        "name": u.name,
                        "client": u.client,
                        "kind": u.kind,
                        "concurrency": u.concurrency,
                        "count": _count(u, args),
                        "warmup": max(20, _count(u, args) // 10),
                    }
                    for u in members
                ]
                spec = {"units": spec_units, "upstream_port": up_port, "redis_port": redis_port}
                for which in order:
                    result = _run_child(trees[which], spec, logs)
                    own = sum(u["cpu_s"] for u in result["units"])
                    result.update(repeat=rep, tree=which, client=client)
                    runs.append(result)
                    hiredis = result.get("hiredis", hiredis)
                    for got in result["units"]:
                        data[got["name"]][which].append(got["us"])
                        kind = next(u.kind for u in members if u.name == got["name"])
                        if kind in expected and got["bytes"] != expected[kind] * got["count"]:
                            odd.append(
                                f"{got['name']} ({which}, repeat {rep}): {got['bytes']} bytes read, "
                                f"expected {expected[kind] * got['count']}"
                            )
                    shown = ", ".join(f"{u['name']} {u['us']:.1f}" for u in result["units"])
                    print(
                        f"[clients] {rep} {which:3} {shown} µs (child {result['wall_s']:.1f} s, measured CPU "
                        f"{own:.2f} s, others on core {CLIENT_CORE} {result['core0_others']:.0%})",
                        flush=True,
                    )
    ended = datetime.now(UTC)
    others = [r["core0_others"] for r in runs]
    for which, tree in trees.items():
        if _rev(tree) != revs[which]:
            odd.append(f"the {which} tree changed during the run: {revs[which]} at the start, {_rev(tree)} at the end")
    if hiredis is False:
        odd.append("redis-py ran without hiredis (its pure-Python parser)")
    meta: dict[str, Any] = {
        "command": "python -m bench.clients " + shlex.join(sys.argv[1:] if argv is None else argv),
        "started": started.isoformat(timespec="seconds"),
        "ended": ended.isoformat(timespec="seconds"),
        "old": {"tree": str(trees["old"]), "rev": revs["old"]},
        "new": {"tree": str(trees["new"]), "rev": revs["new"]},
        "repeats": args.repeats,
        "warmup": "a tenth of the unit's count (at least 20), at its concurrency",
        "counts": f"{args.requests} JSON requests / admissions, {args.streams} streams, {args.paced} paced streams",
        "core0_others_max": max(others, default=0.0),
        "hiredis": hiredis,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "kernel": platform.release()},
        "loadavg": os.getloadavg(),
        "odd": odd,
    }
    md, summary = _report(units, data, meta)
    out = {**meta, **summary, "values_us": data, "runs": runs, "logs": str(logs)}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"clients-{stamp}"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    stem.with_suffix(".md").write_text(md)
    print(md)
    print(f"[clients] wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()

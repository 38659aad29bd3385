"""Whole requests through the gateway's ASGI app in one process, no HTTP server in front of it:
``python -m bench.request_loop`` — CPU per request of the gateway with tracing off and on (issue 35, item 6),
the same requests as ``burst-c10`` (streams) and ``json-c10``, ``-c`` of them at once.

The served bench (``python -m bench.run --tracing``) measures a gateway process among the load generator, the
fake upstream and the kernel on two shared cores; this measures what the gateway's own code spends in a request,
its HTTP server and the client's sockets left out (they do the same work traced or not); each request's scope
carries what that server puts there (the body-received hint, the disconnect hook), so the edge takes the path
it takes served. The fake upstream
(:mod:`bench.upstream`) and the OTLP sink (:mod:`bench.otlp_sink`) run in a child process pinned to core 1; each
measurement runs in a fresh child pinned to core 0 — tracing off and on alternately, ``--rounds`` times, each a
warm-up then ``--windows`` windows of ``-n`` requests, the minimum window kept (the host's noise only ever adds).
The report: each round's CPU per request off and on and their difference, then the median difference.

``--instructions DIR``: the same children under valgrind's callgrind, which counts the instructions the gateway's
process executes in one window of ``-n`` requests (``callgrind_control`` zeroes the counts before it and dumps
them after; the dumps stay in DIR for ``callgrind_annotate``). Not time, but the same to 0.3 % from run to run
on this noisy host, where a time moves 30 %: what a change adds or removes shows to the thousand instructions."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
BODIES = {
    stream: json.dumps(
        {
            "model": "bench-d200",
            "max_tokens": 1024,
            "stream": stream,
            "messages": [{"role": "user", "content": "Say the benchmark tokens."}],
        },
        separators=(",", ":"),
    ).encode()
    for stream in (True, False)
}


def _config(
    upstream_port: int, sink_port: int | None, options: str = "", limits: str = "off", store: str = "off"
) -> str:
    from bench.run import gateway_config, tracing_yaml

    if store == "sqlite":  # a file of the child's own, gone with it
        import tempfile

        store = f"sqlite:///{tempfile.mkdtemp(prefix='request-loop-')}/ledger.db"
    yaml = gateway_config(0, upstream_port, store=store, limits=limits)
    return yaml + (tracing_yaml(sink_port, options) if sink_port is not None else "")


async def _requests(app: Any, stream: bool, n: int, c: int) -> int:
    """``n`` requests, ``c`` at a time; the number answered 200 with a whole body."""
    from gateway.http.server import BODY_RECEIVED, DISCONNECT_HOOK, DisconnectHook

    body = BODIES[stream]
    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream" if stream else b"application/json"),
        (b"anthropic-version", b"2023-06-01"),
        (b"content-length", str(len(body)).encode()),
    ]
    ok = 0

    async def one() -> None:
        nonlocal ok
        delivered = False
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never  # the client stays: the edge's disconnect watcher waits here, cancelled at the end
            return {"type": "http.disconnect"}

        status = 0
        ended = False

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = message["status"]
            elif not message.get("more_body", False):
                ended = True

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/messages",
            "raw_path": b"/v1/messages",
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": (HOST, 40000),
            "server": (HOST, 8080),
            "state": {},
            # what the gateway's own server (gateway/http/server.py) puts in every scope: the body is all here (the
            # edge reads it without a timeout), and a hook it calls when the client goes (no watcher task)
            BODY_RECEIVED: True,
            DISCONNECT_HOOK: DisconnectHook(),
        }
        await app(scope, receive, send)
        ok += status == 200 and ended

    async def worker(count: int) -> None:
        for _ in range(count):
            await one()

    await asyncio.gather(*(worker(n // c + (i < n % c)) for i in range(c)))
    return ok


def _callgrind(command: str) -> None:
    """``callgrind_control`` on this process (blocking on purpose: nothing is in flight between windows)."""
    subprocess.run(["callgrind_control", command, str(os.getpid())], check=True, capture_output=True)


async def _measure(config: str, stream: bool, n: int, c: int, windows: int, counted: bool = False) -> float:
    """The minimum CPU per request (µs) over ``windows`` windows of ``n`` requests, after a warm-up. ``counted``:
    under callgrind, each window's instructions dumped to a file of their own."""
    from gateway.http.app import create_app
    from gateway.settings import parse_settings

    app = create_app(parse_settings(config, environ={}), watch_interval_s=None)
    started: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    lifespan_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal lifespan_sent
        if not lifespan_sent:
            lifespan_sent = True
            return {"type": "lifespan.startup"}
        await stop
        return {"type": "lifespan.shutdown"}

    async def send(message: dict[str, Any]) -> None:
        await started.put(message)

    life = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send))
    message = await started.get()
    if message["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the gateway did not start: {message}")
    try:
        if await _requests(app, stream, n, c) != n:  # the warm-up, checked
            raise RuntimeError("the warm-up's requests were not all answered 200")
        best = float("inf")
        for _ in range(windows):
            if counted:  # callgrind's counts from zero for this window, dumped at its end
                _callgrind("-z")
            before = time.process_time()
            answered = await _requests(app, stream, n, c)
            spent = time.process_time() - before
            if counted:
                _callgrind("-d")
            if answered != n:
                raise RuntimeError(f"{n - answered} of {n} requests not answered 200")
            best = min(best, spent / n * 1e6)
        return best
    finally:
        stop.set_result(None)
        await life


def _child(args: argparse.Namespace) -> None:
    os.sched_setaffinity(0, {0})
    import uvloop

    config = _config(args.upstream_port, args.sink_port, args.options, args.limits, args.store)
    measured = uvloop.run(_measure(config, args.stream, args.n, args.c, args.windows, args.counted))
    print(json.dumps(measured), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _services() -> tuple[subprocess.Popen[bytes], int, int]:
    """The fake upstream and the OTLP sink, in one child pinned to core 1."""
    upstream, sink = _free_port(), _free_port()
    code = (
        "import asyncio, os, uvloop\n"
        "from bench import upstream, otlp_sink\n"
        "os.sched_setaffinity(0, {1})\n"
        "async def main():\n"
        f"    await asyncio.gather(upstream.serve({HOST!r}, {upstream}), otlp_sink.serve({HOST!r}, {sink}))\n"
        "uvloop.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    for port in (upstream, sink):
        while True:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError("the fake upstream and sink did not start") from None
                time.sleep(0.05)
    return proc, upstream, sink


def _instructions(path: Path) -> int:
    """The instructions callgrind counted in one dump (its ``summary:`` line)."""
    for line in path.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"{path}: no summary line")


def _run_child(
    args: argparse.Namespace,
    upstream: int,
    sink: int | None,
    stream: bool,
    out: Path | None,
    limits: str = "off",
    store: str = "off",
) -> float:
    """One child's figure: µs of CPU per request, or (``out``: under callgrind, the dump written there)
    instructions per request."""
    argv = [sys.executable, "-m", "bench.request_loop", "--child", "--upstream-port", str(upstream)]
    argv += ["-c", str(args.c), *["--stream"] * stream]
    if limits != "off":
        argv += ["--limits", limits]
    if store != "off":
        argv += ["--store", store]
    if sink is not None:
        argv += ["--sink-port", str(sink), "--options", args.options]
    if out is None:
        argv += ["-n", str(args.n), "--windows", str(args.windows)]
        result = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        return float(json.loads(result.strip().splitlines()[-1]))
    argv += ["-n", str(args.n), "--windows", "1", "--counted"]
    tool = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    subprocess.run(tool + argv, check=True, capture_output=True, text=True)
    return float(_instructions(Path(f"{out}.1")) / int(args.n))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.request_loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("-n", type=int, default=4000)
    parser.add_argument("-c", type=int, default=10)
    parser.add_argument("--scenarios", nargs="+", default=["burst-c10", "json-c10"], choices=["burst-c10", "json-c10"])
    parser.add_argument("--control", action="store_true", help="A/A: the 'on' child runs without tracing too")
    parser.add_argument("--options", default="", help="more telemetry.otlp settings, 'k: v; k2: v2'")
    parser.add_argument(
        "--limits",
        default="off",
        help="the 'on' child has rate limits no request reaches (memory, or a redis:// URL: start that redis-server "
        "on core 1) in place of tracing: what the limiter costs a request",
    )
    parser.add_argument(
        "--store",
        default="off",
        help="the 'on' child has the usage ledger (sqlite: a file of its own, or a store.url) in place of tracing "
        "(with --limits, both)",
    )
    parser.add_argument(
        "--instructions",
        metavar="DIR",
        type=Path,
        help="count instructions under callgrind instead (one round, one window of -n; its dumps kept in DIR)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--upstream-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sink-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    counting = args.instructions is not None
    if counting:
        args.instructions.mkdir(parents=True, exist_ok=True)
    unit = "instructions/request" if counting else "µs/request"
    proc, upstream, sink = _services()
    try:
        for scenario in args.scenarios:
            stream = scenario.startswith("burst")
            diffs = []
            for r in range(1 if counting else args.rounds):
                pair: dict[str, float] = {}
                for which in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    on = which == "on" and not args.control
                    limited = args.limits if on else "off"
                    ledger = args.store if on else "off"
                    traced = sink if on and limited == "off" and ledger == "off" else None
                    out = args.instructions / f"{scenario}-{which}" if counting else None
                    pair[which] = _run_child(args, upstream, traced, stream, out, limited, ledger)
                diffs.append(pair["on"] - pair["off"])
                print(
                    f"{scenario} round {r + 1}: off {pair['off']:.1f} on {pair['on']:.1f} {unit} "
                    f"({diffs[-1]:+.1f}, {diffs[-1] / pair['off']:+.1%})",
                    flush=True,
                )
            print(f"{scenario}: median difference {statistics.median(diffs):+.1f} {unit}", flush=True)
    finally:
        proc.kill()  # (both servers' SIGTERM handlers are one loop's: one would stop, not the other)
        proc.wait(10)


if __name__ == "__main__":
    main()

"""The gateway as a process (``messages-gateway serve``): live reload under load, and the SIGTERM drain."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

KW = {"max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}


def write(path: Path, target: str, *, broken: bool = False) -> None:
    text = f"""
auth: {{open: true}}
server: {{drain_timeout_s: 1}}
providers:
  m1: {{kind: mock, deltas: 3, event_delay_ms: 2}}
  m2: {{kind: mock, deltas: 3, event_delay_ms: 2}}
  m3: {{kind: mock, deltas: 3, event_delay_ms: 2}}
  slow: {{kind: mock, deltas: 60, event_delay_ms: 100}}
  quick: {{kind: mock, deltas: 4, event_delay_ms: 50}}
  late: {{kind: mock, first_event_delay_ms: 8000}}
models:
  late: {{targets: [{{provider: late}}]}}
  live: {{targets: [{{provider: {target}}}]}}
  slow: {{targets: [{{provider: slow}}]}}
  quick: {{targets: [{{provider: quick}}]}}
"""
    path.write_text(text + ("  broken: {targets: [{provider: nowhere}]}\n" if broken else ""))


def event_names(text: str) -> list[str]:
    return [line[7:] for line in text.split("\n") if line.startswith("event: ")]


def test_reload_under_load_fails_no_request(tmp_path: Path, serve: object) -> None:
    config = tmp_path / "gateway.yaml"
    write(config, "m1")
    gw = serve(config)  # type: ignore[operator]
    seen: Counter[str] = Counter()
    failures: list[str] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=gw.url, timeout=10) as http:
            while not stop.is_set():
                resp = http.post("/v1/messages", json={"model": "live", "stream": True, **KW})
                names = event_names(resp.text)
                if resp.status_code != 200 or not names or names[-1] != "message_stop":
                    failures.append(f"{resp.status_code} {resp.text[:200]}")
                seen[resp.headers.get("x-gateway-provider", "?")] += 1

    workers = [threading.Thread(target=load) for _ in range(4)]
    for worker in workers:
        worker.start()

    def wait_for(provider: str, limit: float = 6.0) -> None:
        deadline = time.monotonic() + limit
        before = seen[provider]
        while seen[provider] <= before + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen[provider] > before + 5, f"{provider} never served: {seen}"

    try:
        wait_for("m1")
        write(config, "m2")  # picked up by the file watcher
        wait_for("m2")
        write(config, "m3", broken=True)  # rejected: the running table stays
        deadline = time.monotonic() + 10
        while "config reload rejected" not in gw.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting for the condition: the watcher saw the broken file and said so
        m3_before = seen["m3"]
        assert m3_before == 0
        write(config, "m3")
        gw.proc.send_signal(signal.SIGHUP)
        wait_for("m3")
    finally:
        stop.set()
        for worker in workers:
            worker.join(20)
    assert failures == []
    assert sum(seen.values()) > 100
    log = gw.log.read_text()
    assert "config reload rejected" in log and "nowhere" in log


def test_sigterm_drains_then_ends_the_rest_with_an_error(tmp_path: Path, serve: object) -> None:
    config = tmp_path / "gateway.yaml"
    write(config, "m1")
    gw = serve(config)  # type: ignore[operator]
    results: dict[str, str] = {}

    begun = {alias: threading.Event() for alias in ("slow", "quick")}
    answers: dict[str, httpx.Response] = {}

    def stream(alias: str) -> None:
        body = {"model": alias, "stream": True, **KW}
        with httpx.stream("POST", f"{gw.url}/v1/messages", json=body, timeout=30) as resp:
            begun[alias].set()  # the response has started: the stream is in flight
            results[alias] = resp.read().decode()

    def late(stream: bool) -> None:  # still waiting for the provider at the drain's deadline
        answers[f"late-{stream}"] = httpx.post(
            f"{gw.url}/v1/messages", json={"model": "late", "stream": stream, **KW}, timeout=30
        )

    threads = [threading.Thread(target=stream, args=(alias,)) for alias in ("slow", "quick")]
    threads += [threading.Thread(target=late, args=(flag,)) for flag in (False, True)]
    for thread in threads:
        thread.start()
    assert all(event.wait(10) for event in begun.values())
    time.sleep(0.2)  # the two late requests have reached the provider
    started = time.monotonic()
    gw.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    refused = False
    while not refused and time.monotonic() < deadline:  # no longer accepting, once the server has stopped
        try:
            httpx.post(f"{gw.url}/v1/messages", json={"model": "quick", **KW}, timeout=2)
            time.sleep(0.02)
        except (
            httpx.ConnectError,
            httpx.RemoteProtocolError,
            httpx.ReadError,  # ECONNRESET: queued on the listening socket as it closed (seen once in CI)
        ):  # refused, or accepted by the closing socket and dropped
            refused = True
    assert refused
    for thread in threads:
        thread.join(20)
    assert event_names(results["quick"])[-1] == "message_stop"  # finished within the drain
    slow = event_names(results["slow"])
    assert slow[0] == "message_start" and slow[-1] == "error" and "message_stop" not in slow
    assert '"type":"overloaded_error"' in results["slow"].rsplit("event: error", 1)[1]
    for answer in answers.values():  # answered in the envelope at the deadline, not cut by the server's backstop
        assert answer.status_code == 529, answer.text
        assert answer.json()["error"]["type"] == "overloaded_error"
    assert len(answers) == 2
    assert gw.proc.wait(15) is not None
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("workers", ["1", "2"])
def test_every_worker_writes_the_access_log(tmp_path: Path, serve: object, workers: str) -> None:
    """One JSON line per request on stderr, in the configured format, with one worker or several (each
    worker process sets up its own logging)."""
    config = tmp_path / "g.yaml"
    write(config, "m1")
    served = serve(config, "--workers", workers)  # type: ignore[operator]
    for stream in (False, True, False, True):
        r = httpx.post(f"{served.url}/v1/messages", json={**KW, "model": "live", "stream": stream}, timeout=10)
        assert r.status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [
            line
            for line in served.log.read_text().splitlines()
            if " INFO gateway.access: " in line and '"path":"/v1/messages"' in line  # not the /healthz probes
        ]
        if len(lines) >= 4:
            break
        time.sleep(0.1)
    assert len(lines) == 4, served.log.read_text()
    for line in lines:
        assert line[:4].isdigit()  # asctime first
        record = json.loads(line.split(" INFO gateway.access: ", 1)[1])
        assert (record["alias"], record["status"], record["outcome"]) == ("live", 200, "completed")


LEDGER_CONFIG = """
auth: {{open: true}}
server: {{drain_timeout_s: 5}}
store: {{url: "sqlite:///{db}", flush_interval_s: {interval}}}
providers:
  m1: {{kind: mock, deltas: 3}}
models:
  live: {{targets: [{{provider: m1}}]}}
"""


def _ledger_ids(db: Path) -> set[str]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("SELECT request_id FROM requests")}


def _answered_for(url: str, seconds: float) -> list[tuple[str, float]]:
    done: list[tuple[str, float]] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        done += _answered(url, 10)
    return done


def _answered(url: str, n: int) -> list[tuple[str, float]]:
    done = []
    with httpx.Client(base_url=url, timeout=10) as http:
        for _ in range(n):
            resp = http.post("/v1/messages", json={"model": "live", **KW})
            assert resp.status_code == 200
            done.append((resp.headers["request-id"], time.monotonic()))
    return done


def test_sigterm_flushes_the_ledger_before_exit(tmp_path: Path, serve: object) -> None:
    """The queue is written before the process goes: a flush interval far longer than the test, and every
    request answered is in the ledger after SIGTERM."""
    db, config = tmp_path / "ledger.db", tmp_path / "g.yaml"
    config.write_text(LEDGER_CONFIG.format(db=db, interval=600))
    gw = serve(config)  # type: ignore[operator]
    answered = _answered(gw.url, 20)
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(20) == 0
    assert {rid for rid, _ in answered} <= _ledger_ids(db)


def test_kill_9_loses_at_most_the_last_flush_interval(tmp_path: Path, serve: object) -> None:
    """kill -9 mid-load, restart, compare the ledger with what the clients saw: every request answered more than
    one flush interval (plus the write's own time) before the kill is in it."""
    interval = 0.5
    db, config = tmp_path / "ledger.db", tmp_path / "g.yaml"
    config.write_text(LEDGER_CONFIG.format(db=db, interval=interval))
    gw = serve(config)  # type: ignore[operator]
    answered = _answered_for(gw.url, 6 * interval)
    killed_at = time.monotonic()
    gw.proc.kill()
    gw.proc.wait(10)
    restarted = serve(config)  # type: ignore[operator]  # the same file opens again, WAL and all
    _answered(restarted.url, 1)
    stored = _ledger_ids(db)
    lost = [(rid, killed_at - at) for rid, at in answered if rid not in stored]
    assert all(age <= interval + 0.5 for _, age in lost), lost
    assert len(lost) < len(answered) / 2  # most of the load was written before the kill
    oldest = max([age for _, age in lost], default=0.0)
    print(f"kill -9: {len(lost)} of {len(answered)} answered requests lost, the oldest {oldest:.3f} s old")


def _requests_total(text: str, alias: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gateway_requests_total{") and f'alias="{alias}"' in line
    )


def test_several_workers_give_exact_metrics_on_every_scrape(tmp_path: Path, serve: object) -> None:
    """workers: 2 — every scrape, whichever worker answers it, counts every request of both (prometheus-client's
    multiprocess mode); before, 20 requests read 11, then 9, then 11. The status answers say which worker they
    come from, and their token totals are both workers' too."""
    config, db = tmp_path / "g.yaml", tmp_path / "ledger.db"
    write(config, "m1")
    config.write_text(config.read_text() + f'store: {{url: "sqlite:///{db}", flush_interval_s: 0.2}}\n')
    served = serve(config, "--workers", "2")  # type: ignore[operator]
    pids = set()
    with httpx.Client(base_url=served.url, timeout=10) as http:  # new connections: both workers serve
        for _ in range(20):
            with httpx.Client(base_url=served.url, timeout=10) as one:
                assert one.post("/v1/messages", json={**KW, "model": "live"}).status_code == 200
        scrapes = []
        for _ in range(16):
            with httpx.Client(base_url=served.url, timeout=10) as one:
                scrapes.append(_requests_total(one.get("/metrics").text, "live"))
                status = one.get("/v1/gateway/status").json()
                pids.add(status["worker"]["pid"])
                assert status["worker"]["workers"] == 2
                (live,) = [a for a in status["aliases"] if a["alias"] == "live"]
                assert live["requests"] == {"completed": 20}
        assert http.get("/metrics").status_code == 200
    assert scrapes == [20.0] * 16
    # each worker listens on a socket of its own (SO_REUSEPORT): the kernel spreads new connections between them
    # (one shared socket let one worker take nearly all); 16 fresh connections all on one: p = 2**-15
    assert len(pids) == 2
    deadline = time.monotonic() + 10  # both workers write the one SQLite ledger (WAL, busy timeout)
    while len(_ledger_ids(db)) < 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_ledger_ids(db)) == 20
    assert "/metrics shows one worker" not in served.log.read_text()  # the warning is gone


def test_two_gateway_processes_share_one_limit_through_redis(tmp_path: Path, serve: object, redis_server: Any) -> None:
    """A 10-requests-per-minute key gets its 11th request refused whichever process serves it; and a gateway
    with several workers but no Redis refuses to start rather than count each worker's limits apart."""
    config = tmp_path / "g.yaml"
    config.write_text(
        f"""
auth: {{keys: [{{name: ci, key: sk-ci, limits: {{requests_per_minute: 10}}}}]}}
limits: {{redis_url: "{redis_server.url}"}}
providers:
  m1: {{kind: mock, deltas: 3}}
models:
  live: {{targets: [{{provider: m1}}]}}
"""
    )
    first, second = serve(config), serve(config)  # type: ignore[operator]
    if time.time() % 60 > 50:  # all eleven within one minute window
        time.sleep(61 - time.time() % 60)
    statuses = []
    for i in range(12):
        gw = first if i % 2 else second
        resp = httpx.post(f"{gw.url}/v1/messages", json={**KW, "model": "live"}, headers={"x-api-key": "sk-ci"})
        statuses.append(resp.status_code)
    assert statuses == [200] * 10 + [429, 429]
    lonely = tmp_path / "workers.yaml"
    lonely.write_text(config.read_text().replace(f'limits: {{redis_url: "{redis_server.url}"}}\n', ""))
    refused = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(lonely), "--workers", "2", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "limits.redis_url" in refused.stderr

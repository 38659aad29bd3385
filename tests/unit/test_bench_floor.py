"""The benchmark's floor (``bench/floor.py``, ``python -m bench.run --floor``) is a pass-through: what the fake
upstream answers reaches the client byte for byte, streamed and not, so its figures are those of forwarding alone."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.net import free_port

ROOT = Path(__file__).resolve().parents[2]


def _post(port: int, body: dict[str, object]) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/messages", json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheader("content-type") or "", data


def _ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "exited before it was ready"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answers on {port}")


@pytest.fixture(scope="module")
def ports() -> Iterator[tuple[int, int]]:
    up, floor = free_port(), free_port()
    procs = [
        subprocess.Popen([sys.executable, "-m", "bench.upstream", "--port", str(up)], cwd=ROOT),
        subprocess.Popen(
            [sys.executable, "-m", "bench.floor", "--port", str(floor), "--upstream", f"http://127.0.0.1:{up}"],
            cwd=ROOT,
        ),
    ]
    try:
        _ready(up, procs[0])
        _ready(floor, procs[1])
        yield up, floor
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


@pytest.mark.parametrize("stream", [True, False])
def test_the_floor_forwards_the_upstreams_answer_byte_for_byte(ports: tuple[int, int], stream: bool) -> None:
    from bench.loadgen import Expectation

    up, floor = ports
    body = {"model": "bench-d50-c", "max_tokens": 64, "stream": stream, "messages": [{"role": "user", "content": "x"}]}
    direct, through = _post(up, body), _post(floor, body)
    assert direct[0] == through[0] == 200
    assert through[1] == direct[1] and through[1].startswith("text/event-stream" if stream else "application/json")
    assert through[2] == direct[2] and len(direct[2]) > 1000
    expectation = Expectation("bench-d50-c", stream)
    assert expectation.check(through[2]) is None

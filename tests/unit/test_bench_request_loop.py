"""``bench.request_loop``: whole requests through the gateway's ASGI app in one process, tracing off and on. Its
children check every request is answered 200 with a whole body, so a run that reports figures served them all;
``--instructions`` counts them under callgrind (valgrind, which ``.ci/run`` installs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(json-c10|burst-c10) round 1: off ([\d.]+) on ([\d.]+) (µs|instructions)/request")


def _run(*args: str) -> list[tuple[str, float, float]]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.request_loop", "--scenarios", "json-c10", "burst-c10", *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    rows = [m.groups() for line in out.splitlines() if (m := LINE.match(line))]
    return [(name, float(off), float(on)) for name, off, on, _ in rows]


def test_both_scenarios_are_served_and_measured_with_tracing_off_and_on() -> None:
    rows = _run("--rounds", "1", "--windows", "1", "-n", "60")
    assert [name for name, _, _ in rows] == ["json-c10", "burst-c10"]
    for _, off, on in rows:
        assert off > 0 and on > 0


@pytest.mark.long
def test_instructions_are_counted_and_the_traced_request_executes_more(tmp_path: Path) -> None:
    if shutil.which("valgrind") is None:
        if os.environ.get("MESSAGES_GATEWAY_REQUIRE_VALGRIND"):
            pytest.fail("valgrind is missing though .ci/run installed it")
        pytest.skip("valgrind is not installed")
    rows = _run("--instructions", str(tmp_path), "-n", "30")
    assert [name for name, _, _ in rows] == ["json-c10", "burst-c10"]
    for name, off, on in rows:
        # a request is hundreds of thousands of instructions; tracing adds its spans' work to each one
        assert 100_000 < off < on < 10 * off, (name, off, on)
        assert (tmp_path / f"{name}-off.1").exists() and (tmp_path / f"{name}-on.1").exists()

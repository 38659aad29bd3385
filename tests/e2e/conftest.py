"""The end-to-end tests' shared fixture: the gateway as a process (``messages-gateway serve``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.net import free_port


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[object]:
    started: list[Served] = []

    def start(config: Path, *extra: str, port: int | None = None, env: dict[str, str] | None = None) -> Served:
        port = port or free_port()
        log = tmp_path / f"gateway-{port}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port), *extra],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            proc.kill()
            raise RuntimeError(f"gateway did not start:\n{log.read_text()}")
        served = Served(proc, url, log)
        started.append(served)
        return served

    yield start
    for served in started:  # stopped as an operator stops it (and so that subprocess coverage is written)
        if served.proc.poll() is None:
            served.proc.terminate()
            try:
                served.proc.wait(10)
            except subprocess.TimeoutExpired:
                served.proc.kill()
                served.proc.wait(10)


@pytest.fixture(scope="session")
def claude_cli() -> Path:
    """The real ``claude`` CLI (``tests/claude_cli.py``: ``$MESSAGES_GATEWAY_CLAUDE_CLI`` or the cache ``.ci/run``
    installs it into), checked to run; a skip where it is missing (a failure when
    ``MESSAGES_GATEWAY_REQUIRE_CLAUDE_CLI`` says it must be there, as ``.ci/run`` does)."""
    from tests.claude_cli import CLAUDE_CODE_VERSION, ENV_CLI, ENV_REQUIRE, cache_dir, cli_version, find_claude_cli

    cli = find_claude_cli()
    problem = None
    if cli is None and os.environ.get(ENV_CLI):
        problem = f"{ENV_CLI}={os.environ[ENV_CLI]} is not an executable file"
    elif cli is None:
        problem = (
            f"the Claude Code CLI is not installed (npm install --prefix {cache_dir()} --no-audit --no-fund "
            f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}, or set MESSAGES_GATEWAY_CLAUDE_CLI)"
        )
    elif cli_version(cli) is None:
        problem = f"{cli} --version does not run"
    if problem is not None:
        if os.environ.get(ENV_REQUIRE):
            pytest.fail(f"Claude Code is required here ({ENV_REQUIRE}) but {problem}")
        pytest.skip(problem)
    assert cli is not None
    return cli

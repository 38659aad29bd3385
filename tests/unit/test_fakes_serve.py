"""The fakes' ``--serve`` mode (docs/local-providers.md): each listens on the ``--port`` it is given and answers there,
so a local-providers config can name fixed URLs."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("module", "extra", "path"),
    [
        ("tests.fakes.claude_api", [], "/v1/models"),
        ("tests.fakes.bedrock", [], "/"),
        ("tests.fakes.vertex", [], "/"),
        ("tests.fakes.foundry", ["--tls-port", "{tls}"], "/anthropic/v1/models"),
    ],
)
def test_serve_listens_on_the_port_it_is_given(module: str, extra: list[str], path: str) -> None:
    port, tls = free_port(), free_port()
    args = [a.format(tls=tls) for a in extra]
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--serve", "--port", str(port), *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first and first[0].startswith(f"http://127.0.0.1:{port}"), first
        if module == "tests.fakes.foundry":
            assert first[1] == f"https://127.0.0.1:{tls}"
        answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)
        assert answer.status_code < 500  # the fake itself answered (in its own shape: 401, 403, 404 or 200)
    finally:
        proc.terminate()
        proc.wait(timeout=10)

"""Shared fixtures: a real gateway (uvicorn + the app) on 127.0.0.1, and the fake Claude API."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anthropic
import pytest
import uvicorn

from gateway.http.app import create_app
from gateway.http.server import PROTOCOL
from gateway.observability.metrics import Metrics
from gateway.routing.pipeline import Resilience
from gateway.settings import Settings, parse_settings
from gateway.wire.upstream import DEFAULT_CLIENT
from tests.fakes.claude_api import FakeClaudeAPI
from tests.postgres import PostgresServer, find_bin_dir, start_postgres

# The usage ledger's default SQLite file (store.url unset) of every gateway the tests start, in process or as a
# subprocess: in a temporary directory, never in the checkout.
os.environ.setdefault("MESSAGES_GATEWAY_DATA_DIR", tempfile.mkdtemp(prefix="gateway-test-data-"))


@dataclass
class RunningGateway:
    url: str
    metrics: Metrics

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


@contextmanager
def run_gateway(
    settings: Settings | str,
    *,
    upstream_client: str | None = None,
    resilience: Resilience | None = None,
    http: str = PROTOCOL,
    port: int = 0,
) -> Iterator[RunningGateway]:
    """Serve the gateway for `settings` (a Settings or YAML text) in a background thread (``http``: uvicorn's
    protocol; the gateway's own by default), on ``port`` (0: a free one)."""
    if isinstance(settings, str):
        settings = parse_settings(settings, environ={})
    metrics = Metrics()
    client = upstream_client or os.environ.get("MESSAGES_GATEWAY_UPSTREAM_CLIENT", DEFAULT_CLIENT)
    app = create_app(settings, metrics=metrics, upstream_client=client, resilience=resilience)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it a keep-alive client here waits ~40 ms per request on a
    # delayed ACK (the served CLI runs uvloop, which sets it itself).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, loop="asyncio", http=http, lifespan="on", log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    def serve() -> None:
        asyncio.run(server.serve(sockets=[sock]))

    thread = threading.Thread(target=serve, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("gateway did not start")
        time.sleep(0.01)
    try:
        yield RunningGateway(f"http://127.0.0.1:{port}", metrics)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def access_lines(caplog: pytest.LogCaptureFixture, request_id: str, *, settle_s: float = 0.05) -> list[dict[str, Any]]:
    """The access lines of the request whose response carried ``request_id`` (the provider's own id, when it sent
    one, is what the client sees; the line has both), waiting up to 5 s for the first, then ``settle_s`` more for
    any second one (which would be a bug)."""

    def found() -> list[dict[str, Any]]:
        return [
            line
            for r in caplog.records
            if r.name == "gateway.access"
            for line in [json.loads(r.getMessage())]
            if request_id in (line["request_id"], line["upstream_request_id"])
        ]

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not found():
        time.sleep(0.02)
    time.sleep(settle_s)
    return found()


def sdk_error(
    client: anthropic.Anthropic, model: str, exc: type[Exception], *, stream: bool, **kw: Any
) -> anthropic.APIStatusError:
    """The error ``exc`` the SDK raises for one request (streamed: ``messages.stream`` to the final
    message; else ``messages.create``), checked to be an API status error with the Anthropic envelope."""
    with pytest.raises(exc) as info:
        if stream:
            with client.messages.stream(model=model, **kw) as s:
                s.get_final_message()
        else:
            client.messages.create(model=model, **kw)
    err = info.value
    assert isinstance(err, anthropic.APIStatusError)
    assert err.body["type"] == "error"  # type: ignore[index]
    return err


@pytest.fixture(scope="session")
def fake_claude() -> Iterator[FakeClaudeAPI]:
    fake = FakeClaudeAPI()
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def fake(fake_claude: FakeClaudeAPI) -> FakeClaudeAPI:
    fake_claude.reset()
    return fake_claude


def claude_config(base_url: str, **provider: str) -> str:
    extra = "".join(f", {k}: {v}" for k, v in provider.items())
    return f"""
server: {{max_request_bytes: 200000}}
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 100000}}}}
auth: {{keys: [gw-key-1, gw-key-2]}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{base_url}"{extra}}}
  demo: {{kind: mock}}
models:
  sonnet:
    targets: [{{provider: claude, model: fake-text}}]
  mock-model:
    targets: [{{provider: demo}}]
  "*":
    targets: [{{provider: claude}}]
"""


@pytest.fixture(scope="session")
def gateway(fake_claude: FakeClaudeAPI) -> Iterator[RunningGateway]:
    with run_gateway(claude_config(fake_claude.base_url)) as gw:
        yield gw


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer | None]:
    """A real PostgreSQL server for the session, or None where it is not installed (its tests skip, unless
    ``MESSAGES_GATEWAY_REQUIRE_POSTGRES`` says it must be there, as ``.ci/run`` does)."""
    if find_bin_dir() is None:
        if os.environ.get("MESSAGES_GATEWAY_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL is required here (MESSAGES_GATEWAY_REQUIRE_POSTGRES) but not installed")
        yield None
        return
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Any]:
    """A real Redis for the session, or a skip where ``redis-server`` is not installed (a failure when
    ``MESSAGES_GATEWAY_REQUIRE_REDIS`` says it must be there, as ``.ci/run`` does)."""
    import shutil

    from tests.redis_server import start_redis

    if shutil.which("redis-server") is None:
        if os.environ.get("MESSAGES_GATEWAY_REQUIRE_REDIS"):
            pytest.fail("redis-server is required here (MESSAGES_GATEWAY_REQUIRE_REDIS) but not installed")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()

"""Headless Chromium (Debian's ``chromium`` package) driven by Playwright for Python, against a real
gateway on 127.0.0.1. Playwright never downloads a browser here: it launches the system one.

When Chromium or Playwright is missing the tests are skipped, unless ``MESSAGES_GATEWAY_REQUIRE_BROWSER=1``
(``.ci/run`` installs both and sets it), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

ARTIFACTS = Path(
    os.environ.get("MESSAGES_GATEWAY_ARTIFACTS", Path(__file__).resolve().parents[2] / "build" / "test-artifacts")
)
_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str | None:
    return os.environ.get("MESSAGES_GATEWAY_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


# Module scope, not session: Playwright's sync API keeps an event loop running in this thread while it is
# open, and the tests after these call asyncio.run().
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    required = os.environ.get("MESSAGES_GATEWAY_REQUIRE_BROWSER") == "1"
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if required:
            raise
        pytest.skip("playwright is not installed")
    if executable is None:
        if required:
            pytest.fail("MESSAGES_GATEWAY_REQUIRE_BROWSER=1 but no chromium on PATH")
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=executable, args=_FLAGS)
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    # Failed loads are checked by URL below (the browser's own favicon probe is not the page's doing).
    pg.on(
        "console",
        lambda m: errors.append(m.text) if m.type == "error" and "Failed to load resource" not in m.text else None,
    )
    pg.on(
        "response",
        lambda r: (
            errors.append(f"{r.status} {r.url}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico") and r.request.resource_type != "fetch"
            else None
        ),
    )
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"the page logged errors: {errors}"


def ui_config(fake_url: str) -> str:
    return f"""
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 100000}}}}
auth: {{keys: [ui-key]}}
admin: {{keys: [ui-admin]}}
providers:
  paced: {{kind: mock, deltas: 48, event_delay_ms: 25}}
  fast: {{kind: mock, deltas: 12}}
  upstream: {{kind: anthropic, api_key: provider-key, base_url: "{fake_url}"}}
models:
  claude-paced:
    display_name: Mock, one event every 25 ms
    targets: [{{provider: paced}}]
  claude-fast:
    targets: [{{provider: fast}}]
  claude-flaky:
    display_name: Fails mid-stream
    targets: [{{provider: upstream, model: fake-error-midstream}}]
  claude-tools:
    targets: [{{provider: upstream, model: fake-tools}}]
  claude-cites-before:
    display_name: Citations before their text (as the API streams them)
    targets: [{{provider: upstream, model: fake-citations}}]
  claude-cites-after:
    display_name: Citations after their text, two on one block, one inside a growing block
    targets: [{{provider: upstream, model: fake-citations-after}}]
"""


@pytest.fixture(scope="module")
def ui_gateway(fake_claude: FakeClaudeAPI) -> Iterator[RunningGateway]:
    with run_gateway(ui_config(fake_claude.base_url)) as gw:
        yield gw

"""The real Claude Code CLI (pinned, ``.ci/run`` installs it) signs in to the gateway with its interactive
``/login`` (driven in a tmux pane by ``tests/claude_login.py``; its browser half by ``tests/login_browser.py``),
through the fake identity provider, then answers ``claude -p`` through the gateway with the bearer it was given:
the gateway's access line and ledger name the IdP's user and team, the CLI fetched its managed settings (the
policy's ``env`` reached it) and sent telemetry that reached a collector; after the IdP refuses the refresh, the
CLI says the session is over."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.claude_cli import run_claude
from tests.claude_login import ENV_REQUIRE_TMUX, claude_login, find_tmux
from tests.conftest import access_lines, run_gateway
from tests.e2e.test_signin import ADMIN, ALICE, MSG, Collector, config
from tests.fakes.oidc import FakeOidcIssuer
from tests.net import free_port


@pytest.fixture(scope="module")
def tmux() -> Path:
    found = find_tmux()
    if found is None:
        if os.environ.get(ENV_REQUIRE_TMUX):
            pytest.fail(f"tmux is required here ({ENV_REQUIRE_TMUX}) but not installed")
        pytest.skip("tmux is not installed (apt-get install tmux)")
    return found


@pytest.fixture
def idp() -> Iterator[FakeOidcIssuer]:
    with FakeOidcIssuer(user=ALICE) as issuer:
        yield issuer


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    yield found
    found.close()


def login_config(idp: FakeOidcIssuer, port: int, tmp_path: Path, collector: Collector, ttl_s: int = 3600) -> str:
    head = f"""
telemetry:
  forward_to: [{{url: "{collector.url}", headers: {{x-collector-key: c-1}}}}]
"""
    text = config(idp, port, f"sqlite:///{tmp_path}/ledger.db", head=head)
    # every model for this test's user (the CLI asks for its own default), and the session's bearer lifetime
    text = text.replace("availableModels: [sonnet], ", "").replace(
        "  poll_interval_s: 1\n", f"  poll_interval_s: 1\n  session: {{ttl_s: {ttl_s}}}\n"
    )
    every = '  "claude-*": {targets: [{provider: demo}]}'
    return text.replace("  claude-opus-4-7: {targets: [{provider: demo}]}", every)


def test_claude_code_signs_in_with_login_and_works_through_the_gateway(
    claude_cli: Path,
    tmux: Path,
    idp: FakeOidcIssuer,
    collector: Collector,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    port = free_port()
    with run_gateway(login_config(idp, port, tmp_path, collector), port=port) as gw:
        home = tmp_path / "home"
        credentials = claude_login(claude_cli, gw.url, home)
        assert credentials["url"] == gw.url and credentials["email"] == "alice@example.com"
        assert credentials["tokenEndpoint"] == f"{gw.url}/oauth/token"
        remote = json.loads((home / ".claude" / "remote-settings.json").read_text())
        assert remote.get("env", {}).get("FROM_GATEWAY") == "1"  # the policy's env, approved in the TUI

        run = run_claude(claude_cli, "say hi", env={}, home=home, settings=None, timeout=90)
        assert run.returncode == 0, run.describe()
        assert "mock" in run.stdout.lower() or run.stdout.strip(), run.describe()

        lines = [
            json.loads(r.getMessage())
            for r in caplog.records
            if r.name == "gateway.access" and '"/v1/messages"' in r.getMessage()
        ]
        assert lines and {line["key"] for line in lines} == {f"sso:{ALICE.sub}"}
        assert access_lines(caplog, lines[-1]["request_id"])[0]["status"] == 200
        audit = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.audit"]
        assert any(e["event"] == "managed.serve" for e in audit)  # the CLI fetched its managed settings

        day = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime())
        report = httpx.get(
            f"{gw.url}/v1/organizations/usage_report/messages",
            params={
                "starting_at": day,
                "ending_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86_400)),
                "group_by[]": ["account_id", "workspace_id"],
            },
            headers=ADMIN,
            timeout=30,
        ).json()
        rows = [r for b in report["data"] for r in b["results"]]
        assert {(r["account_id"], r["workspace_id"]) for r in rows} == {("alice@example.com", "payments")}

        deadline = time.monotonic() + 30  # the CLI's OTLP exporter flushes at exit, or on its interval
        while not collector.received and time.monotonic() < deadline:
            time.sleep(0.2)
        assert collector.received, "the CLI's telemetry did not reach the collector"
        for path, headers, _ in collector.received:
            assert path in ("/v1/metrics", "/v1/logs", "/v1/traces")
            assert headers["x-collector-key"] == "c-1" and "authorization" not in headers
    shutil.rmtree(home, ignore_errors=True)


def test_after_the_identity_provider_refuses_the_refresh_the_cli_says_to_sign_in_again(
    claude_cli: Path, tmux: Path, idp: FakeOidcIssuer, collector: Collector, tmp_path: Path
) -> None:
    port = free_port()
    # a bearer of 2 minutes: the CLI refreshes it (less than 5 minutes left) on its next start
    with run_gateway(login_config(idp, port, tmp_path, collector, ttl_s=120), port=port) as gw:
        home = tmp_path / "home"
        claude_login(claude_cli, gw.url, home)
        idp.refuse_refresh = True  # the user is deprovisioned
        run = run_claude(claude_cli, "say hi", env={}, home=home, settings=None, timeout=90)
        assert run.returncode != 0, run.describe()
        said = run.stdout + run.stderr
        # the CLI's own words for a refresh the gateway refused: "Cloud gateway <url> no longer accepts this
        # session. Start `claude` and sign in again with /login."
        assert "no longer accepts this session" in said and "/login" in said, run.describe()
        assert idp.refresh_refused_count >= 1
    shutil.rmtree(home, ignore_errors=True)


UNIFIED = "anthropic-ratelimit-unified-"


def test_a_team_budget_near_its_cap_shows_in_the_cli_and_over_it_the_cli_prints_the_gateways_message(
    claude_cli: Path, tmux: Path, idp: FakeOidcIssuer, collector: Collector, tmp_path: Path
) -> None:
    """The team's daily budget, shared by its members: past 75 % the TUI shows Claude Code's own usage notice
    (from the gateway's ``anthropic-ratelimit-unified-*`` headers); over the cap ``claude -p`` prints the
    gateway's 429 message (a ``billing_error`` that says when it resets) and exits 1."""
    from tests.claude_login import ClaudeTui

    port = free_port()
    text = login_config(idp, port, tmp_path, collector).replace(
        "teams: {payments: {}, platform: {}}",
        "teams: {payments: {limits: {budget: {usd: 0.01, per: day}}}, platform: {}}",
    )
    with run_gateway(text, port=port) as gw:
        home = tmp_path / "home"
        credentials = claude_login(claude_cli, gw.url, home)
        bearer = {"authorization": f"Bearer {credentials['jwt']}", "anthropic-version": "2023-06-01"}

        def spend_until(fraction: float) -> float:
            used = 0.0
            for _ in range(500):
                answer = httpx.post(
                    f"{gw.url}/v1/messages",
                    json={"model": "claude-sonnet-4-6", **MSG},
                    headers=bearer,
                )
                if answer.status_code == 429:
                    return 1.0
                used = float(answer.headers[UNIFIED + "overage-utilization"])
                if used >= fraction:
                    return used
            raise AssertionError(f"the budget's use stayed at {used}")

        assert 0.80 <= spend_until(0.80) < 0.95
        with ClaudeTui(claude_cli, home) as tui:
            tui.wait_for_prompt(timeout=60)
            tui.type("say hi")
            tui.keys("Enter")
            screen = tui.wait_for("You've used", timeout=60)
            assert "of your usage credits" in screen, tui.describe(screen)
            tui.exit()

        spend_until(1.01)
        run = run_claude(claude_cli, "say hi", env={}, home=home, settings=None, timeout=90)
        assert run.returncode == 1, run.describe()
        said = run.stdout + run.stderr
        assert "budget" in said and "resets" in said, run.describe()  # the gateway's own message, verbatim
    shutil.rmtree(home, ignore_errors=True)

"""The status page in headless Chromium: every alias with its strategy and targets, per-target health,
and token totals equal to the gateway's metrics, redrawn live as requests are served (an admin key); with a
client key, its aliases' health and its own usage today, and nothing of the providers or others' traffic."""

from __future__ import annotations

import time
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.browser.conftest import ARTIFACTS
from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

ASK = {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}


def tokens(gw: RunningGateway, alias: str, kind: str) -> int:
    total = 0.0
    for family in gw.metrics.tokens.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels["alias"] == alias and sample.labels["type"] == kind:
                total += sample.value
    return int(total)


def test_status_page_lists_routes_and_follows_the_metrics_live(page: Any, ui_gateway: RunningGateway) -> None:
    key = {"x-api-key": "ui-key"}
    assert (
        httpx.post(f"{ui_gateway.url}/v1/messages", json={"model": "claude-fast", **ASK}, headers=key).status_code
        == 200
    )
    page.goto(f"{ui_gateway.url}/status")
    page.wait_for_selector("#status-error:not([hidden])")  # no key yet: the API said so
    assert "authentication_error" in page.inner_text("#status-error")
    page.fill("#key", "ui-admin")
    page.dispatch_event("#key", "change")
    page.wait_for_selector("section.alias[data-alias='claude-fast']")
    assert page.is_hidden("#status-error")

    listed = httpx.get(f"{ui_gateway.url}/v1/gateway/status", headers={"x-api-key": "ui-admin"}).json()["aliases"]
    shown = page.locator("section.alias").evaluate_all("(s) => s.map((e) => e.dataset.alias)")
    assert shown == [a["alias"] for a in listed]
    fast = page.locator("section.alias[data-alias='claude-fast']")
    assert "Strategy: fallback" in fast.inner_text()
    row = fast.locator("tbody tr").first
    assert row.locator("th").inner_text() == "fast"
    assert row.get_attribute("data-state") == "closed"
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == "healthy" and cells[2] == "100.0 %" and cells[3].endswith(" ms") and cells[4] == "0"
    assert "completed 1" in cells[5]

    def shown_output() -> int:
        return int(page.inner_text("#totals [data-total='output']"))

    assert shown_output() == tokens(ui_gateway, "claude-fast", "output") > 0
    assert f"Output {tokens(ui_gateway, 'claude-fast', 'output')}" in cells[6]
    assert f"Input {tokens(ui_gateway, 'claude-fast', 'input')}" in cells[6]

    before = shown_output()
    assert (
        httpx.post(f"{ui_gateway.url}/v1/messages", json={"model": "claude-fast", **ASK}, headers=key).status_code
        == 200
    )
    expected = sum(tokens(ui_gateway, a["alias"], "output") for a in listed)
    assert expected > before
    expect(page.locator("#totals [data-total='output']")).to_have_text(str(expected), timeout=10_000)  # polled
    assert "completed 2" in fast.locator("tbody tr td").nth(5).inner_text()  # redrawn without a reload
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "status.png"), full_page=True)


def test_with_a_client_key_the_page_shows_health_and_the_keys_own_usage(page: Any, ui_gateway: RunningGateway) -> None:
    key = {"x-api-key": "ui-key"}
    assert (
        httpx.post(f"{ui_gateway.url}/v1/messages", json={"model": "claude-fast", **ASK}, headers=key).status_code
        == 200
    )
    own = httpx.get(f"{ui_gateway.url}/v1/gateway/status", headers=key).json()
    assert own["scope"] == "key"
    fast_today = next(a for a in own["aliases"] if a["alias"] == "claude-fast")["today"]
    page.goto(f"{ui_gateway.url}/status")
    page.fill("#key", "ui-key")
    page.dispatch_event("#key", "change")
    fast = page.locator("section.alias[data-alias='claude-fast']")
    fast.wait_for()
    assert page.is_hidden("#status-error")
    assert f"Your tokens today (key {own['key']})" in page.inner_text("#totals-title")
    assert f"your requests today: {fast_today['requests']}" in fast.inner_text()
    assert f"Output {fast_today['tokens']['output']}" in fast.inner_text()
    row = fast.locator("tbody tr").first
    assert row.locator("th").inner_text() == "1" and row.locator("td").first.inner_text() == "available"
    text = page.inner_text("#aliases")
    assert "fast (" not in text and "Provider" not in text and "%" not in text  # no provider, no statistics
    total = sum(a["today"]["tokens"]["output"] for a in own["aliases"])
    assert int(page.inner_text("#totals [data-total='output']")) == total
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "status-key.png"), full_page=True)


def test_status_page_shows_a_cooling_target_and_its_recovery_state(page: Any, fake_claude: FakeClaudeAPI) -> None:
    """One upstream failure opens this breaker (threshold 1): the page shows the target cooling down, with
    the seconds left from the API, and its failed request; the healthy alias beside it stays healthy."""
    config = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 1, cooldown_s: 600}}}}
providers:
  upstream: {{kind: anthropic, api_key: provider-key, base_url: "{fake_claude.base_url}"}}
  fast: {{kind: mock}}
models:
  broken: {{targets: [{{provider: upstream, model: fake-status-529}}]}}
  fine: {{targets: [{{provider: fast}}]}}
"""
    with run_gateway(config) as gw:
        assert httpx.post(f"{gw.url}/v1/messages", json={"model": "broken", **ASK}).status_code == 529
        page.goto(f"{gw.url}/status")
        broken = page.locator("section.alias[data-alias='broken'] tbody tr").first
        broken.wait_for()
        assert broken.get_attribute("data-state") == "open"
        cells = broken.locator("td").all_inner_texts()
        left = next(a for a in httpx.get(f"{gw.url}/v1/gateway/status").json()["aliases"] if a["alias"] == "broken")
        assert left["targets"][0]["state"] == "open"
        assert cells[1].startswith("cooling down (") and cells[1].endswith(" s left)")
        assert abs(float(cells[1][len("cooling down (") : -len(" s left)")]) - 600) < 30
        assert cells[2] == "0.0 %"
        assert "upstream_error 1" in cells[5]
        fine = page.locator("section.alias[data-alias='fine'] tbody tr").first
        assert fine.get_attribute("data-state") == "closed"
        assert fine.locator("td").nth(1).inner_text() == "healthy"


def test_the_usage_view_shows_teams_keys_and_thirty_days(page: Any, fake_claude: FakeClaudeAPI, tmp_path: Any) -> None:
    """Tokens and cost per team and per key for today and this month, and a bar per day of the last 30 days,
    from the ledger's usage report; the numbers are the report's."""
    config = f"""
auth:
  keys:
    - {{name: alice, key: sk-alice, team: payments}}
    - {{name: bob, key: sk-bob, team: payments}}
    - {{name: carol, key: sk-carol, team: infra}}
admin: {{keys: [sk-admin]}}
store: {{url: "sqlite:///{tmp_path}/ledger.db"}}
providers:
  upstream: {{kind: anthropic, api_key: provider-key, base_url: "{fake_claude.base_url}"}}
models:
  "*": {{targets: [{{provider: upstream}}]}}
pricing:
  "fake-*": {{input: 3, output: 15}}
"""
    with run_gateway(config) as gw:
        for key, n in (("sk-alice", 2), ("sk-bob", 1), ("sk-carol", 1)):
            for _ in range(n):
                answer = httpx.post(
                    f"{gw.url}/v1/messages", json={"model": "fake-text", **ASK}, headers={"x-api-key": key}
                )
                assert answer.status_code == 200
        page.goto(f"{gw.url}/status")
        page.fill("#key", "sk-admin")
        page.dispatch_event("#key", "change")
        page.wait_for_selector("#usage-teams tr[data-name='payments']")
        today = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime())
        by_team = httpx.get(
            f"{gw.url}/v1/organizations/usage_report/messages",
            params={
                "starting_at": today,
                "ending_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86_400)),
                "group_by[]": "workspace_id",
            },
            headers={"x-api-key": "sk-admin"},
        ).json()
        for result in by_team["data"][-1]["results"]:
            row = page.locator(f"#usage-teams tr[data-name='{result['workspace_id']}']")
            tokens = (
                result["uncached_input_tokens"]
                + result["cache_read_input_tokens"]
                + result["cache_creation"]["ephemeral_5m_input_tokens"]
                + result["output_tokens"]
            )
            assert row.locator("[data-cell='requests-today']").inner_text() == str(result["requests"])
            assert row.locator("[data-cell='tokens-today']").inner_text() == str(tokens)
            assert row.locator("[data-cell='tokens-month']").inner_text() == str(tokens)
            assert row.locator("[data-cell='cost-today']").inner_text() == f"${result['cost_usd']:.4f}"
        requests = page.locator("#usage-teams tbody [data-cell='requests-today']").all_inner_texts()
        assert sorted(requests) == ["1", "3"]  # infra: carol; payments: alice twice and bob
        assert page.locator("#usage-keys tbody tr").evaluate_all("(rows) => rows.map((r) => r.dataset.name)") == [
            "alice",
            "bob",
            "carol",
        ]
        bars = page.locator("#usage-chart rect.bar")
        assert bars.count() == 30
        assert bars.nth(29).get_attribute("data-day") == today[:10]
        assert int(bars.nth(29).get_attribute("data-tokens") or 0) > 0
        assert all(int(bars.nth(i).get_attribute("data-tokens") or 0) == 0 for i in range(29))
        assert page.is_hidden("#usage-note")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "status-usage.png"), full_page=True)

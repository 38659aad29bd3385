"""The status page in headless Chromium: every alias with its strategy and targets, per-target health,
and token totals equal to the gateway's metrics, redrawn live as requests are served (an admin key); with a
client key, its aliases' health and its own usage today, and nothing of the providers or others' traffic."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
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
    assert cells[1] == "healthy" and cells[2] == "0 in the last 60 s · 0 in all"
    assert cells[3] == "100.0 %" and cells[4].endswith(" ms") and cells[5] == "0"
    assert "completed 1" in cells[6]

    def shown_output() -> int:
        return int(page.inner_text("#totals [data-total='output']"))

    assert shown_output() == tokens(ui_gateway, "claude-fast", "output") > 0
    assert f"Output {tokens(ui_gateway, 'claude-fast', 'output')}" in cells[7]
    assert f"Input {tokens(ui_gateway, 'claude-fast', 'input')}" in cells[7]

    before = shown_output()
    assert (
        httpx.post(f"{ui_gateway.url}/v1/messages", json={"model": "claude-fast", **ASK}, headers=key).status_code
        == 200
    )
    expected = sum(tokens(ui_gateway, a["alias"], "output") for a in listed)
    assert expected > before
    expect(page.locator("#totals [data-total='output']")).to_have_text(str(expected), timeout=10_000)  # polled
    assert "completed 2" in fast.locator("tbody tr td").nth(6).inner_text()  # redrawn without a reload
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
    the seconds left from the API, its failures beside that state (in the breaker's window and in all) and its
    failed request; the healthy alias beside it stays healthy, with none."""
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
        header = page.locator("section.alias[data-alias='broken'] thead th").all_inner_texts()
        assert header[2:4] == ["State", "Failures"]  # side by side
        assert cells[2] == "1 in the last 60 s · 1 in all"
        assert left["targets"][0]["recent_failures"] == 1
        assert cells[3] == "0.0 %"
        assert "upstream_error 1" in cells[6]
        fine = page.locator("section.alias[data-alias='fine'] tbody tr").first
        assert fine.get_attribute("data-state") == "closed"
        assert fine.locator("td").nth(1).inner_text() == "healthy"
        assert fine.locator("td").nth(2).inner_text() == "0 in the last 60 s · 0 in all"


USAGE = """
auth:
  keys:
    - {{name: alice, key: sk-alice, team: payments}}
    - {{name: bob, key: sk-bob, team: payments}}
    - {{name: carol, key: sk-carol, team: infra}}
admin: {{keys: [sk-admin]}}
store: {{url: "sqlite:///{db}"}}
providers:
  upstream: {{kind: anthropic, api_key: provider-key, base_url: "{url}"}}
models:
  "*": {{targets: [{{provider: upstream}}]}}
pricing:
  "fake-text": {{input: 3, output: 15}}
"""


@pytest.fixture(scope="module")
def usage_gateway(fake_claude: FakeClaudeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """alice twice and bob once on a priced model (team payments); carol (team infra) once on one with no price."""
    db = tmp_path_factory.mktemp("usage") / "ledger.db"
    with run_gateway(USAGE.format(db=db, url=fake_claude.base_url)) as gw:
        for key, n, model in (("sk-alice", 2, "fake-text"), ("sk-bob", 1, "fake-text"), ("sk-carol", 1, "fake-tools")):
            for _ in range(n):
                answer = httpx.post(f"{gw.url}/v1/messages", json={"model": model, **ASK}, headers={"x-api-key": key})
                assert answer.status_code == 200
        yield gw


def open_usage(page: Any, gw: RunningGateway) -> None:
    page.goto(f"{gw.url}/status")
    page.fill("#key", "sk-admin")
    page.dispatch_event("#key", "change")
    page.wait_for_selector("#usage-teams tr[data-name='payments']")
    page.wait_for_selector("#usage-chart rect.bar[data-tokens]:not([data-tokens='0'])")


def today_report(gw: RunningGateway, group: str) -> dict[str, Any]:
    report: dict[str, Any] = httpx.get(
        f"{gw.url}/v1/organizations/usage_report/messages",
        params={
            "starting_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime()),
            "ending_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86_400)),
            "group_by[]": group,
        },
        headers={"x-api-key": "sk-admin"},
        timeout=30,
    ).json()
    return report


def test_the_usage_view_shows_teams_keys_and_thirty_days(page: Any, usage_gateway: RunningGateway) -> None:
    """Tokens and cost per team and per key for today and this month, and a bar per day of the last 30 days,
    from the ledger's usage report; the numbers are the report's. A cost with no price is "—", never $0."""
    gw = usage_gateway
    open_usage(page, gw)
    today = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime())
    by_team = today_report(gw, "workspace_id")
    costs = {}
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
        shown = row.locator("[data-cell='cost-today']").inner_text()
        assert shown == ("\u2014" if result["cost_usd"] is None else f"${result['cost_usd']:.4f}")
        assert row.locator("[data-cell='cost-month']").inner_text() == shown
        costs[result["workspace_id"]] = shown
    assert costs["infra"] == "\u2014" and costs["payments"].startswith("$0.0")  # carol's model has no price
    requests = page.locator("#usage-teams tbody [data-cell='requests-today']").all_inner_texts()
    assert sorted(requests) == ["1", "3"]  # infra: carol; payments: alice twice and bob
    assert page.locator("#usage-keys tbody tr").evaluate_all("(rows) => rows.map((r) => r.dataset.name)") == [
        "alice",
        "bob",
        "carol",
    ]
    carol = page.locator("#usage-keys tr[data-name='carol']")
    assert carol.locator("[data-cell='cost-today']").inner_text() == "\u2014"
    assert carol.locator("[data-cell='cost-month']").inner_text() == "\u2014"
    assert page.locator("#usage-keys tr[data-name='bob'] [data-cell='cost-today']").inner_text().startswith("$0.0")
    bars = page.locator("#usage-chart rect.bar")
    assert bars.count() == 30
    assert bars.nth(29).get_attribute("data-day") == today[:10]
    assert int(bars.nth(29).get_attribute("data-tokens") or 0) > 0
    assert all(int(bars.nth(i).get_attribute("data-tokens") or 0) == 0 for i in range(29))
    assert page.is_hidden("#usage-note")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "status-usage.png"), full_page=True)


CHART = """() => {
  const svg = document.getElementById('usage-chart');
  const box = (e) => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; };
  const ticks = (sel) => [...svg.querySelectorAll(sel)].map((t) => ({
    value: t.dataset.value, day: t.dataset.day, text: t.querySelector('text').textContent,
    box: box(t.querySelector('text')), line: box(t.querySelector('line'))}));
  return {
    svg: box(svg),
    y: ticks('.y-axis .tick'), x: ticks('.x-axis .tick'),
    titles: [...svg.querySelectorAll('.axis-title')].map((t) => t.textContent),
    yDomain: box(svg.querySelector('.y-axis .domain')), xDomain: box(svg.querySelector('.x-axis .domain')),
    bars: [...svg.querySelectorAll('rect.bar')].map((b) => ({tokens: Number(b.dataset.tokens), day: b.dataset.day,
      box: box(b), title: b.querySelector('title').textContent})),
  };
}"""


def test_the_thirty_day_chart_has_axes_with_values(page: Any, usage_gateway: RunningGateway) -> None:
    """A y axis of token counts with tick values from 0 up past the busiest day, a bar's height on that scale; an x
    axis of dates (UTC) under the bars, today's last; both titled; the text drawn unstretched."""
    open_usage(page, usage_gateway)
    chart = page.evaluate(CHART)
    assert chart["titles"] == ["Tokens", "Day (UTC, month-day)"]
    values = [int(t["value"]) for t in chart["y"]]
    most = max(b["tokens"] for b in chart["bars"])
    assert values[0] == 0 and values == sorted(values) and len(values) >= 2 and values[-1] >= most > 0
    steps = {b - a for a, b in itertools.pairwise(values)}
    assert len(steps) == 1  # evenly spaced
    step = steps.pop()
    assert str(step)[0] in "125" and set(str(step)[1:]) <= {"0"}  # 1, 2 or 5 times a power of ten
    for tick in chart["y"]:  # each value labelled, compactly ("1.5k"), at its grid line
        v = int(tick["value"])
        assert tick["text"] == (str(v) if v < 1000 else f"{v / 1000:g}k")
        assert abs((tick["box"]["y"] + tick["box"]["h"] / 2) - tick["line"]["y"]) < 3
    base = chart["xDomain"]["y"]
    top = next(t for t in chart["y"] if int(t["value"]) == values[-1])["line"]["y"]
    for bar in chart["bars"]:
        assert abs(bar["box"]["y"] + bar["box"]["h"] - base) < 1.5  # on the x axis
        assert abs(bar["box"]["h"] - (base - top) * bar["tokens"] / values[-1]) < 1.5  # on the y scale
        assert bar["title"] == f"{bar['day']}: {bar['tokens']} tokens"
    days = [t["day"] for t in chart["x"]]
    assert days[-1] == time.strftime("%Y-%m-%d", time.gmtime()) and len(days) >= 4
    bars_by_day = {b["day"]: b["box"] for b in chart["bars"]}
    for tick in chart["x"]:
        assert tick["text"] == tick["day"][5:]  # month-day
        bar = bars_by_day[tick["day"]]
        assert abs(tick["box"]["x"] + tick["box"]["w"] / 2 - (bar["x"] + bar["w"] / 2)) < 2  # under its bar
        assert tick["box"]["y"] >= base and tick["box"]["x"] + tick["box"]["w"] <= chart["svg"]["x"] + chart["svg"]["w"]
    assert chart["yDomain"]["x"] > max(t["box"]["x"] + t["box"]["w"] for t in chart["y"])  # labels left of the axis
    font = page.evaluate("() => document.querySelector('#usage-chart .y-axis text').getBoundingClientRect().height")
    assert 10 <= font <= 20  # 12px text at 1:1, not stretched to the chart's width
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#usage").screenshot(path=str(ARTIFACTS / "status-chart.png"))


BUDGETS = """
auth:
  keys:
    - name: alice
      key: sk-alice
      team: payments
      limits: {{budget: {{usd: 0.0001, per: day}}, requests_per_minute: 100}}
    - {{name: bob, key: sk-bob, team: payments}}
admin: {{keys: [sk-admin]}}
teams:
  payments: {{limits: {{budget: {{usd: 5, per: month}}}}}}
  infra: {{}}
providers:
  upstream: {{kind: anthropic, api_key: provider-key, base_url: "{url}"}}
models:
  "*": {{targets: [{{provider: upstream}}]}}
pricing:
  "fake-*": {{input: 3, output: 15}}
"""


def test_the_page_shows_each_budgets_spend_and_the_refusals(page: Any, fake_claude: FakeClaudeAPI) -> None:
    """Per team and per key: the budget, the spend of its window against it, when it resets, the rate limits and
    the refusals by limit (this process's count, as the page says) — the status document's numbers; a client key
    sees its own and its team's budget."""
    with run_gateway(BUDGETS.format(url=fake_claude.base_url)) as gw:
        for key, status in (("sk-alice", 200), ("sk-bob", 200), ("sk-alice", 429), ("sk-alice", 429)):
            answer = httpx.post(f"{gw.url}/v1/messages", json={"model": "fake-text", **ASK}, headers={"x-api-key": key})
            assert answer.status_code == status
        limits = httpx.get(f"{gw.url}/v1/gateway/status", headers={"x-api-key": "sk-admin"}).json()["limits"]
        page.goto(f"{gw.url}/status")
        page.fill("#key", "sk-admin")
        page.dispatch_event("#key", "change")
        alice = page.locator("#limits-keys tr[data-name='alice']")
        alice.wait_for()
        spent = next(k for k in limits["keys"] if k["name"] == "alice")["budget"]["spent_usd"]
        assert alice.locator("th").inner_text() == "alice (team payments)"
        assert alice.locator("[data-cell='budget']").inner_text() == "$0.00010 per day"
        assert alice.locator("[data-cell='spent']").inner_text() == f"${spent:.5f} ({spent / 0.0001 * 100:.1f} %)"
        tomorrow = time.strftime("%Y-%m-%d 00:00 UTC", time.gmtime(time.time() + 86_400))
        assert alice.locator("[data-cell='resets']").inner_text() == tomorrow
        assert alice.locator("[data-cell='rates']").inner_text() == "100 requests/min"
        assert alice.locator("[data-cell='refusals']").inner_text() == "budget 2"
        bob = page.locator("#limits-keys tr[data-name='bob']")
        assert bob.locator("[data-cell='budget']").inner_text() == "none"
        assert bob.locator("[data-cell='refusals']").inner_text() == "none"
        team = page.locator("#limits-teams tr[data-name='payments']")
        team_spent = next(t for t in limits["teams"] if t["name"] == "payments")["budget"]["spent_usd"]
        assert team.locator("[data-cell='budget']").inner_text() == "$5 per month"
        assert team.locator("[data-cell='spent']").inner_text() == f"${team_spent:.2f} (0.0 %)"
        assert page.locator("#limits-teams tbody tr").evaluate_all("(r) => r.map((e) => e.dataset.name)") == [
            "infra",
            "payments",
        ]
        assert "counted by the process that answered" in page.inner_text("#limits-note")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.locator("#limits").screenshot(path=str(ARTIFACTS / "status-limits.png"))

        page.fill("#key", "sk-alice")
        page.dispatch_event("#key", "change")
        expect(page.locator("#limits-keys tbody tr")).to_have_count(1)
        assert page.locator("#limits-keys tbody tr th").inner_text() == "alice (team payments)"
        assert page.locator("#limits-keys [data-cell='refusals']").inner_text() == "budget 2"
        assert page.locator("#limits-teams tbody tr").get_attribute("data-name") == "payments"
        assert page.locator("#limits-teams [data-cell='refusals']").inner_text() == "(not shown)"


def test_loading_goes_when_an_error_is_shown(page: Any, ui_gateway: RunningGateway) -> None:
    """No key on a keyed gateway: the error is shown and "Loading…" is gone; after a good read, a failed one says
    when the page last managed to read the status."""
    page.goto(f"{ui_gateway.url}/status")
    page.wait_for_selector("#status-error:not([hidden])")
    assert "Loading" not in page.inner_text("#updated")
    assert page.inner_text("#updated") == "Not loaded"
    page.fill("#key", "ui-admin")
    page.dispatch_event("#key", "change")
    expect(page.locator("#updated")).to_have_text(re.compile(r"^Updated "))
    page.fill("#key", "wrong-key")
    page.dispatch_event("#key", "change")
    page.wait_for_selector("#status-error:not([hidden])")
    expect(page.locator("#updated")).to_have_text(re.compile(r"^Last updated .+; the latest refresh failed$"))


PLACEHOLDER_FITS = """() => {
  const input = document.getElementById('key');
  const style = getComputedStyle(input);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  const text = ctx.measureText(input.placeholder).width;
  const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return {text, room, right: input.getBoundingClientRect().right};
}"""


@pytest.mark.parametrize("width", [1280, 360])
@pytest.mark.parametrize("path", ["/status", "/playground"])
def test_the_key_field_is_wide_enough_for_its_placeholder(
    page: Any, ui_gateway: RunningGateway, width: int, path: str
) -> None:
    page.set_viewport_size({"width": width, "height": 800})
    page.goto(f"{ui_gateway.url}{path}")
    fits = page.evaluate(PLACEHOLDER_FITS)
    assert fits["text"] <= fits["room"], fits  # "empty if the gateway has no keys", whole
    assert fits["right"] <= width
    assert page.evaluate("document.documentElement.scrollWidth") <= width

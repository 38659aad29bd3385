"""The browser pages as HTTP resources (the browser tests in tests/browser drive them): served from the
package with a strict content security policy, nothing outside gateway/http/web reachable, switched off with
``server.ui: false``; and the status document's totals read from the metrics registry."""

from __future__ import annotations

import fnmatch
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import RunningGateway, claude_config, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI, final_message

ROOT = Path(__file__).resolve().parents[2]
MOCK = """
auth: {keys: [k1]}
providers: {demo: {kind: mock}}
models: {claude-x: {targets: [{provider: demo}]}}
"""


@pytest.fixture(scope="module")
def mock_gateway() -> Iterator[RunningGateway]:
    with run_gateway(MOCK) as gw:
        yield gw


@pytest.mark.parametrize(
    ("path", "content_type", "marker"),
    [
        ("/playground", "text/html", b'<script type="module" src="/ui/playground.js">'),
        ("/status", "text/html", b'<script type="module" src="/ui/status.js">'),
        ("/ui/fold.js", "text/javascript", b"export function foldEvent"),
        ("/ui/playground.js", "text/javascript", b'from "./fold.js"'),
        ("/ui/style.css", "text/css", b":root"),
    ],
)
def test_pages_and_assets_are_served_without_a_key(
    mock_gateway: RunningGateway, path: str, content_type: str, marker: bytes
) -> None:
    resp = httpx.get(mock_gateway.url + path)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == f"{content_type}; charset=utf-8"
    assert marker in resp.content
    csp = resp.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert resp.headers["x-content-type-options"] == "nosniff"


def test_html_has_no_inline_script_or_style() -> None:
    for page in (ROOT / "gateway" / "http" / "web").glob("*.html"):
        html = page.read_text()
        assert "<script>" not in html and "<style" not in html and " style=" not in html and "onclick" not in html


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/..%2Fpages.py", "/ui/%2E%2E%2Fapp.py", "/ui/", "/ui/fold.JS"])
def test_nothing_else_is_reachable(mock_gateway: RunningGateway, path: str) -> None:
    resp = httpx.get(mock_gateway.url + path)
    assert resp.status_code == 404
    assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "not_found_error"


def test_ui_false_turns_the_pages_off_but_not_the_api() -> None:
    with run_gateway(MOCK.replace("auth:", "server: {ui: false}\nauth:")) as gw:
        for path in ("/playground", "/status", "/ui/fold.js"):
            resp = httpx.get(gw.url + path)
            assert resp.status_code == 404, path
            assert resp.json()["error"]["type"] == "not_found_error"
        assert httpx.get(gw.url + "/v1/gateway/status", headers={"x-api-key": "k1"}).status_code == 200


def test_package_data_ships_every_web_file() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "gateway.http"
    ]
    files = [p.relative_to(ROOT / "gateway" / "http").as_posix() for p in (ROOT / "gateway" / "http" / "web").iterdir()]
    assert files
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


def test_status_totals_equal_the_metrics(fake_claude: FakeClaudeAPI, tmp_path: Path) -> None:
    """The gateway-wide totals (an admin key's scope) equal the metrics; a client key's scope is its own usage
    (its own ledger: the default file is shared by every gateway of the test process)."""
    extra = f'admin: {{keys: [gw-admin]}}\nstore: {{url: "sqlite:///{tmp_path}/ledger.db"}}\n'
    with run_gateway(claude_config(fake_claude.base_url) + extra) as gw:
        key = {"x-api-key": "gw-key-1"}
        for _ in range(2):
            body = {
                "model": "sonnet",
                "max_tokens": 10,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }
            assert httpx.post(gw.url + "/v1/messages", json=body, headers=key).status_code == 200
        bad = httpx.post(gw.url + "/v1/messages", json={**body, "model": "mock-model", "max_tokens": 0}, headers=key)
        assert bad.status_code == 400
        status = httpx.get(gw.url + "/v1/gateway/status", headers={"x-api-key": "gw-admin"}).json()
        assert status["scope"] == "gateway"
        sonnet = next(a for a in status["aliases"] if a["alias"] == "sonnet")
        usage = final_message("fake-text")["usage"]
        want = {
            "input": 2 * usage["input_tokens"],
            "output": 2 * usage["output_tokens"],
            "cache_read": 2 * usage["cache_read_input_tokens"],
            "cache_creation": 2 * usage["cache_creation_input_tokens"],
        }
        assert sonnet["tokens"] == want
        assert sonnet["targets"][0]["tokens"] == want
        assert sonnet["requests"] == {"completed": 2} == sonnet["targets"][0]["requests"]
        for kind, value in want.items():
            assert (
                gw.sample("gateway_tokens_total", alias="sonnet", provider="claude", model="fake-text", type=kind)
                == value
            )
        mock = next(a for a in status["aliases"] if a["alias"] == "mock-model")
        assert mock["tokens"] == {"input": 0, "output": 0, "cache_read": 0, "cache_creation": 0}
        own = httpx.get(gw.url + "/v1/gateway/status", headers=key).json()
        assert own["scope"] == "key" and own["key"] == "key-1"
        sonnet = next(a for a in own["aliases"] if a["alias"] == "sonnet")
        assert sonnet["today"] == {"requests": 2, "tokens": want} and sonnet["state"] == "available"
        other = httpx.get(gw.url + "/v1/gateway/status", headers={"x-api-key": "gw-key-2"}).json()
        assert next(a for a in other["aliases"] if a["alias"] == "sonnet")["today"]["requests"] == 0


BUDGETS = """
auth:
  keys:
    - name: alice
      key: sk-alice
      team: payments
      limits: {{budget: {{usd: 0.0001, per: day}}, requests_per_minute: 100}}
    - {{name: bob, key: sk-bob, team: payments}}
    - {{name: carol, key: sk-carol}}
admin: {{keys: [sk-admin]}}
teams:
  payments: {{limits: {{budget: {{usd: 5, per: month}}, tokens_per_minute: 1000000}}}}
  infra: {{}}
store: {{url: "sqlite:///{db}", flush_interval_s: 0.05}}
resilience: {{retry: {{max_attempts: 1}}, breaker: {{failure_threshold: 100}}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{url}"}}
models:
  broken: {{targets: [{{provider: claude, model: fake-status-529}}]}}
  "*": {{targets: [{{provider: claude}}]}}
pricing:
  "fake-*": {{input: 3, output: 15}}
"""


def test_status_shows_each_budgets_spend_and_each_limits_refusals(fake_claude: FakeClaudeAPI, tmp_path: Path) -> None:
    """Per team and per key: the budget, the spend of its current window (the limiter's own count, which the
    ledger's cost of the same requests equals), the rate limits and the refusals by limit, counted in process; a
    client key sees its own and its team's budget, not the team's refusals. Each target shows its recent failures."""
    config = BUDGETS.format(db=tmp_path / "ledger.db", url=fake_claude.base_url)
    body = {"model": "fake-text", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    with run_gateway(config) as gw:
        alice, bob = {"x-api-key": "sk-alice"}, {"x-api-key": "sk-bob"}
        assert httpx.post(gw.url + "/v1/messages", json=body, headers=alice).status_code == 200
        assert httpx.post(gw.url + "/v1/messages", json=body, headers=bob).status_code == 200
        refused = httpx.post(gw.url + "/v1/messages", json=body, headers=alice)
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "billing_error"
        assert httpx.post(gw.url + "/v1/messages", json={**body, "model": "broken"}, headers=bob).status_code == 529
        status = httpx.get(gw.url + "/v1/gateway/status", headers={"x-api-key": "sk-admin"}).json()
        limits = status["limits"]
        assert limits["refusals_counted_by"] == "process" and limits["refusals_since"].endswith("Z")
        keys = {k["name"]: k for k in limits["keys"]}
        teams = {t["name"]: t for t in limits["teams"]}
        assert list(keys) == ["alice", "bob", "carol"] and list(teams) == ["infra", "payments"]
        assert keys["alice"]["refusals"] == {"budget": 1}
        assert keys["alice"]["rate_limits"] == {"requests_per_minute": 100}
        assert keys["bob"]["refusals"] == {} and keys["bob"]["budget"] is None and keys["carol"]["budget"] is None
        assert teams["payments"]["refusals"] == {} and teams["infra"]["budget"] is None
        assert teams["payments"]["rate_limits"] == {"tokens_per_minute": 1000000}
        today = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime())
        report = httpx.get(
            gw.url + "/v1/organizations/usage_report/messages",
            params={
                "starting_at": today,
                "ending_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86_400)),
                "group_by[]": "api_key_id",
            },
            headers={"x-api-key": "sk-admin"},
            timeout=30,
        ).json()
        cost = {r["api_key_id"]: r["cost_usd"] for b in report["data"] for r in b["results"]}
        budget = keys["alice"]["budget"]
        assert (budget["usd"], budget["per"]) == (0.0001, "day")
        assert budget["spent_usd"] == pytest.approx(cost["alice"]) and budget["spent_usd"] > budget["usd"]
        assert budget["resets_at"] == time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86_400))
        team = teams["payments"]["budget"]
        assert (team["usd"], team["per"]) == (5, "month")
        assert team["spent_usd"] == pytest.approx(cost["alice"] + cost["bob"])  # the 529 cost nothing
        broken = next(a for a in status["aliases"] if a["alias"] == "broken")["targets"][0]
        assert (broken["recent_failures"], broken["failures"], broken["failure_window_s"]) == (1, 1, 60.0)

        own = httpx.get(gw.url + "/v1/gateway/status", headers=alice).json()["limits"]
        assert [k["name"] for k in own["keys"]] == ["alice"] and own["keys"][0]["refusals"] == {"budget": 1}
        assert [t["name"] for t in own["teams"]] == ["payments"] and "refusals" not in own["teams"][0]
        assert own["teams"][0]["budget"]["spent_usd"] == pytest.approx(team["spent_usd"])
        carol = httpx.get(gw.url + "/v1/gateway/status", headers={"x-api-key": "sk-carol"}).json()["limits"]
        assert carol["teams"] == [] and [k["name"] for k in carol["keys"]] == ["carol"]

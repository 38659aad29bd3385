"""Governance that a client with a valid key cannot step around (issue 31, item 5): a budget holds only what the
gateway can price (an unpriced model under a budget is a 400 naming the missing price, and ``check-config`` warns
of the routes where that can happen); an issued key's ``expires_at`` past what a date holds is a 400, not a 500."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

KW: dict[str, Any] = {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def budget_config(fake: FakeClaudeAPI, tmp_path: Path) -> str:
    return f"""
auth:
  keys:
    - {{name: capped, key: sk-capped, limits: {{budget: {{usd: 0.0001, per: day}}}}}}
    - {{name: team-capped, key: sk-team, team: pay}}
    - {{name: free, key: sk-free}}
teams: {{pay: {{limits: {{budget: {{usd: 5, per: month}}}}}}}}
admin: {{keys: [sk-admin]}}
store: {{url: "sqlite:///{tmp_path}/ledger.db", flush_interval_s: 0.05}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
pricing:
  "fake-*": {{input: 3, output: 15}}
"""


def test_a_budget_limited_key_is_refused_a_model_without_a_price(fake: FakeClaudeAPI, tmp_path: Path) -> None:
    """Five requests for an unpriced name under a $0.0001 budget were all served, costing 0."""
    with run_gateway(budget_config(fake, tmp_path)) as gw:
        before = len(fake.requests)
        for key in ("sk-capped", "sk-team"):  # the key's own budget, and its team's
            for _ in range(5):
                resp = httpx.post(
                    f"{gw.url}/v1/messages", json={"model": "claude-opus-6", **KW}, headers={"x-api-key": key}
                )
                assert resp.status_code == 400, resp.text
                error = resp.json()["error"]
                assert error["type"] == "invalid_request_error"
                assert "'claude-opus-6' has no price" in error["message"] and "budget" in error["message"]
        assert len(fake.requests) == before  # nothing reached the provider
        priced = httpx.post(
            f"{gw.url}/v1/messages", json={"model": "fake-text", **KW}, headers={"x-api-key": "sk-team"}
        )
        assert priced.status_code == 200
        free = httpx.post(
            f"{gw.url}/v1/messages", json={"model": "claude-opus-6", **KW}, headers={"x-api-key": "sk-free"}
        )
        assert free.status_code == 200  # no budget: nothing to hold, the name is served as before
        counted = httpx.post(  # a token count spends nothing: never limited, so never refused for a price
            f"{gw.url}/v1/messages/count_tokens",
            json={"model": "claude-opus-6", "messages": KW["messages"]},
            headers={"x-api-key": "sk-capped"},
        )
        assert counted.status_code == 200
        issued = httpx.post(
            f"{gw.url}/v1/gateway/keys",
            json={"name": "dev", "limits": {"budget": {"usd": 1, "per": "day"}}},
            headers={"x-api-key": "sk-admin"},
        )
        assert issued.status_code == 201, issued.text
        resp = httpx.post(
            f"{gw.url}/v1/messages",
            json={"model": "claude-opus-6", **KW},
            headers={"x-api-key": issued.json()["key"]},
        )
        assert resp.status_code == 400 and "has no price" in resp.json()["error"]["message"]


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", str(path)], capture_output=True, text=True, timeout=60
    )


def test_check_config_warns_of_routes_a_budget_cannot_price(tmp_path: Path) -> None:
    routes = """
providers:
  claude: {kind: anthropic, api_key: provider-key}
models:
  "*": {targets: [{provider: claude}]}
  "fake-*": {targets: [{provider: claude}]}
  opus: {targets: [{provider: claude, model: claude-opus-6}]}
  sonnet: {targets: [{provider: claude, model: fake-sonnet}]}
pricing:
  "fake-*": {input: 3, output: 15}
"""
    config = tmp_path / "gateway.yaml"
    config.write_text("auth: {keys: [{name: a, key: sk-a, limits: {budget: {usd: 1, per: day}}}]}" + routes)
    done = check_config(config)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, done.stderr
    assert "route '*' passes the client's model names through" in warnings[0]
    assert "route 'opus': target model 'claude-opus-6' has no price" in warnings[1]
    config.write_text("auth: {keys: [{name: a, key: sk-a, limits: {requests_per_minute: 5}}]}" + routes)
    quiet = check_config(config)  # no budget anywhere, no admin key to issue one: nothing to warn of
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr


def test_an_expiry_past_year_9999_is_a_400_naming_the_field(fake: FakeClaudeAPI, tmp_path: Path) -> None:
    with run_gateway(budget_config(fake, tmp_path)) as gw:
        for expires_at in ("9999-12-31T23:59:59-01:00", "9999-12-31T23:30:00-00:45"):
            resp = httpx.post(
                f"{gw.url}/v1/gateway/keys",
                json={"name": "far", "expires_at": expires_at},
                headers={"x-api-key": "sk-admin"},
            )
            assert resp.status_code == 400, resp.text
            error = resp.json()["error"]
            assert error["type"] == "invalid_request_error" and error["message"].startswith("expires_at:")
        latest = httpx.post(
            f"{gw.url}/v1/gateway/keys",
            json={"name": "far", "expires_at": "9999-12-31T23:59:59Z"},
            headers={"x-api-key": "sk-admin"},
        )
        assert latest.status_code == 201, latest.text


def test_a_client_key_reads_its_aliases_health_and_its_own_usage_only(fake: FakeClaudeAPI, tmp_path: Path) -> None:
    """``/v1/gateway/status`` gave any client key the organisation's totals: other keys' outcomes and tokens,
    upstream model ids, breaker statistics."""
    config = f"""
auth:
  keys:
    - {{name: alice, key: sk-alice, models: [sonnet]}}
    - {{name: bob, key: sk-bob}}
admin: {{keys: [sk-admin]}}
store: {{url: "sqlite:///{tmp_path}/ledger.db", flush_interval_s: 0.05}}
providers:
  secret-provider: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  sonnet: {{targets: [{{provider: secret-provider, model: fake-text}}, {{provider: secret-provider, model: fake-x}}]}}
  opus: {{targets: [{{provider: secret-provider, model: fake-opus-upstream}}]}}
"""
    with run_gateway(config) as gw:
        for key, n in (("sk-alice", 1), ("sk-bob", 3)):
            for _ in range(n):
                resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "sonnet", **KW}, headers={"x-api-key": key})
                assert resp.status_code == 200
        usage = resp.json()["usage"]
        alice = httpx.get(f"{gw.url}/v1/gateway/status", headers={"x-api-key": "sk-alice"})
        assert alice.status_code == 200
        doc = alice.json()
        assert (doc["scope"], doc["key"], [a["alias"] for a in doc["aliases"]]) == ("key", "alice", ["sonnet"])
        (sonnet,) = doc["aliases"]
        assert sonnet["state"] == "available" and [t["state"] for t in sonnet["targets"]] == ["available"] * 2
        assert sonnet["today"]["requests"] == 1  # hers, not bob's three
        assert sonnet["today"]["tokens"]["output"] == usage["output_tokens"]
        for secret in ("secret-provider", "fake-text", "fake-x", "fake-opus", "successes", "success_rate", "bob"):
            assert secret not in alice.text, secret
        admin = httpx.get(f"{gw.url}/v1/gateway/status", headers={"x-api-key": "sk-admin"}).json()
        assert admin["scope"] == "gateway" and [a["alias"] for a in admin["aliases"]] == ["sonnet", "opus"]
        assert admin["aliases"][0]["requests"] == {"completed": 4}
        assert admin["aliases"][0]["targets"][0]["provider"] == "secret-provider"
        assert httpx.get(f"{gw.url}/v1/gateway/status").status_code == 401
        issued = httpx.post(f"{gw.url}/v1/gateway/keys", json={"name": "carol"}, headers={"x-api-key": "sk-admin"})
        carol = {"x-api-key": issued.json()["key"]}  # an issued key: its ledger rows carry its id, not its name
        assert httpx.post(f"{gw.url}/v1/messages", json={"model": "sonnet", **KW}, headers=carol).status_code == 200
        doc = httpx.get(f"{gw.url}/v1/gateway/status", headers=carol).json()
        assert doc["key"] == "carol" and doc["aliases"][0]["today"]["requests"] == 1


def test_a_claude_model_the_config_does_not_price_is_counted_at_its_list_price(fake: FakeClaudeAPI) -> None:
    """Claude Code sent claude-opus-5-5 through a ``claude-*`` glob the operator's ``pricing`` did not cover: the rows
    had no cost and the budget never moved. With no ``pricing`` at all, the shipped table prices it ($4 / $20 per
    MTok), the budget counts it, and a name the table does not know is still refused under a budget."""
    config = f"""
auth:
  keys:
    - {{name: dev, key: sk-dev, limits: {{budget: {{usd: 1, per: day}}}}}}
admin: {{keys: [sk-admin]}}
store: {{url: "memory://"}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "claude-*": {{targets: [{{provider: claude}}]}}
"""
    with run_gateway(config) as gw:
        spent = 0.0
        for _ in range(2):
            resp = httpx.post(
                f"{gw.url}/v1/messages", json={"model": "claude-opus-5-5", **KW}, headers={"x-api-key": "sk-dev"}
            )
            assert resp.status_code == 200, resp.text
            usage = resp.json()["usage"]
            spent += (
                usage["input_tokens"] * 4
                + usage["output_tokens"] * 20
                + usage.get("cache_read_input_tokens", 0) * 0.20
                + usage.get("cache_creation_input_tokens", 0) * 5
            ) / 1_000_000
        assert spent > 0
        status = httpx.get(f"{gw.url}/v1/gateway/status", headers={"x-api-key": "sk-admin"}, timeout=30).json()
        (dev,) = [k for k in status["limits"]["keys"] if k["name"] == "dev"]
        assert abs(dev["budget"]["spent_usd"] - spent) < 1e-12
        unknown = httpx.post(
            f"{gw.url}/v1/messages", json={"model": "claude-opus-6", **KW}, headers={"x-api-key": "sk-dev"}
        )
        assert unknown.status_code == 400 and "'claude-opus-6' has no price" in unknown.json()["error"]["message"]


def test_without_the_shipped_table_a_budget_needs_a_pricing_table(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "builtin_pricing: false\n"
        "auth: {keys: [{name: a, key: sk-a, limits: {budget: {usd: 1, per: day}}}]}\n"
        "providers: {claude: {kind: anthropic, api_key: provider-key}}\n"
        "models: {'claude-*': {targets: [{provider: claude}]}}\n"
    )
    done = check_config(config)
    assert done.returncode != 0
    assert "a budget needs prices" in done.stderr and "builtin_pricing: false" in done.stderr

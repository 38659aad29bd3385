"""Budgets that survive a restart (issue 33, item 1): with limits in memory (no Redis), the counters live in the
process while the ledger keeps the window's spend, so a restarted gateway handed every key and team a new budget.
Now the limiter is seeded from the ledger at start-up (per key id and per team, for every budget period), and a
budgeted request waits for that seed; the restarted gateway refuses the spent budget at once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import run_gateway
from tests.fakes.claude_api import FakeClaudeAPI
from tests.postgres import PostgresServer, new_database

KW: dict[str, Any] = {"model": "fake-text", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}


def config(fake: FakeClaudeAPI, store_url: str) -> str:
    return f"""
auth:
  keys:
    - {{name: capped, key: sk-capped, limits: {{budget: {{usd: 0.0001, per: month}}}}}}
    - {{name: teammate, key: sk-team, team: pay}}
    - {{name: other, key: sk-other, team: pay}}
teams: {{pay: {{limits: {{budget: {{usd: 0.0001, per: day}}}}}}}}
store: {{url: "{store_url}", flush_interval_s: 0.05}}
resilience: {{retry: {{max_attempts: 1}}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
pricing:
  "fake-*": {{input: 3, output: 15}}
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer | None) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    if postgres is None:
        pytest.skip("PostgreSQL is not installed")
    return new_database(postgres)


def post(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", json=KW, headers={"x-api-key": key}, timeout=10)


def test_a_spent_budget_stays_spent_across_a_restart(fake: FakeClaudeAPI, store_url: str) -> None:
    with run_gateway(config(fake, store_url)) as gw:
        assert post(gw.url, "sk-capped").status_code == 200  # spends more than $0.0001
        assert post(gw.url, "sk-capped").status_code == 429
        assert post(gw.url, "sk-team").status_code == 200  # the team's day budget, spent by one of its keys
        refused = post(gw.url, "sk-other")
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "billing_error"
    before = len(fake.requests)
    with run_gateway(config(fake, store_url)) as restarted:  # a new process: its counters start empty
        for key in ("sk-capped", "sk-other", "sk-team"):
            refused = post(restarted.url, key)
            assert refused.status_code == 429, (key, refused.text)
            error = refused.json()["error"]
            assert error["type"] == "billing_error" and "budget" in error["message"], error
        assert len(fake.requests) == before  # nothing reached the provider


def test_a_redis_that_lost_its_counters_gets_the_budgets_back_from_the_ledger(
    fake: FakeClaudeAPI, tmp_path: Path, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared counters in Redis: flushed (a failover, an eviction, an operator) while the ledger persists, the
    spent budgets are raised back from the ledger within ``RESEED_S`` — and at once when a gateway starts."""
    import redis as sync_redis

    from gateway.governance import limits

    monkeypatch.setattr(limits, "RESEED_S", 0.2)
    direct = sync_redis.Redis.from_url(redis_server.url)
    direct.flushall()
    cfg = config(fake, f"sqlite:///{tmp_path}/ledger.db") + f'limits: {{redis_url: "{redis_server.url}"}}\n'
    with run_gateway(cfg) as gw:
        assert post(gw.url, "sk-capped").status_code == 200
        assert post(gw.url, "sk-capped").status_code == 429
        deadline = time.monotonic() + 5
        while not direct.keys("*usd*"):  # the settled cost reached Redis
            assert time.monotonic() < deadline
            time.sleep(0.05)
        direct.flushall()
        time.sleep(1.0)  # a few re-seeds
        refused = post(gw.url, "sk-capped")
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "billing_error", refused.text
        assert post(gw.url, "sk-team").status_code == 200  # a budget not spent is untouched by the re-seeds
    direct.flushall()
    with run_gateway(cfg) as restarted:  # Redis empty, a new gateway: the start-up seed restores it
        refused = post(restarted.url, "sk-capped")
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "billing_error", refused.text

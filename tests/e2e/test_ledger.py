"""The usage ledger end to end, over SQLite and a real PostgreSQL server: requests under three keys of two teams
through the real SDK — streamed and not, one failing mid-stream, one cancelled by the client — and the usage
report, grouped by key, by team and by model, equals what the clients saw, to the token, and equals the
Prometheus counters; the cost report equals the priced tokens."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI
from tests.postgres import PostgresServer, new_database

KEYS = {"alice": ("sk-alice", "payments"), "bob": ("sk-bob", "payments"), "carol": ("sk-carol", "infra")}
ADMIN = "sk-admin"
PRICE = {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_creation": 3.75}  # USD per million


def config(base_url: str, store_url: str) -> str:
    keys = "\n".join(f"    - {{name: {n}, key: {k}, team: {t}, user: {n}@example.com}}" for n, (k, t) in KEYS.items())
    return f"""
auth:
  keys:
{keys}
admin: {{keys: [{ADMIN}]}}
store: {{url: "{store_url}", flush_interval_s: 0.05}}
resilience: {{retry: {{max_attempts: 1}}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
pricing:
  "fake-*": {{{", ".join(f"{k}: {v}" for k, v in PRICE.items())}}}
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def gw(
    request: pytest.FixtureRequest, fake: FakeClaudeAPI, tmp_path: Any, postgres: PostgresServer | None
) -> Iterator[RunningGateway]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/ledger.db"
    elif postgres is None:
        pytest.skip("PostgreSQL is not installed")
    else:
        url = new_database(postgres)
    with run_gateway(config(fake.base_url, url)) as running:
        yield running


def client(gw: RunningGateway, name: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=KEYS[name][0], base_url=gw.url, max_retries=0)


KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
TOKEN_TYPES = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def seen(usage: Any) -> Counter[str]:
    return Counter({t: getattr(usage, t) or 0 for t in TOKEN_TYPES})


def drive(gw: RunningGateway) -> dict[tuple[str, str], Counter[str]]:
    """The requests, and what each client saw of its usage: (key, model) -> token counts."""
    saw: dict[tuple[str, str], Counter[str]] = {}

    def add(key: str, model: str, usage: Counter[str]) -> None:
        saw.setdefault((key, model), Counter()).update(usage)

    with client(gw, "alice").messages.stream(model="fake-text", **KW) as s:
        add("alice", "fake-text", seen(s.get_final_message().usage))
    message = client(gw, "bob").messages.create(model="fake-text", **KW)
    add("bob", "fake-text", seen(message.usage))
    with client(gw, "carol").messages.stream(model="fake-sonnet-1", **KW) as s:
        add("carol", "fake-sonnet-1", seen(s.get_final_message().usage))
    # failing mid-stream: what the client saw is message_start's usage, then an error event
    with (
        pytest.raises(anthropic.APIStatusError),
        client(gw, "bob").messages.stream(model="fake-error-midstream", **KW) as s,
    ):
        for event in s:
            if event.type == "message_start":
                add("bob", "fake-error-midstream", seen(event.message.usage))
    # cancelled by the client after the first delta
    with client(gw, "alice").messages.stream(model="fake-slow", **KW) as s:
        for event in s:
            if event.type == "message_start":
                add("alice", "fake-slow", seen(event.message.usage))
            if event.type == "content_block_delta":
                break
    return saw


def report(gw: RunningGateway, path: str, key: str = ADMIN, **params: Any) -> Any:
    start = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() - 86_400))
    end = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + 86_400))
    query = {"starting_at": start, "ending_at": end, **params}
    return httpx.get(f"{gw.url}{path}", params=query, headers={"x-api-key": key})


def rows_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for bucket in document["data"] for r in bucket["results"]]


def settled(gw: RunningGateway, expected_requests: int) -> None:
    """The cancelled stream's row is written when the gateway notices the client went away."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        total = sum(r["requests"] for r in rows_of(report(gw, "/v1/organizations/usage_report/messages").json()))
        if total >= expected_requests:
            return
        time.sleep(0.05)
    raise AssertionError("the ledger did not get every request")


def tokens(result: dict[str, Any]) -> Counter[str]:
    return Counter(
        {
            "input_tokens": result["uncached_input_tokens"],
            "output_tokens": result["output_tokens"],
            "cache_read_input_tokens": result["cache_read_input_tokens"],
            "cache_creation_input_tokens": result["cache_creation"]["ephemeral_5m_input_tokens"],
        }
    )


def test_the_reports_equal_what_the_clients_saw_and_the_metrics(gw: RunningGateway) -> None:
    saw = drive(gw)
    settled(gw, 5)
    path = "/v1/organizations/usage_report/messages"
    by_key = rows_of(report(gw, path, **{"group_by[]": ["api_key_id"]}).json())
    expected_by_key: dict[str, Counter[str]] = {}
    for (key, _), usage in saw.items():
        expected_by_key.setdefault(key, Counter()).update(usage)
    assert {r["api_key_id"]: +tokens(r) for r in by_key} == {k: +v for k, v in expected_by_key.items()}
    assert {r["api_key_id"]: r["requests"] for r in by_key} == {"alice": 2, "bob": 2, "carol": 1}

    by_team = rows_of(report(gw, path, **{"group_by[]": ["workspace_id"]}).json())
    teams: dict[str, Counter[str]] = {}
    for key, usage in expected_by_key.items():
        teams.setdefault(KEYS[key][1], Counter()).update(usage)
    assert {r["workspace_id"]: +tokens(r) for r in by_team} == {t: +v for t, v in teams.items()}

    by_model = rows_of(report(gw, path, **{"group_by[]": ["model"]}).json())
    models: dict[str, Counter[str]] = {}
    for (_, model), usage in saw.items():
        models.setdefault(model, Counter()).update(usage)
    assert {r["model"]: +tokens(r) for r in by_model} == {m: +v for m, v in models.items()}
    for r in by_model:
        assert (r["api_key_id"], r["workspace_id"], r["service_tier"]) == (None, None, None)  # not grouped by

    # ... and the Prometheus counters count the same tokens
    for token_type, short in [("input_tokens", "input"), ("output_tokens", "output")]:
        counted = gw.sample("gateway_tokens_total", alias="*", provider="claude", model="", type=short)
        assert counted == sum(u[token_type] for u in saw.values()), token_type

    # the cost report: the priced tokens, in cents, per team
    costs = rows_of(report(gw, "/v1/organizations/cost_report", **{"group_by[]": ["workspace_id"]}).json())
    for team, usage in teams.items():
        usd = (
            usage["input_tokens"] * PRICE["input"]
            + usage["output_tokens"] * PRICE["output"]
            + usage["cache_read_input_tokens"] * PRICE["cache_read"]
            + usage["cache_creation_input_tokens"] * PRICE["cache_creation"]
        ) / 1e6
        (row,) = [r for r in costs if r["workspace_id"] == team]
        assert row["currency"] == "USD" and float(row["amount"]) == pytest.approx(usd * 100)


def test_a_client_key_reads_its_own_usage_only_and_bad_queries_are_400(gw: RunningGateway) -> None:
    drive(gw)
    settled(gw, 5)
    path = "/v1/organizations/usage_report/messages"
    own = rows_of(report(gw, path, key="sk-carol", **{"group_by[]": ["api_key_id"]}).json())
    assert [r["api_key_id"] for r in own] == ["carol"]
    denied = report(gw, path, key="sk-nobody")
    assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
    for params in [{"bucket_width": "5m"}, {"group_by": "model"}, {"limit": "99"}, {"group_by[]": "service_tier"}]:
        bad = report(gw, path, **params)
        assert bad.status_code == 400 and bad.json()["type"] == "error", params
        assert bad.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.get(f"{gw.url}{path}", headers={"x-api-key": ADMIN})
    assert missing.status_code == 400 and "starting_at" in missing.json()["error"]["message"]


def test_buckets_pages_and_csv(gw: RunningGateway) -> None:
    drive(gw)
    settled(gw, 5)
    path = "/v1/organizations/usage_report/messages"
    first = report(gw, path, limit=1).json()  # the window is two days: two pages of one bucket
    assert len(first["data"]) == 1 and first["has_more"] and first["next_page"].startswith("page_")
    second = report(gw, path, limit=1, page=first["next_page"]).json()
    assert len(second["data"]) == 1 and not second["has_more"] and second["next_page"] is None
    assert first["data"][0]["ending_at"] == second["data"][0]["starting_at"]
    assert sum(r["requests"] for r in rows_of(first) + rows_of(second)) == 5
    hourly = report(gw, path, bucket_width="1h", limit=48).json()
    assert len(hourly["data"]) == 48 and sum(1 for b in hourly["data"] if b["results"]) >= 1
    csv = report(gw, path, format="csv", **{"group_by[]": ["api_key_id", "model"]})
    assert csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.strip().splitlines()
    assert lines[0].startswith("starting_at,ending_at,uncached_input_tokens") and len(lines) == 1 + 5


def test_metrics_labels_count_per_key_and_team_when_asked(fake: FakeClaudeAPI, tmp_path: Any) -> None:
    """``metrics: {labels: [key, team]}``: requests, tokens and cost per key and team in their own families;
    without it, no such series at all."""
    text = config(fake.base_url, f"sqlite:///{tmp_path}/l.db") + "metrics: {labels: [key, team]}\n"
    with run_gateway(text) as labelled:
        saw = drive(labelled)
        alice = sum((u for (key, _), u in saw.items() if key == "alice"), Counter())
        settled(labelled, 5)  # the cancelled stream is recorded when the gateway sees the client gone
        assert (
            labelled.sample("gateway_key_tokens_total", key="alice", team="payments", type="input")
            == (alice["input_tokens"])
        )
        assert labelled.sample("gateway_key_requests_total", key="carol", team="infra", outcome="completed") == 1
        assert labelled.sample("gateway_key_cost_usd_total", key="bob", team="payments") > 0
    with run_gateway(config(fake.base_url, f"sqlite:///{tmp_path}/m.db")) as plain:
        drive(plain)
        assert not any(m.name.startswith("gateway_key_") for m in plain.metrics.registry.collect())

"""The usage and cost reports at real time (issue 29, item 3): requests made a second ago, through the real SDK, are
in the reports' last bucket — the one that contains now, partial — with ``starting_at`` today (one bucket), yesterday
(two, the last with the requests), the current hour (``1h``), in the cost report and in CSV; and the status page's
"today" (the last bucket of the 1d usage report ``/ui/status.js`` asks for) is that same bucket."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

ADMIN = {"x-api-key": "sk-admin"}
PRICE = {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_creation": 3.75}  # USD per million
USAGE = "/v1/organizations/usage_report/messages"
COST = "/v1/organizations/cost_report"
DAY_S, HOUR_S = 86_400, 3_600
KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
TOKEN_TYPES = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def config(base_url: str, store_url: str) -> str:
    return f"""
auth:
  keys:
    - {{name: alice, key: sk-alice, team: payments}}
    - {{name: carol, key: sk-carol, team: infra}}
admin: {{keys: [sk-admin]}}
store: {{url: "{store_url}", flush_interval_s: 0.05}}
resilience: {{retry: {{max_attempts: 1}}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
pricing:
  "fake-*": {{{", ".join(f"{k}: {v}" for k, v in PRICE.items())}}}
"""


def iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def clear_of_the_hour(margin_s: float = 15.0) -> None:
    """Wait for the next hour when this one ends within ``margin_s``: the requests and the reports that must show
    them in the current hour (and day) fall in the same one."""
    left = HOUR_S - time.time() % HOUR_S
    if left < margin_s:
        time.sleep(left + 0.1)


def get(gw: RunningGateway, path: str, **params: Any) -> Any:
    answer = httpx.get(f"{gw.url}{path}", params=params, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return answer


def results(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for bucket in document["data"] for r in bucket["results"]]


def tokens(rows: list[dict[str, Any]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for r in rows:
        out["input_tokens"] += r["uncached_input_tokens"]
        out["output_tokens"] += r["output_tokens"]
        out["cache_read_input_tokens"] += r["cache_read_input_tokens"]
        out["cache_creation_input_tokens"] += r["cache_creation"]["ephemeral_5m_input_tokens"]
    return out


def usd(usage: Counter[str]) -> float:
    return (
        usage["input_tokens"] * PRICE["input"]
        + usage["output_tokens"] * PRICE["output"]
        + usage["cache_read_input_tokens"] * PRICE["cache_read"]
        + usage["cache_creation_input_tokens"] * PRICE["cache_creation"]
    ) / 1e6


def drive(gw: RunningGateway) -> Counter[str]:
    """Three requests under two keys of two teams, streamed and not; the usage the clients saw, added up."""
    saw: Counter[str] = Counter()

    def add(usage: Any) -> None:
        saw.update({t: getattr(usage, t) or 0 for t in TOKEN_TYPES})

    alice = anthropic.Anthropic(api_key="sk-alice", base_url=gw.url, max_retries=0)
    carol = anthropic.Anthropic(api_key="sk-carol", base_url=gw.url, max_retries=0)
    add(alice.messages.create(model="fake-text", **KW).usage)
    with alice.messages.stream(model="fake-text", **KW) as s:
        add(s.get_final_message().usage)
    add(carol.messages.create(model="fake-sonnet-1", **KW).usage)
    return saw


def test_requests_made_a_second_ago_are_in_todays_bucket(fake: FakeClaudeAPI, tmp_path: Any) -> None:
    with run_gateway(config(fake.base_url, f"sqlite:///{tmp_path}/ledger.db")) as gw:
        clear_of_the_hour()
        made = time.time()
        saw = drive(gw)
        today, hour = made // DAY_S * DAY_S, made // HOUR_S * HOUR_S
        # ending_at is not given: the window ends now, inside today's bucket (the rows are written in batches)
        deadline = time.monotonic() + 5
        while True:
            day = get(gw, USAGE, starting_at=iso(today)).json()
            if sum(r["requests"] for r in results(day)) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert time.time() - made < 5  # a few seconds at most: what follows is "today so far"
        assert [(b["starting_at"], b["ending_at"]) for b in day["data"]] == [(iso(today), iso(today + DAY_S))]
        assert not day["has_more"] and day["next_page"] is None
        (row,) = day["data"][0]["results"]
        assert row["requests"] == 3 and tokens([row]) == saw
        assert row["cost_usd"] == pytest.approx(usd(saw))

        # from yesterday: two buckets, yesterday's empty, the last one today's so far
        two = get(gw, USAGE, starting_at=iso(today - DAY_S)).json()
        assert [b["starting_at"] for b in two["data"]] == [iso(today - DAY_S), iso(today)]
        assert two["data"][0]["results"] == [] and two["data"][-1] == day["data"][0]

        # the current hour, in hours: one bucket (the hour so far) with the same requests
        hourly = get(gw, USAGE, starting_at=iso(hour), bucket_width="1h").json()
        assert [(b["starting_at"], b["ending_at"]) for b in hourly["data"]] == [(iso(hour), iso(hour + HOUR_S))]
        assert hourly["data"][0]["results"] == day["data"][0]["results"]

        # the cost report from today: the priced tokens, in cents, per team
        cost = get(gw, COST, starting_at=iso(today), **{"group_by[]": "workspace_id"}).json()
        assert [(b["starting_at"], b["ending_at"]) for b in cost["data"]] == [(iso(today), iso(today + DAY_S))]
        by_team = {r["workspace_id"]: float(r["amount"]) for r in cost["data"][0]["results"]}
        teams = get(gw, USAGE, starting_at=iso(today), **{"group_by[]": "workspace_id"}).json()
        want = {r["workspace_id"]: r["cost_usd"] * 100 for r in teams["data"][0]["results"]}
        assert set(by_team) == {"payments", "infra"} and by_team == pytest.approx(want)
        assert sum(by_team.values()) == pytest.approx(usd(saw) * 100)

        # ... and in CSV: one line per team, in today's bucket
        lines = get(gw, USAGE, starting_at=iso(today), format="csv", **{"group_by[]": "workspace_id"}).text
        bucket = f"{iso(today)},{iso(today + DAY_S)},"
        assert [line.startswith(bucket) for line in lines.strip().splitlines()[1:]] == [True, True]

        # The status page's "today": /ui/status.js reads the 1d usage report from the month's first day (to
        # tomorrow 00:00Z) per team and per key, and takes its last bucket. The same query here, with that
        # ending_at and without it, gives today's bucket above.
        script = httpx.get(f"{gw.url}/ui/status.js").text
        for shape in ("/v1/organizations/usage_report/messages", '["bucket_width", "1d"]', "body.data.slice(-1)"):
            assert shape in script, shape
        month = time.strftime("%Y-%m-01T00:00:00Z", time.gmtime(made))
        for group, by in (("workspace_id", teams), ("api_key_id", None)):
            today_only = by or get(gw, USAGE, starting_at=iso(today), **{"group_by[]": group}).json()
            for end in ({"ending_at": iso(today + DAY_S)}, {}):
                page = get(gw, USAGE, starting_at=month, bucket_width="1d", limit="31", **end, **{"group_by[]": group})
                last = page.json()["data"][-1]
                assert (last["starting_at"], last["results"]) == (iso(today), today_only["data"][-1]["results"])
        keys = {r["api_key_id"]: r["requests"] for r in results(today_only)}
        assert keys == {"alice": 2, "carol": 1}

        # GET /v1/gateway/status's own token and request totals are the metrics since the process started, not a
        # day's; this gateway started in today's hour, so they are today's too.
        (alias,) = get(gw, "/v1/gateway/status").json()["aliases"]
        assert alias["requests"] == {"completed": 3}
        short = dict(zip(("input", "output", "cache_read", "cache_creation"), TOKEN_TYPES, strict=True))
        assert {k: saw[v] for k, v in short.items()} == alias["tokens"]
        assert time.time() // HOUR_S * HOUR_S == hour, "the test ran past the hour it started in"


def test_starting_today_is_a_window_and_an_ending_at_before_it_is_not(fake: FakeClaudeAPI, tmp_path: Any) -> None:
    """``starting_at`` today 00:00Z with ``ending_at`` defaulted to now was a 400 ("ending date must be after
    starting date") when only whole buckets counted; an ending_at at or before starting_at still is one."""
    with run_gateway(config(fake.base_url, f"sqlite:///{tmp_path}/ledger.db")) as gw:
        clear_of_the_hour()
        now = time.time()
        today = now // DAY_S * DAY_S
        for path in (USAGE, COST):
            assert len(get(gw, path, starting_at=iso(today)).json()["data"]) == 1
            for params in ({"starting_at": iso(today), "ending_at": iso(today)}, {"starting_at": iso(now + 60)}):
                bad = httpx.get(f"{gw.url}{path}", params=params, headers=ADMIN)
                assert bad.status_code == 400, (path, params)
                assert bad.json()["error"]["message"] == "ending date must be after starting date"

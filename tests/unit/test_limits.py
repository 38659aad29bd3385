"""Rate limits and budgets in one process, on a fake clock: each kind of limit, the scopes (a key's own, the
defaults, a team's), the API's headers and error types, the calendar windows, and the overshoot bound."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from gateway.governance.keys import build_keys
from gateway.governance.limits import BudgetExceeded, Lease, Limiter, RateLimited, budget_window
from gateway.settings import ConfigError, Settings, parse_settings

T0 = datetime(2026, 12, 2, 10, 0, 30, tzinfo=UTC).timestamp()  # a Wednesday, 30 s into a minute


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def admit(limiter: Limiter, settings: Settings, key: object) -> tuple[Lease | None, dict[str, str]]:
    return asyncio.run(limiter.admit(settings, key))  # type: ignore[arg-type]


def setup(yaml: str) -> tuple[Settings, dict[str, object], Limiter, Clock]:
    settings = parse_settings(yaml)
    keys = {k.name: k for k in build_keys(settings.auth.keys, settings.teams)}
    clock = Clock()
    refused: list[tuple[str, str]] = []
    limiter = Limiter(clock, on_refusal=lambda limit, scope: refused.append((limit, scope)))
    limiter.refused = refused  # type: ignore[attr-defined]
    return settings, keys, limiter, clock


PRICING = 'pricing: {"m*": {input: 1000000}}\n'  # $1 per input token: budgets in round numbers


def test_requests_per_minute_refuse_the_next_one_with_the_apis_headers() -> None:
    settings, keys, limiter, clock = setup("auth: {keys: [{name: a, key: k, limits: {requests_per_minute: 2}}]}")
    lease, headers = admit(limiter, settings, keys["a"])
    assert lease is not None and headers["anthropic-ratelimit-requests-limit"] == "2"
    assert headers["anthropic-ratelimit-requests-remaining"] == "1"
    assert headers["anthropic-ratelimit-requests-reset"] == "2026-12-02T10:01:00Z"
    admit(limiter, settings, keys["a"])
    with pytest.raises(RateLimited) as info:
        admit(limiter, settings, keys["a"])
    assert (info.value.status_code, info.value.error_type) == (429, "rate_limit_error")
    assert (
        info.value.headers["retry-after"] == "30"
        and info.value.headers["anthropic-ratelimit-requests-remaining"] == "0"
    )
    assert limiter.refused == [("requests_per_minute", "key")]  # type: ignore[attr-defined]
    clock.now += 30  # the next minute
    admit(limiter, settings, keys["a"])


def test_tokens_per_minute_count_what_requests_used() -> None:
    settings, keys, limiter, clock = setup("auth: {keys: [{name: a, key: k, limits: {tokens_per_minute: 100}}]}")
    lease, _ = admit(limiter, settings, keys["a"])
    assert lease is not None
    lease.settle(100, None)
    lease.settle(100, None)  # settled once
    with pytest.raises(RateLimited, match="100 tokens per minute"):
        admit(limiter, settings, keys["a"])
    clock.now += 60
    _, headers = admit(limiter, settings, keys["a"])
    assert headers["anthropic-ratelimit-tokens-remaining"] == "100"


def test_max_inflight_frees_a_slot_when_a_request_ends() -> None:
    settings, keys, limiter, _ = setup("auth: {keys: [{name: a, key: k, limits: {max_inflight: 1}}]}")
    lease, _ = admit(limiter, settings, keys["a"])
    with pytest.raises(RateLimited, match="in flight"):
        admit(limiter, settings, keys["a"])
    assert lease is not None
    lease.settle(0, None)
    admit(limiter, settings, keys["a"])


def test_a_budget_is_a_billing_error_until_its_window_resets() -> None:
    settings, keys, limiter, clock = setup(
        "auth: {keys: [{name: a, key: k, limits: {budget: {usd: 2, per: day}}}]}\n" + PRICING
    )
    for _ in range(2):
        lease, _ = admit(limiter, settings, keys["a"])
        assert lease is not None
        lease.settle(10, 1.0)
    with pytest.raises(BudgetExceeded) as info:
        admit(limiter, settings, keys["a"])
    assert (info.value.status_code, info.value.error_type) == (429, "billing_error")
    assert info.value.headers["x-should-retry"] == "false"
    assert info.value.headers["retry-after"] == str(14 * 3600 - 30)  # until midnight UTC
    clock.now = datetime(2026, 12, 3, 0, 0, 1, tzinfo=UTC).timestamp()
    admit(limiter, settings, keys["a"])


def test_a_team_limit_is_shared_and_defaults_apply_to_keys_without_their_own() -> None:
    settings, keys, limiter, _ = setup(
        """
auth:
  keys:
    - {name: a, key: ka, team: pay, limits: {requests_per_minute: 100}}
    - {name: b, key: kb, team: pay, limits: {requests_per_minute: 100}}
    - {name: c, key: kc}
    - {name: d, key: kd, limits: {requests_per_minute: 100}}
limits: {requests_per_minute: 1}
teams:
  pay: {limits: {requests_per_minute: 3}, models: [sonnet]}
"""
    )
    assert keys["a"].models == ("sonnet",) and keys["c"].models is None  # type: ignore[attr-defined]
    for name in ("a", "b", "a"):  # the team's three, from two keys
        admit(limiter, settings, keys[name])
    with pytest.raises(RateLimited, match="team 'pay'"):  # b's own limit has room; the team's has none
        admit(limiter, settings, keys["b"])
    admit(limiter, settings, keys["c"])
    with pytest.raises(RateLimited, match="key 'c'"):  # no limits of its own: the default, 1 per minute
        admit(limiter, settings, keys["c"])
    for _ in range(5):  # d's own limit replaces the default
        admit(limiter, settings, keys["d"])
    assert limiter.refused == [("requests_per_minute", "team"), ("requests_per_minute", "key")]  # type: ignore[attr-defined]


def test_overshoot_is_at_most_the_usage_of_the_requests_admitted_under_the_budget() -> None:
    """N requests admitted while the budget still had room overshoot it by at most their own cost."""
    settings, keys, limiter, _ = setup(
        "auth: {keys: [{name: a, key: k, limits: {budget: {usd: 10, per: month}}}]}\n" + PRICING
    )
    first, _ = admit(limiter, settings, keys["a"])
    assert first is not None
    first.settle(1, 9.5)  # $0.50 left
    leases = [admit(limiter, settings, keys["a"])[0] for _ in range(5)]  # type: ignore[arg-type]
    for lease in leases:
        assert lease is not None
        lease.settle(1, 3.0)
    window, _ = budget_window("month", T0)
    spent = limiter.counters.values[f"key:a|usd|{window}"]  # type: ignore[attr-defined]
    assert spent == 9.5 + 5 * 3.0 <= 10 + 5 * 3.0
    with pytest.raises(BudgetExceeded):
        admit(limiter, settings, keys["a"])


def test_calendar_windows_in_utc() -> None:
    assert budget_window("day", T0) == ("day:2026-12-02", datetime(2026, 12, 3, tzinfo=UTC).timestamp())
    assert budget_window("week", T0) == ("week:2026-11-30", datetime(2026, 12, 7, tzinfo=UTC).timestamp())
    assert budget_window("month", T0) == ("month:2026-12-01", datetime(2027, 1, 1, tzinfo=UTC).timestamp())


def test_no_rules_no_lease_and_an_open_gateway_gets_the_defaults() -> None:
    settings, keys, limiter, _ = setup("auth: {keys: [plain]}")
    assert admit(limiter, settings, keys["key-1"]) == (None, {})
    settings, _, limiter, _ = setup("auth: {open: true}\nlimits: {requests_per_minute: 1}")
    admit(limiter, settings, None)
    with pytest.raises(RateLimited):
        admit(limiter, settings, None)


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("builtin_pricing: false\nauth: {keys: [{name: a, key: k, limits: {budget: {usd: 5}}}]}", "needs prices"),
        ("builtin_pricing: false\nauth: {keys: [k]}\nlimits: {budget: {usd: 5}}", "a budget needs prices"),
        ("auth: {keys: [{name: a, key: k, team: nope}]}\nteams: {pay: {}}", "names team 'nope'"),
        ("auth: {keys: [k]}\nlimits: {requests_per_minute: 0}", "requests_per_minute"),
    ],
)
def test_limit_config_errors(yaml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_settings(yaml)


def test_a_running_request_counts_its_tokens_and_cost_as_they_are_reported() -> None:
    """Input and cache tokens at ``message_start``, output at each ``message_delta`` (running totals): a second
    request is refused while the first is still streaming; the settlement counts only what was not yet counted."""
    settings, keys, limiter, _ = setup(
        "auth: {keys: [{name: a, key: k, limits: {tokens_per_minute: 100, budget: {usd: 5, per: day}}}]}\n" + PRICING
    )
    lease, _ = admit(limiter, settings, keys["a"])
    assert lease is not None
    lease.count(60, 2.0)  # message_start: 60 input tokens
    values = limiter.counters.values  # type: ignore[attr-defined]
    tokens = next(k for k in values if "|tokens|" in k)
    usd = next(k for k in values if "|usd|" in k)
    assert (values[tokens], values[usd]) == (60, 2.0)
    lease.count(100, 2.0)  # a message_delta: 40 output tokens so far
    assert values[tokens] == 100
    with pytest.raises(RateLimited, match="tokens per minute"):  # the first is still running
        admit(limiter, settings, keys["a"])
    lease.settle(110, 2.5)  # it ended with 10 more tokens and $0.50 more
    assert (values[tokens], values[usd]) == (110, 2.5)
    assert values[next(k for k in values if k.endswith("|inflight"))] == 0


def test_a_streams_tokens_reach_the_limiter_through_the_tally_at_message_start() -> None:
    import msgspec

    from gateway.context import RequestContext
    from gateway.observability.metrics import Metrics
    from gateway.observability.usage import UsageTally
    from gateway.wire.events import EventView

    settings, keys, limiter, _ = setup("auth: {keys: [{name: a, key: k, limits: {tokens_per_minute: 1000}}]}")
    lease, _ = admit(limiter, settings, keys["a"])
    context = RequestContext()
    context.lease = lease
    tally = UsageTally(Metrics(), alias="m", model="m", context=context)
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 7, "cache_read_input_tokens": 5}}}
    tally.observe(msgspec.json.decode(msgspec.json.encode(start), type=EventView))
    values = limiter.counters.values  # type: ignore[attr-defined]
    tokens = next(k for k in values if "|tokens|" in k)
    assert values[tokens] == 12
    delta = {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 30}}
    tally.observe(msgspec.json.decode(msgspec.json.encode(delta), type=EventView))
    assert values[tokens] == 42
    tally.record("client_cancelled")  # partial usage, settled: nothing counted twice
    assert values[tokens] == 42 and lease is not None and lease.settled


# Periods at their edges: a request is counted once, in the windows it was admitted in (gateway/governance/limits.py).


def at(text: str) -> float:
    """Epoch seconds of an RFC 3339 UTC time, fractions allowed: ``2026-12-02T23:59:59.5``."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# (per, admitted just before the window's end, settled just after, the admission's window, the next window)
EDGES = [
    ("day", "2026-12-02T23:59:59.5", "2026-12-03T00:00:01", "day:2026-12-02", "day:2026-12-03"),
    ("day", "2026-12-31T23:59:59.5", "2027-01-01T00:00:01", "day:2026-12-31", "day:2027-01-01"),
    ("week", "2026-12-06T23:59:59.5", "2026-12-07T00:00:01", "week:2026-11-30", "week:2026-12-07"),  # Sun -> Mon
    ("month", "2027-01-31T23:59:59.5", "2027-02-01T00:00:01", "month:2027-01-01", "month:2027-02-01"),
    ("month", "2026-12-31T23:59:59.5", "2027-01-01T00:00:01", "month:2026-12-01", "month:2027-01-01"),
    ("month", "2028-02-29T23:59:59.5", "2028-03-01T00:00:01", "month:2028-02-01", "month:2028-03-01"),  # leap day
]
EDGE_IDS = [f"{per}-{admitted[:10]}" for per, admitted, *_ in EDGES]


def budget_limiter(per: str, usd: float = 5) -> tuple[Settings, object, Limiter, Clock]:
    settings, keys, limiter, clock = setup(
        f"auth: {{keys: [{{name: a, key: k, limits: {{budget: {{usd: {usd:g}, per: {per}}}}}}}]}}\n" + PRICING
    )
    return settings, keys["a"], limiter, clock


@pytest.mark.parametrize(("per", "admitted", "settled", "window", "following"), EDGES, ids=EDGE_IDS)
def test_a_request_across_a_budget_windows_end_is_charged_once_to_the_window_it_was_admitted_in(
    per: str, admitted: str, settled: str, window: str, following: str
) -> None:
    settings, key, limiter, clock = budget_limiter(per)
    assert budget_window(per, at(admitted))[0] == window and budget_window(per, at(settled))[0] == following
    clock.now = at(admitted)
    lease, _ = admit(limiter, settings, key)
    assert lease is not None
    clock.now += 0.3  # message_start, still before the end
    lease.count(10, 1.0)
    clock.now = at(settled)  # the stream ends in the next window, with $4 more: the whole $5 is the admission's
    lease.count(30, 4.5)
    lease.settle(40, 5.0)
    lease.settle(40, 5.0)
    values = limiter.counters.values  # type: ignore[attr-defined]
    assert values[f"key:a|usd|{window}"] == 5.0
    assert f"key:a|usd|{following}" not in values  # the next window starts at 0 ...
    second, _ = admit(limiter, settings, key)  # ... and admits
    assert second is not None
    second.settle(40, 5.0)
    assert values[f"key:a|usd|{following}"] == 5.0 and values[f"key:a|usd|{window}"] == 5.0
    with pytest.raises(BudgetExceeded, match=r"spent \$5\.00 of its \$5 budget"):
        admit(limiter, settings, key)


def test_a_week_across_new_year_is_one_window() -> None:
    """ISO weeks from Monday: Thursday 31 Dec 2026 and Friday 1 Jan 2027 are both in the week of Monday 28 Dec."""
    settings, key, limiter, clock = budget_limiter("week")
    clock.now = at("2026-12-31T23:59:59.5")
    lease, _ = admit(limiter, settings, key)
    assert lease is not None
    clock.now = at("2027-01-01T00:00:01")
    lease.settle(40, 5.0)
    assert budget_window("week", clock.now)[0] == "week:2026-12-28"
    assert limiter.counters.values["key:a|usd|week:2026-12-28"] == 5.0  # type: ignore[attr-defined]
    with pytest.raises(BudgetExceeded):
        admit(limiter, settings, key)


# (per, the last second of a window, the first of the next)
RESETS = [
    ("day", "2026-12-02T23:59:59", "2026-12-03T00:00:00"),
    ("week", "2026-12-06T23:59:59", "2026-12-07T00:00:00"),
    ("month", "2027-01-31T23:59:59", "2027-02-01T00:00:00"),
    ("month", "2026-12-31T23:59:59", "2027-01-01T00:00:00"),
]


@pytest.mark.parametrize(("per", "last", "first"), RESETS, ids=[f"{p}-{last[:10]}" for p, last, _ in RESETS])
def test_an_exhausted_budget_refuses_to_its_last_second_and_admits_at_the_next_windows_first(
    per: str, last: str, first: str
) -> None:
    settings, key, limiter, clock = budget_limiter(per)
    clock.now = at(last) - 3600  # spent an hour before the end
    lease, _ = admit(limiter, settings, key)
    assert lease is not None
    lease.settle(40, 5.0)
    for now in (at(last), at(last) + 0.999):
        clock.now = now
        with pytest.raises(BudgetExceeded) as info:
            admit(limiter, settings, key)
        assert info.value.headers["retry-after"] == "1"
        assert f"resets at {first}Z" in str(info.value.message)
    clock.now = at(first)
    lease, _ = admit(limiter, settings, key)
    assert lease is not None


def test_a_request_admitted_at_a_minutes_end_and_settled_in_the_next_is_counted_once_in_the_first() -> None:
    """``requests_per_minute`` counts it at admission; its tokens, reported before and after the minute's end,
    all go to the minute it was admitted in; the next minute starts with nothing of it."""
    settings, keys, limiter, clock = setup(
        "auth: {keys: [{name: a, key: k, limits: {requests_per_minute: 2, tokens_per_minute: 100}}]}"
    )
    clock.now = at("2026-12-02T10:00:59.5")
    minute = int(clock.now // 60)
    lease, _ = admit(limiter, settings, keys["a"])
    assert lease is not None
    clock.now += 0.4
    lease.count(60, None)  # message_start at 10:00:59.9
    clock.now = at("2026-12-02T10:01:00.5")
    lease.count(90, None)  # a message_delta in the next minute
    lease.settle(100, None)
    values = limiter.counters.values  # type: ignore[attr-defined]
    assert values[f"key:a|requests|{minute}"] == 1 and values[f"key:a|tokens|{minute}"] == 100
    assert f"key:a|tokens|{minute + 1}" not in values and f"key:a|requests|{minute + 1}" not in values
    assert values["key:a|inflight"] == 0
    _, headers = admit(limiter, settings, keys["a"])  # the next minute: all of it
    assert headers["anthropic-ratelimit-tokens-remaining"] == "100"
    assert headers["anthropic-ratelimit-requests-remaining"] == "1"
    assert headers["anthropic-ratelimit-requests-reset"] == "2026-12-02T10:02:00Z"


def test_a_stream_longer_than_a_minute_counts_its_tokens_in_its_admission_minute() -> None:
    """A stream admitted at 10:00:30 that reports output for three minutes: every token in 10:00's counter (the
    minute whose admission check let it in), none in the minutes it ran on through."""
    settings, keys, limiter, clock = setup("auth: {keys: [{name: a, key: k, limits: {tokens_per_minute: 1000}}]}")
    minute = int(clock.now // 60)
    lease, _ = admit(limiter, settings, keys["a"])
    assert lease is not None
    for i in range(1, 4):
        clock.now += 60
        lease.count(100 * i, None)
    lease.settle(400, None)
    values = limiter.counters.values  # type: ignore[attr-defined]
    assert {k: v for k, v in values.items() if "|tokens|" in k} == {f"key:a|tokens|{minute}": 400}


def test_the_test_only_period_makes_every_budget_window_that_many_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MESSAGES_GATEWAY_TEST_PERIOD_S`` (what tests/e2e/test_limit_periods.py sets): windows of that many seconds,
    aligned to the epoch, for day, week and month alike; read when the limiter is made."""
    assert budget_window("day", 1_000_009.9, 10) == ("day:test-10s-100000", 1_000_010)
    assert budget_window("month", 1_000_010, 10) == ("month:test-10s-100001", 1_000_020)
    monkeypatch.setenv("MESSAGES_GATEWAY_TEST_PERIOD_S", "10")
    settings, key, limiter, clock = budget_limiter("month")
    clock.now = 1_000_009.5
    lease, _ = admit(limiter, settings, key)
    assert lease is not None
    clock.now = 1_000_010.5  # settled in the next period: charged to the admission's
    lease.settle(40, 5.0)
    assert limiter.counters.values == {  # type: ignore[attr-defined]
        "key:a|usd|month:test-10s-100000": 5.0,
        "key:a|requests|16666": 1,
        "key:a|tokens|16666": 40,
        "key:a|inflight": 0,
    }
    admit(limiter, settings, key)
    monkeypatch.setenv("MESSAGES_GATEWAY_TEST_PERIOD_S", "0")
    with pytest.raises(ValueError, match="positive"):
        Limiter()


def test_in_memory_a_slot_given_back_after_its_counter_expired_leaves_no_negative_count() -> None:
    from gateway.governance.limits import MemoryCounters

    counters = MemoryCounters()
    counters.add_now([("a|inflight", 1, 10), ("b|inflight", 1, 100)], now=0)
    counters.add_now([("a|inflight", -1, 10), ("b|inflight", -1, 10), ("c|inflight", -1, 10)], now=50)
    assert "c|inflight" not in counters.values
    assert counters.values.get("a|inflight", 0) >= 0 and counters.values["b|inflight"] == 0
    counters.add_now([("b|inflight", -1, 10)], now=51)
    assert counters.values["b|inflight"] == 0


def test_budgets_are_seeded_from_the_ledger_for_the_current_window_only_and_never_lowered() -> None:
    """The in-memory twin of the restart test: a memory store holding this month's and last month's spend."""
    from gateway.governance.limits import budget_window_start, seed_budgets
    from gateway.governance.store import LedgerRow, MemoryStore

    settings, keys, limiter, clock = setup(
        "auth: {keys: [{name: a, key: k, team: t, limits: {budget: {usd: 2, per: month}}},"
        " {name: b, key: kb, team: t}]}\n"
        "teams: {t: {limits: {budget: {usd: 5, per: day}}}}\n" + PRICING
    )
    store = MemoryStore()
    month = budget_window_start("month", clock.now)
    day = budget_window_start("day", clock.now)
    assert datetime.fromtimestamp(month, UTC) == datetime(2026, 12, 1, tzinfo=UTC)
    assert datetime.fromtimestamp(day, UTC) == datetime(2026, 12, 2, tzinfo=UTC)
    rows = [
        LedgerRow(
            started_ms=int((month - 3600) * 1000), request_id="last-month", key_name="a", team="t", cost_usd=50.0
        ),
        LedgerRow(started_ms=int((month + 60) * 1000), request_id="this-month", key_name="a", team="t", cost_usd=1.5),
        LedgerRow(started_ms=int((day + 60) * 1000), request_id="today", key_name="b", team="t", cost_usd=4.0),
    ]
    asyncio.run(store.write(rows))
    assert asyncio.run(seed_budgets(limiter, settings, store, now=clock.now)) >= 3
    lease, _ = admit(limiter, settings, keys["a"])  # $1.5 of its $2 this month (last month's $50 is not this window)
    assert lease is not None
    lease.settle(10, 1.0)
    with pytest.raises(BudgetExceeded):  # now $2.5 of $2
        admit(limiter, settings, keys["a"])
    with pytest.raises(BudgetExceeded):  # the team: $4 (b, today) + $1 (a's request now) of $5 a day
        admit(limiter, settings, keys["b"])
    asyncio.run(seed_budgets(limiter, settings, store, now=clock.now))  # a second seed lowers nothing
    with pytest.raises(BudgetExceeded):
        admit(limiter, settings, keys["a"])


def test_a_billing_error_shows_the_precision_a_small_budget_needs() -> None:
    from gateway.governance.limits import usd

    assert (usd(0.0012, 0.0015), usd(0.0015, 0.0015)) == ("$0.0012", "$0.0015")
    assert (usd(12.345, 15), usd(1234.5, 2000), usd(0.05, 0.1)) == ("$12.35", "$1,234.50", "$0.05")
    settings, keys, limiter, _ = setup(
        "auth: {keys: [{name: a, key: k, limits: {budget: {usd: 0.0015, per: day}}}]}\n" + PRICING
    )
    lease, _ = admit(limiter, settings, keys["a"])
    assert lease is not None
    lease.settle(10, 0.0016)
    with pytest.raises(BudgetExceeded) as info:
        admit(limiter, settings, keys["a"])
    assert "has spent $0.0016 of its $0.0015 budget" in info.value.message


def test_a_keys_plan_is_made_once_a_minute_and_again_when_the_config_is_reloaded() -> None:
    """The counters and header texts of a key's admission are planned once a minute (``_Plan``), and made again
    for a new minute or for limits a reload replaced — never an old minute's counters, never an old limit."""
    yaml = "auth: {keys: [{name: a, key: k, team: t, limits: {requests_per_minute: %d}}]}\n"
    yaml += "teams: {t: {limits: {tokens_per_minute: 1000, max_inflight: 50}}}\n"
    settings, keys, limiter, clock = setup(yaml % 5)
    admit(limiter, settings, keys["a"])
    (plan,) = limiter._plans.values()
    _, headers = admit(limiter, settings, keys["a"])
    assert list(limiter._plans.values()) == [plan]  # the same plan, the counts moving on
    assert headers["anthropic-ratelimit-requests-remaining"] == "3"
    assert headers["anthropic-ratelimit-tokens-limit"] == "1000"
    clock.now += 30  # the next minute: its own counters
    _, headers = admit(limiter, settings, keys["a"])
    (later,) = limiter._plans.values()
    assert later is not plan and later.minute == plan.minute + 1
    assert headers["anthropic-ratelimit-requests-remaining"] == "4"
    assert headers["anthropic-ratelimit-requests-reset"] == "2026-12-02T10:02:00Z"
    reloaded = parse_settings(yaml % 2)  # a reload: the key's limit is now 2
    reloaded_keys = {k.name: k for k in build_keys(reloaded.auth.keys, reloaded.teams)}
    _, headers = admit(limiter, reloaded, reloaded_keys["a"])
    assert headers["anthropic-ratelimit-requests-limit"] == "2"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"  # two counted in this minute already
    with pytest.raises(RateLimited, match="2 requests per minute"):
        admit(limiter, reloaded, reloaded_keys["a"])


def test_budgets_are_planned_at_each_admission_not_kept() -> None:
    settings, keys, limiter, _ = setup(PRICING + "auth: {keys: [{name: a, key: k, limits: {budget: {usd: 5}}}]}")
    lease, _ = admit(limiter, settings, keys["a"])
    assert lease is not None and not limiter._plans


@pytest.mark.parametrize("budget", [False, True], ids=["planned-a-minute", "planned-each-admission"])
def test_the_headers_name_the_most_restrictive_rule_of_each_kind(budget: bool) -> None:
    """A key's own limits and its team's: each header kind tells the rule with the least left (after this request
    for requests, before it for tokens) — kept in a minute's plan, or planned at each admission under a budget."""
    own = "{requests_per_minute: 10, tokens_per_minute: 500}"
    team = "{requests_per_minute: 3, tokens_per_minute: 1000" + (", budget: {usd: 100}" if budget else "") + "}"
    yaml = PRICING + f"auth: {{keys: [{{name: a, key: k, team: t, limits: {own}}}]}}\nteams: {{t: {{limits: {team}}}}}"
    settings, keys, limiter, _ = setup(yaml)
    lease, headers = admit(limiter, settings, keys["a"])
    assert lease is not None and bool(limiter._plans) is not budget
    lease.settle(400, None)
    _, headers = admit(limiter, settings, keys["a"])
    assert headers["anthropic-ratelimit-requests-limit"] == "3"  # the team's: 1 left after this one
    assert headers["anthropic-ratelimit-requests-remaining"] == "1"
    assert headers["anthropic-ratelimit-tokens-limit"] == "500"  # the key's own: 100 left, the team's 600
    assert headers["anthropic-ratelimit-tokens-remaining"] == "100"
    assert headers["anthropic-ratelimit-requests-reset"] == headers["anthropic-ratelimit-tokens-reset"]
    assert headers["anthropic-ratelimit-requests-reset"] == "2026-12-02T10:01:00Z"
    admit(limiter, settings, keys["a"])
    with pytest.raises(RateLimited) as info:  # none left: the refusal's headers say 0, never below
        admit(limiter, settings, keys["a"])
    assert info.value.headers["anthropic-ratelimit-requests-remaining"] == "0"


def test_a_principal_made_anew_each_request_shares_its_rules_and_its_minutes_plan() -> None:
    """A JWT's or a sign-in's principal is a new ``ClientKey`` at every request: its rules and its minute's plan are
    made once for all of them (by the key's id and team, the config and the key's own limits), and counted
    together; another principal, or the same one under a new config, has its own."""
    from gateway.governance.keys import ClientKey

    yaml = "auth: {open: true}\nlimits: {requests_per_minute: %d}\nteams: {t: {limits: {max_inflight: 9}}}\n"
    settings, _, limiter, _ = setup(yaml % 5)

    def bob() -> ClientKey:
        return ClientKey(name="jwt:bob", team="t", user="bob", digest=b"-")

    for left in ("4", "3", "2"):
        _, headers = admit(limiter, settings, bob())
        assert headers["anthropic-ratelimit-requests-remaining"] == left
    assert len(limiter._plans) == 1 and len(limiter._rules_of) == 1
    (plan,) = limiter._plans.values()
    assert [scope for scope, _ in plan.rules] == ["key:jwt:bob", "team:t"]
    _, headers = admit(limiter, settings, ClientKey(name="jwt:ann", team="t", user="ann", digest=b"-"))
    assert headers["anthropic-ratelimit-requests-remaining"] == "4" and len(limiter._plans) == 2
    reloaded = parse_settings(yaml % 4)  # a reload: bob's minute so far (3) counts against the new limit
    _, headers = admit(limiter, reloaded, bob())
    assert headers["anthropic-ratelimit-requests-limit"] == "4"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    with pytest.raises(RateLimited):
        admit(limiter, reloaded, bob())

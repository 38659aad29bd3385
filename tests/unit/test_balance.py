"""Routing and resilience decisions: breaker, strategies, retry policy, client hints (fake clock = floats)."""

from __future__ import annotations

import random
from collections import Counter
from email.utils import formatdate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.routing.balance import (
    Balancer,
    RetryPolicy,
    TargetHealth,
    panic_order,
    plan,
)


def health(**kw: float) -> TargetHealth:
    return TargetHealth(
        failure_threshold=int(kw.pop("failure_threshold", 3)),
        window_s=kw.pop("window_s", 10.0),
        cooldown_s=kw.pop("cooldown_s", 30.0),
        **kw,
    )


def tripped(now: float = 0.0, cooldown_s: float = 30.0) -> TargetHealth:
    h = health(cooldown_s=cooldown_s)
    for _ in range(3):
        h.record_failure(now)
    assert h.state(now) == "open"
    return h


# -- breaker --------------------------------------------------------------------------------------


def test_opens_after_n_failures_within_the_window() -> None:
    h = health()
    h.record_failure(0.0)
    h.record_failure(5.0)
    assert h.state(5.0) == "closed" and h.allow(5.0)
    h.record_failure(10.0)  # third failure, 10 s after the first: still within window_s
    assert h.state(10.0) == "open"
    assert not h.allow(10.0) and not h.available(10.0)
    assert h.cooldown_remaining(10.0) == 30.0


def test_failures_spread_beyond_the_window_do_not_open() -> None:
    h = health()
    for t in (0.0, 6.0, 12.0, 18.0, 24.0):  # never 3 within 10 s
        h.record_failure(t)
    assert h.state(24.0) == "closed"
    assert h.failures == 5 and h.consecutive_failures == 5


def test_successes_in_between_do_not_reset_the_window_count() -> None:
    h = health()
    for t in (0.0, 1.0, 2.0):
        h.record_failure(t)
        h.record_success(t + 0.5)
    assert h.state(2.0) == "open"
    assert h.consecutive_failures == 0  # the last report was a success


def test_stays_open_for_the_cooldown() -> None:
    h = tripped(now=100.0)
    for t in (100.0, 110.0, 129.999):
        assert h.state(t) == "open" and not h.allow(t)
    assert h.cooldown_remaining(120.0) == pytest.approx(10.0)
    assert h.state(130.0) == "half_open" and h.cooldown_remaining(130.0) == 0.0


def test_failures_while_open_do_not_extend_the_cooldown() -> None:
    h = tripped()
    h.record_failure(20.0)
    assert h.cooldown_remaining(20.0) == 10.0


def test_success_while_open_does_not_cut_the_cooldown_short() -> None:
    h = tripped()
    h.record_success(5.0)  # a straggler started before the breaker opened
    assert h.state(5.0) == "open"


def test_half_open_allows_exactly_one_probe() -> None:
    h = tripped()
    assert h.available(30.0)
    assert h.available(30.0)  # peeking does not take the slot
    assert h.allow(30.0)
    assert not h.allow(30.0) and not h.allow(31.0)
    assert not h.available(31.0)
    assert h.state(31.0) == "half_open"


def test_probe_success_closes_and_clears() -> None:
    h = tripped()
    assert h.allow(30.0)
    h.record_success(31.0, ttft_s=0.4)
    assert h.state(31.0) == "closed"
    assert h.allow(31.0) and h.allow(31.0)
    h.record_failure(32.0)
    h.record_failure(32.0)
    assert h.state(32.0) == "closed"  # the failures before the trip were cleared


def test_probe_failure_reopens_with_a_fresh_cooldown() -> None:
    h = tripped()
    assert h.allow(30.0)
    h.record_failure(35.0)
    assert h.state(35.0) == "open"
    assert h.cooldown_remaining(35.0) == 30.0
    assert not h.allow(64.0)
    assert h.allow(65.0)  # half-open again: a new probe


def test_a_probe_that_never_reports_is_forgotten_after_the_probe_timeout() -> None:
    h = TargetHealth(1, 10.0, 5.0, probe_timeout_s=20.0)
    h.record_failure(0.0)
    assert h.allow(5.0)
    assert not h.allow(24.9)
    assert h.allow(25.0)


def test_zero_cooldown_goes_straight_to_half_open() -> None:
    h = TargetHealth(1, 10.0, 0.0)
    h.record_failure(0.0)
    assert h.state(0.0) == "half_open"
    assert h.allow(0.0) and not h.allow(0.0)


def test_counters_inflight_and_snapshot() -> None:
    h = health(failure_threshold=5)
    h.begin()
    h.begin()
    h.end()
    h.record_success(1.0, ttft_s=0.5)
    h.record_failure(2.0)
    h.record_failure(3.0)
    h.record_success(4.0)
    h.record_failure(5.0)
    assert (h.successes, h.failures, h.consecutive_failures) == (2, 3, 1)
    assert h.snapshot(5.0) == {
        "state": "closed",
        "cooldown_remaining_s": 0.0,
        "throttled_remaining_s": 0.0,
        "success_rate": 0.4,
        "ttft_ewma_s": 0.5,
        "inflight": 1,
        "successes": 2,
        "failures": 3,
        "consecutive_failures": 1,
    }
    h.end()
    h.end()
    assert h.inflight == 0


def test_success_rate_covers_only_the_window() -> None:
    h = health(window_s=10.0)
    assert h.success_rate(0.0) is None
    h.record_failure(0.0)
    h.record_failure(1.0)
    h.record_success(5.0)
    assert h.success_rate(5.0) == pytest.approx(1 / 3)
    assert h.success_rate(10.5) == pytest.approx(1 / 2)  # the failure at 0 s aged out
    assert h.success_rate(15.5) is None


def test_ttft_ewma() -> None:
    h = health(ttft_alpha=0.3)
    assert h.ttft_ewma_s is None
    h.record_success(0.0)  # no sample: unchanged
    assert h.ttft_ewma_s is None
    h.record_success(0.0, ttft_s=1.0)
    assert h.ttft_ewma_s == 1.0  # the first sample seeds it
    h.record_success(0.0, ttft_s=2.0)
    assert h.ttft_ewma_s == pytest.approx(0.3 * 2.0 + 0.7 * 1.0)
    h.record_success(0.0, ttft_s=0.0)
    assert h.ttft_ewma_s == pytest.approx(0.7 * 1.3)


@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=50), st.floats(0.01, 1.0))
def test_ttft_ewma_stays_within_the_samples(samples: list[float], alpha: float) -> None:
    h = health(ttft_alpha=alpha)
    for s in samples:
        h.record_success(0.0, ttft_s=s)
    assert h.ttft_ewma_s is not None
    assert min(samples) - 1e-9 <= h.ttft_ewma_s <= max(samples) + 1e-9


@given(st.lists(st.tuples(st.sampled_from(["ok", "fail", "allow"]), st.floats(0.0, 5.0)), max_size=60))
def test_breaker_invariants(ops: list[tuple[str, float]]) -> None:
    h = health(cooldown_s=3.0)
    now = 0.0
    for op, dt in ops:
        now += dt
        before = h.state(now)
        if op == "ok":
            h.record_success(now)
        elif op == "fail":
            h.record_failure(now)
        else:
            expected = h.available(now)
            assert h.allow(now) is expected
            if before == "half_open" and expected:
                assert not h.allow(now)  # the one probe is taken
        state = h.state(now)
        assert (state == "open") == (h.cooldown_remaining(now) > 0)
        if before == "half_open" and op == "ok":
            assert state == "closed"
        if before == "half_open" and op == "fail":
            assert state == "open" and h.cooldown_remaining(now) == pytest.approx(3.0)
        if state == "closed":
            assert h.allow(now)


def test_constructor_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        TargetHealth(0, 10.0, 5.0)
    with pytest.raises(ValueError):
        TargetHealth(1, 10.0, 5.0, ttft_alpha=0.0)


# -- strategies -----------------------------------------------------------------------------------


def first_picks(balancer: Balancer, n: int = 1000) -> Counter[int]:
    return Counter(balancer.plan(0.0)[0] for _ in range(n))


def test_fallback_is_config_order() -> None:
    b = Balancer("fallback", [health() for _ in range(3)], rng=random.Random(1))
    assert all(b.plan(0.0) == [0, 1, 2] for _ in range(1000))


def test_weighted_first_pick_is_proportional_and_the_rest_by_weight() -> None:
    b = Balancer("weighted", [health(), health()], [3.0, 1.0], rng=random.Random(7))
    picks = first_picks(b)
    assert 700 <= picks[0] <= 800 and picks[0] + picks[1] == 1000
    b3 = Balancer("weighted", [health(), health(), health()], [1.0, 5.0, 3.0], rng=random.Random(7))
    for _ in range(200):
        order = b3.plan(0.0)
        assert sorted(order) == [0, 1, 2]
        assert [i for i in [1, 2, 0] if i != order[0]] == order[1:]


def test_weighted_zero_weight_is_fallback_only() -> None:
    b = Balancer("weighted", [health(), health()], [0.0, 1.0], rng=random.Random(3))
    assert all(b.plan(0.0) == [1, 0] for _ in range(200))
    assert plan("weighted", [health(), health()], [0.0, 0.0], now=0.0, rng=random.Random(0)) == [0, 1]


def test_round_robin_is_exactly_even_and_rotates() -> None:
    b = Balancer("round_robin", [health() for _ in range(4)], rng=random.Random(0))
    assert [b.plan(0.0) for _ in range(4)] == [[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1], [3, 0, 1, 2]]
    assert first_picks(b) == {0: 250, 1: 250, 2: 250, 3: 250}


def test_round_robin_skips_cooling_targets() -> None:
    b = Balancer("round_robin", [health(), tripped(), health()], rng=random.Random(0))
    assert first_picks(b) == {0: 500, 2: 500}
    assert b.plan(0.0) in ([0, 2], [2, 0])


def test_least_latency_measures_unmeasured_targets_first() -> None:
    hs = [health(), health(), health()]
    hs[1].record_success(0.0, ttft_s=0.2)
    assert plan("least_latency", hs, now=0.0, rng=random.Random(0), explore=0.0) == [0, 2, 1]


def test_least_latency_picks_the_fastest_and_explores_the_rest() -> None:
    hs = [health(), health(), health()]
    for h, ttft in zip(hs, (0.9, 0.3, 0.6), strict=True):
        h.record_success(0.0, ttft_s=ttft)
    b = Balancer("least_latency", hs, rng=random.Random(11), explore=0.1)
    picks = first_picks(b)
    assert 860 <= picks[1] <= 940
    assert picks[0] > 20 and picks[2] > 20  # exploration reaches every other target
    order = plan("least_latency", hs, now=0.0, rng=random.Random(0), explore=0.0)
    assert order == [1, 2, 0]


def test_cooling_targets_are_left_out() -> None:
    hs = [tripped(), health(), tripped(), health()]
    for strategy in ("fallback", "weighted", "round_robin", "least_latency"):
        b = Balancer(strategy, hs, [1.0, 1.0, 1.0, 1.0], rng=random.Random(5))
        for _ in range(50):
            assert sorted(b.plan(1.0)) == [1, 3]


def test_a_half_open_target_is_planned_until_its_probe_is_taken() -> None:
    hs = [tripped(), health()]
    assert plan("fallback", hs, now=30.0, rng=random.Random(0)) == [0, 1]
    assert hs[0].allow(30.0)
    assert plan("fallback", hs, now=30.0, rng=random.Random(0)) == [1]


def test_all_cooling_gives_an_empty_plan_and_the_panic_order() -> None:
    hs = [tripped(now=0.0), tripped(now=10.0), tripped(now=5.0)]
    for strategy in ("fallback", "weighted", "round_robin", "least_latency"):
        assert Balancer(strategy, hs, rng=random.Random(0)).plan(12.0) == []
    assert Balancer("fallback", hs).panic_order(12.0) == [0, 2, 1]  # free at 30, 35, 40


def test_balancer_snapshot() -> None:
    b = Balancer("fallback", [health(), tripped()])
    assert [s["state"] for s in b.snapshot(1.0)] == ["closed", "open"]


def test_bad_strategy_or_weights() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        Balancer("random", [health()])
    with pytest.raises(ValueError, match="unknown strategy"):
        plan("random", [health()], now=0.0, rng=random.Random(0))
    with pytest.raises(ValueError):
        Balancer("weighted", [health(), health()], [1.0])
    with pytest.raises(ValueError):
        Balancer("weighted", [health()], [-1.0])


# -- retry policy ---------------------------------------------------------------------------------

NOW = 1_700_000_000.0


class ZeroRng(random.Random):
    def random(self) -> float:
        return 0.0


class OneRng(random.Random):
    def random(self) -> float:
        return 1.0


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 529, None])
def test_retryable_statuses(status: int | None) -> None:
    assert RetryPolicy().retryable_status(status)
    assert RetryPolicy().decide(status, {}, 1, rng=ZeroRng()) == 0.5


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 409, 422, 501, 200])
def test_not_retryable_statuses(status: int) -> None:
    assert not RetryPolicy().retryable_status(status)
    assert RetryPolicy().decide(status, {}, 1, rng=ZeroRng()) is None


@pytest.mark.parametrize(
    ("attempt", "rng", "expected"),
    [
        (1, ZeroRng(), 0.5),
        (2, ZeroRng(), 1.0),
        (3, ZeroRng(), 2.0),
        (5, ZeroRng(), 8.0),
        (9, ZeroRng(), 8.0),  # capped at max_delay_s
        (1, OneRng(), 0.375),  # full jitter takes off 25 %
        (6, OneRng(), 6.0),
    ],
)
def test_exponential_backoff_with_jitter(attempt: int, rng: random.Random, expected: float) -> None:
    assert RetryPolicy(max_attempts=10).decide(503, {}, attempt, rng=rng) == pytest.approx(expected)


@given(st.integers(1, 30), st.floats(0.0, 1.0, exclude_max=True))
def test_backoff_bounds(attempt: int, draw: float) -> None:
    class Fixed(random.Random):
        def random(self) -> float:
            return draw

    delay = RetryPolicy(max_attempts=100).decide(None, {}, attempt, rng=Fixed())
    assert delay is not None
    cap = min(0.5 * 2 ** (attempt - 1), 8.0)
    assert 0.75 * cap - 1e-12 <= delay <= cap


def test_stops_when_attempts_are_exhausted() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert policy.decide(503, {}, 2, rng=ZeroRng()) is not None
    assert policy.decide(503, {}, 3, rng=ZeroRng()) is None
    assert policy.decide(503, {"x-should-retry": "true"}, 3, rng=ZeroRng()) is None
    assert RetryPolicy(max_attempts=1).decide(None, {}, 1, rng=ZeroRng()) is None
    with pytest.raises(ValueError):
        policy.decide(503, {}, 0, rng=ZeroRng())


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (503, {"x-should-retry": "false"}, None),
        (None, {"X-Should-Retry": "FALSE"}, None),
        (409, {"x-should-retry": "true"}, 0.5),
        (400, {"x-should-retry": "true"}, 0.5),
        (409, {"x-should-retry": "maybe"}, None),
        (503, {"retry-after-ms": "1500"}, 1.5),
        (503, {"Retry-After-Ms": "250.5"}, 0.2505),
        (503, {"retry-after-ms": "1500", "retry-after": "9"}, 1.5),  # the ms header wins
        (503, {"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
        (503, {"retry-after-ms": "0", "retry-after": "9"}, 9.0),
        (503, {"retry-after": "2"}, 2.0),
        (429, {"Retry-After": "0.25"}, 0.25),
        (503, {"retry-after": "60"}, 60.0),
        (503, {"retry-after": "61"}, None),  # too long to wait: fail over / tell the client
        (503, {"retry-after-ms": "60001"}, None),
        (503, {"retry-after": "0"}, 0.5),  # not positive: ignored, exponential backoff
        (503, {"retry-after": "-3"}, 0.5),
        (503, {"retry-after": "soon"}, 0.5),
        (503, {"retry-after": "nan"}, 0.5),
        (503, {"retry-after": formatdate(NOW + 30, usegmt=True)}, 30.0),
        (503, {"retry-after": formatdate(NOW + 60, usegmt=True)}, 60.0),
        (503, {"retry-after": formatdate(NOW + 120, usegmt=True)}, None),
        (503, {"retry-after": formatdate(NOW - 10, usegmt=True)}, 0.5),  # in the past: ignored
        (400, {"retry-after": "2"}, None),  # a hint does not make a status retryable
        (200, {"x-should-retry": "true", "retry-after": "3"}, 3.0),
    ],
)
def test_retry_headers(status: int | None, headers: dict[str, str], expected: float | None) -> None:
    delay = RetryPolicy().decide(status, headers, 1, rng=ZeroRng(), now_epoch=NOW)
    assert delay == (None if expected is None else pytest.approx(expected))


def test_http_date_defaults_to_the_wall_clock() -> None:
    far = formatdate(4_000_000_000, usegmt=True)  # year 2096
    assert RetryPolicy().decide(503, {"retry-after": far}, 1, rng=ZeroRng()) is None


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(jitter=1.5)


# --- one retry table, the probe slot given back, 429 throttling, the panic order ----------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 501, 502, 503, 504, 529])
def test_one_table_decides_retries_and_failures(status: int) -> None:
    """What the retry policy retries is exactly what counts as the provider's (retryable) failure."""
    from gateway.wire.errors import UpstreamStatusError

    error = UpstreamStatusError(status, "x", "m")
    assert RetryPolicy().retryable_status(status) is error.retryable


@pytest.mark.parametrize("ending", ["non_retryable_error", "cancelled"])
def test_a_probe_that_ends_without_a_verdict_gives_its_slot_back(ending: str) -> None:
    """Reproduced before: trip, the probe at t=31 gets a 400 (or its client leaves), and requests at t=32
    and t=90 were both refused until the 60 s probe timeout ran out."""
    h = tripped(0.0, cooldown_s=30.0)
    lease = h.acquire(31.0)
    assert lease == "probe" and not h.allow(31.5)
    h.release(lease)  # what the pipeline does in `finally`, whichever way the attempt ended
    assert h.state(32.0) == "half_open" and h.acquire(32.0) == "probe"


def test_releasing_after_a_verdict_changes_nothing() -> None:
    h = tripped(0.0, cooldown_s=30.0)
    lease = h.acquire(31.0)
    h.record_success(31.0)
    h.release(lease)
    assert h.state(31.0) == "closed"
    h2 = tripped(0.0, cooldown_s=30.0)
    lease = h2.acquire(31.0)
    h2.record_failure(31.0)
    h2.release(lease)
    assert h2.state(31.0) == "open" and h2.cooldown_remaining(31.0) == pytest.approx(30.0)
    assert h.acquire(40.0) == "normal"


def test_force_lets_a_request_through_whatever_the_state() -> None:
    h = tripped(0.0, cooldown_s=30.0)
    assert h.acquire(1.0) is None and h.acquire(1.0, force=True) == "panic"
    assert h.state(1.0) == "open"  # a panic request takes no probe slot and changes no state by itself


def test_a_429_throttles_without_counting_as_a_failure() -> None:
    h = health(failure_threshold=1)
    h.throttle(0.0, 7.0)
    assert (h.failures, h.state(0.0)) == (0, "closed")
    assert not h.available(6.9) and h.throttle_remaining(3.0) == pytest.approx(4.0)
    assert h.available(7.0)
    h.throttle(10.0, 3600.0)  # capped
    assert h.throttle_remaining(10.0) == pytest.approx(60.0)
    h.throttle(100.0, None)  # no retry-after: a second
    assert not h.available(100.5) and h.available(101.0)
    h.throttle(200.0, 30.0)
    h.record_success(201.0)  # the provider served again: no longer throttled
    assert h.available(201.0)


def test_panic_order_puts_the_target_free_soonest_first() -> None:
    hs = [health(failure_threshold=1, cooldown_s=30.0) for _ in range(3)]
    hs[0].record_failure(10.0)  # free at 40
    hs[1].record_failure(0.0)  # free at 30
    hs[2].throttle(5.0, 20.0)  # free at 25
    assert plan("fallback", hs, now=12.0, rng=random.Random(0)) == []
    assert panic_order(hs, 12.0) == [2, 1, 0]
    assert Balancer("round_robin", hs).panic_order(12.0) == [2, 1, 0]

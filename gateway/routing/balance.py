"""Routing and resilience decisions, sans-IO: per-target health, target order, retry delays.

Nothing here awaits or sleeps: callers pass ``now`` (monotonic seconds) and a ``random.Random``.
The one clock read is ``RetryPolicy.decide``'s default for ``now_epoch`` (wall-clock seconds,
needed only to turn an HTTP-date ``retry-after`` into a delay); pass it to stay deterministic.

One request, as the pipeline uses it::

    order = balancer.plan(now)                 # the available targets, strategy order
    panic = not order                          # none available: the panic rule
    if panic:
        order = balancer.panic_order(now)      #   every target, the one free soonest first
    for i in order:
        health = balancer.healths[i]
        lease = health.acquire(now, force=panic)   # may lose a half-open probe race -> None, skip
        if lease is None:
            continue
        try: ...                               # before the first byte: record_failure(now) on a target
        finally: health.release(lease)         #   fault, throttle(now, s) on a 429, record_success at
                                               #   the first event; release frees a probe slot left open

``plan`` only peeks (``TargetHealth.available``); ``acquire`` takes the single half-open probe slot, so a
fallback that is planned but never tried does not waste the probe, and ``release`` gives it back however the
attempt ended (a 400, a cancelled client), so a recovered target is never left blocked.

**The panic rule** (Envoy's panic threshold, LiteLLM's "never cool down the only deployment"): the breaker
orders and skips targets only while another target of the alias is available. When none is — every target
open, throttled or busy with its probe, and always for a one-target alias whose target is — the request still
goes out, to the target whose cooldown ends first, and the client gets that provider's real answer. The
gateway never answers in a provider's place.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections import deque
from collections.abc import Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import Literal, get_args

from gateway.wire.errors import RETRYABLE_STATUSES

__all__ = [
    "STRATEGIES",
    "Balancer",
    "BreakerState",
    "Lease",
    "RetryPolicy",
    "Strategy",
    "TargetHealth",
    "hinted_delay",
    "panic_order",
    "plan",
]

BreakerState = Literal["closed", "open", "half_open"]
Lease = Literal["normal", "probe", "panic"]
"""How ``acquire`` let a request through: a closed target, the half-open probe slot, or the panic rule."""
Strategy = Literal["fallback", "weighted", "round_robin", "least_latency"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)

_MAX_OUTCOMES = 1024  # memory bound of the success-rate window under heavy traffic
_MAX_HINT_S = 60.0  # longest server-requested wait the gateway sits through, and the longest throttle


class TargetHealth:
    """Circuit breaker, counters and latency of one target (one provider+model of one alias).

    closed → open: ``failure_threshold`` failures within ``window_s`` (successes in between do
    not reset the count). open → half_open: after ``cooldown_s``. half_open allows ONE probe
    (via ``allow``); its success closes and clears, its failure reopens with a fresh cooldown.
    A probe that never reports is forgotten after ``probe_timeout_s`` and another is allowed; one that
    ends without a verdict (a 400, a cancelled client) gives its slot back through ``release``.

    Apart from the breaker, a 429 *throttles* the target for its ``retry-after`` (at most 60 s): it is
    not a health failure, but the target is left out of the plan while it lasts.
    """

    __slots__ = (
        "_fail_times",
        "_open_until",
        "_outcomes",
        "_probe_since",
        "_throttled_until",
        "consecutive_failures",
        "cooldown_s",
        "failure_threshold",
        "failures",
        "inflight",
        "probe_timeout_s",
        "successes",
        "ttft_alpha",
        "ttft_ewma_s",
        "window_s",
    )

    def __init__(
        self,
        failure_threshold: int = 5,
        window_s: float = 60.0,
        cooldown_s: float = 30.0,
        *,
        ttft_alpha: float = 0.3,
        probe_timeout_s: float = 60.0,
    ) -> None:
        if failure_threshold < 1 or window_s <= 0 or cooldown_s < 0 or probe_timeout_s <= 0:
            raise ValueError("failure_threshold >= 1, window_s > 0, cooldown_s >= 0, probe_timeout_s > 0")
        if not 0 < ttft_alpha <= 1:
            raise ValueError("ttft_alpha must be in (0, 1]")
        self.failure_threshold = failure_threshold
        self.window_s = window_s
        self.cooldown_s = cooldown_s
        self.ttft_alpha = ttft_alpha
        self.probe_timeout_s = probe_timeout_s
        self.successes = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.inflight = 0
        self.ttft_ewma_s: float | None = None
        self._fail_times: deque[float] = deque(maxlen=failure_threshold)
        self._outcomes: deque[tuple[float, bool]] = deque(maxlen=_MAX_OUTCOMES)
        self._open_until: float | None = None  # None: closed
        self._probe_since: float | None = None  # half-open probe in flight since
        self._throttled_until: float | None = None  # a 429's retry-after: left out of plans until then

    # -- breaker -------------------------------------------------------------------------------

    def state(self, now: float) -> BreakerState:
        if self._open_until is None:
            return "closed"
        return "open" if now < self._open_until else "half_open"

    def cooldown_remaining(self, now: float) -> float:
        """Seconds until the breaker half-opens; 0 when closed or half-open."""
        return 0.0 if self._open_until is None else max(0.0, self._open_until - now)

    def _probe_busy(self, now: float) -> bool:
        return self._probe_since is not None and now - self._probe_since < self.probe_timeout_s

    def throttle_remaining(self, now: float) -> float:
        """Seconds left of the last 429's ``retry-after``; 0 when not throttled."""
        return 0.0 if self._throttled_until is None else max(0.0, self._throttled_until - now)

    def blocked_for(self, now: float) -> float:
        """How long until the target is available again as far as known (the panic order's key)."""
        return max(self.cooldown_remaining(now), self.throttle_remaining(now))

    def available(self, now: float) -> bool:
        """Would ``acquire`` let a request through without ``force``? No side effects (what ``plan`` uses)."""
        if self._throttled_until is not None and now < self._throttled_until:
            return False
        state = self.state(now)
        return state == "closed" or (state == "half_open" and not self._probe_busy(now))

    def acquire(self, now: float, *, force: bool = False) -> Lease | None:
        """Take the right to send one request now, or None. In half-open this takes the single probe slot
        (``"probe"``); ``force`` (the panic rule) lets a request through whatever the state, without the slot."""
        if not self.available(now):
            return "panic" if force else None
        if self._open_until is not None:
            self._probe_since = now
            return "probe"
        return "normal"

    def allow(self, now: float) -> bool:
        """``acquire(now)`` as a yes or no."""
        return self.acquire(now) is not None

    def release(self, lease: Lease | None) -> None:
        """An attempt let through by ``lease`` is over. A probe that got no verdict (neither
        ``record_success`` nor ``record_failure``: a non-retryable error, a cancelled client) frees its slot,
        so the next request may probe at once instead of after ``probe_timeout_s``."""
        if lease == "probe":
            self._probe_since = None

    def throttle(self, now: float, seconds: float | None) -> None:
        """A 429: leave the target out of plans for ``seconds`` (its ``retry-after``; at most 60 s, 1 s when the
        provider gave none). Not a failure: the breaker's counts do not change."""
        wait = 1.0 if seconds is None else min(max(seconds, 0.0), _MAX_HINT_S)
        until = now + wait
        if self._throttled_until is None or until > self._throttled_until:
            self._throttled_until = until

    def record_success(self, now: float, *, ttft_s: float | None = None) -> None:
        """The target answered (report at its first event). Closes the breaker unless it is still
        in its cooldown (a straggler from before it opened does not cut the cooldown short)."""
        self.successes += 1
        self.consecutive_failures = 0
        self._outcomes.append((now, True))
        if ttft_s is not None:
            prev = self.ttft_ewma_s
            self.ttft_ewma_s = ttft_s if prev is None else self.ttft_alpha * ttft_s + (1 - self.ttft_alpha) * prev
        self._throttled_until = None
        if self.state(now) == "half_open":
            self._open_until = None
            self._probe_since = None
            self._fail_times.clear()

    def record_failure(self, now: float) -> None:
        """The target failed before its first event (connect error, timeout, 429/5xx/529).
        Client errors (400/401/403/404/413) are the request's fault: do not record them."""
        self.failures += 1
        self.consecutive_failures += 1
        self._outcomes.append((now, False))
        state = self.state(now)
        if state == "half_open":
            self._trip(now)
        elif state == "closed":
            self._fail_times.append(now)
            if len(self._fail_times) == self.failure_threshold and now - self._fail_times[0] <= self.window_s:
                self._trip(now)
        # open: counted, the running cooldown is not extended

    def _trip(self, now: float) -> None:
        self._open_until = now + self.cooldown_s
        self._probe_since = None
        self._fail_times.clear()

    # -- load and status -----------------------------------------------------------------------

    def begin(self) -> None:
        self.inflight += 1

    def end(self) -> None:
        self.inflight = max(0, self.inflight - 1)

    def success_rate(self, now: float) -> float | None:
        """Share of successes among the outcomes of the last ``window_s``; None without any."""
        while self._outcomes and self._outcomes[0][0] < now - self.window_s:
            self._outcomes.popleft()
        if not self._outcomes:
            return None
        return sum(ok for _, ok in self._outcomes) / len(self._outcomes)

    def recent_failures(self, now: float) -> int:
        """Failures among the outcomes of the last ``window_s`` (what the breaker counts towards opening)."""
        self.success_rate(now)  # drops the outcomes older than the window
        return sum(not ok for _, ok in self._outcomes)

    def snapshot(self, now: float) -> dict[str, object]:
        """A JSON-ready status view."""
        return {
            "state": self.state(now),
            "cooldown_remaining_s": round(self.cooldown_remaining(now), 3),
            "throttled_remaining_s": round(self.throttle_remaining(now), 3),
            "success_rate": self.success_rate(now),
            "ttft_ewma_s": self.ttft_ewma_s,
            "inflight": self.inflight,
            "successes": self.successes,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
        }


# -- strategies ---------------------------------------------------------------------------------


def panic_order(healths: Sequence[TargetHealth], now: float) -> list[int]:
    """Every target, the one that becomes available soonest first (config order among equals): the order of a
    request for which ``plan`` found none available (the panic rule)."""
    return sorted(range(len(healths)), key=lambda i: healths[i].blocked_for(now))


def plan(
    strategy: str,
    healths: Sequence[TargetHealth],
    weights: Sequence[float] | None = None,
    *,
    now: float,
    rng: random.Random,
    rr: int = 0,
    explore: float = 0.1,
) -> list[int]:
    """The target indices to try for one request: the primary first, then the fallbacks.

    Targets that are not ``available`` are left out; an empty list means none is: the caller then applies
    the panic rule (``panic_order``). ``rr`` is the request's round-robin ticket (``Balancer`` counts it).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if weights is not None and len(weights) != len(healths):
        raise ValueError("one weight per target")
    ok = [i for i, h in enumerate(healths) if h.available(now)]
    if len(ok) <= 1 or strategy == "fallback":
        return ok
    if strategy == "round_robin":
        k = rr % len(ok)
        return ok[k:] + ok[:k]
    if strategy == "weighted":
        weight = {i: 1.0 if weights is None else float(weights[i]) for i in ok}
        rest = sorted(ok, key=lambda i: -weight[i])  # stable: equal weights keep config order
        if sum(weight.values()) <= 0:
            return rest
        first = rng.choices(ok, weights=[weight[i] for i in ok])[0]
        return [first, *(i for i in rest if i != first)]
    # least_latency: unmeasured targets first (config order), then by EWMA time to first token
    order = sorted(ok, key=lambda i: (healths[i].ttft_ewma_s is not None, healths[i].ttft_ewma_s or 0.0))
    if rng.random() < explore:
        first = rng.choice(order[1:])
        return [first, *(i for i in order if i != first)]
    return order


class Balancer:
    """The targets' health and the strategy state of one alias; ``plan(now)`` per request."""

    __slots__ = ("_rr", "explore", "healths", "rng", "strategy", "weights")

    def __init__(
        self,
        strategy: str,
        healths: Sequence[TargetHealth],
        weights: Sequence[float] | None = None,
        *,
        rng: random.Random | None = None,
        explore: float = 0.1,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
        if weights is not None and (len(weights) != len(healths) or any(w < 0 for w in weights)):
            raise ValueError("one non-negative weight per target")
        if not 0 <= explore <= 1:
            raise ValueError("explore must be in [0, 1]")
        self.strategy = strategy
        self.healths = tuple(healths)
        self.weights = tuple(weights) if weights is not None else None
        self.rng = rng if rng is not None else random.Random()
        self.explore = explore
        self._rr = itertools.count()

    def plan(self, now: float) -> list[int]:
        rr = next(self._rr) if self.strategy == "round_robin" else 0
        return plan(self.strategy, self.healths, self.weights, now=now, rng=self.rng, rr=rr, explore=self.explore)

    def panic_order(self, now: float) -> list[int]:
        return panic_order(self.healths, now)

    def snapshot(self, now: float) -> list[dict[str, object]]:
        return [h.snapshot(now) for h in self.healths]


# -- retries ------------------------------------------------------------------------------------


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for key, v in headers.items():
            if key.lower() == name:
                return v
    return value


def hinted_delay(headers: Mapping[str, str], now_epoch: float | None = None) -> float | None:
    """``retry-after-ms``, else ``retry-after`` (seconds or HTTP-date), in seconds; None when absent,
    unparsable or not positive."""
    raw_ms = _header(headers, "retry-after-ms")
    if raw_ms is not None:
        try:
            ms = float(raw_ms)
        except ValueError:
            ms = math.nan
        if ms > 0 and math.isfinite(ms):
            return ms / 1000
    raw = _header(headers, "retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # HTTP-dates are GMT
            return None
        seconds = when.timestamp() - (time.time() if now_epoch is None else now_epoch)
    return seconds if seconds > 0 and math.isfinite(seconds) else None


class RetryPolicy:
    """How long to wait before the next attempt after a failure before the first byte."""

    RETRYABLE = RETRYABLE_STATUSES  # the one table: gateway.wire.errors

    __slots__ = ("base_delay_s", "jitter", "max_attempts", "max_delay_s")

    def __init__(
        self, max_attempts: int = 3, base_delay_s: float = 0.5, max_delay_s: float = 8.0, jitter: float = 0.25
    ) -> None:
        if max_attempts < 1 or base_delay_s < 0 or max_delay_s < 0 or not 0 <= jitter <= 1:
            raise ValueError("max_attempts >= 1, delays >= 0, jitter in [0, 1]")
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.jitter = jitter

    def retryable_status(self, status: int | None) -> bool:
        """408/429/500/502/503/504/529 and ``None`` (connect error or timeout before the first event)."""
        return status is None or status in self.RETRYABLE

    def decide(
        self,
        status: int | None,
        headers: Mapping[str, str],
        attempt: int,
        *,
        rng: random.Random,
        now_epoch: float | None = None,
    ) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None to stop.

        ``attempt`` counts the attempts made so far (1 after the first failed). Stops when they
        are exhausted; ``x-should-retry`` overrides the status table; a server hint
        (``retry-after-ms``, then ``retry-after``) over 60 s stops too (fail over instead).
        """
        if attempt < 1:
            raise ValueError("attempt counts from 1")
        if attempt >= self.max_attempts:
            return None
        should = (_header(headers, "x-should-retry") or "").strip().lower()
        if should == "false" or (should != "true" and not self.retryable_status(status)):
            return None
        hint = hinted_delay(headers, now_epoch)
        if hint is not None:
            return hint if hint <= _MAX_HINT_S else None
        backoff = min(self.base_delay_s * 2.0 ** min(attempt - 1, 64), self.max_delay_s)
        return backoff * (1 - self.jitter * rng.random())

"""Rate limits and budgets per client key and per team (issue 19), in one process.

Rules come from the config: a key's own ``limits`` (else the top-level ``limits``, the default for every key),
and its team's (``teams.<name>.limits``). A request must pass every rule that applies. **Admission** is checked
before anything is sent upstream, against what has been counted so far: requests this minute, tokens this
minute, requests in flight, spend in the budget's calendar window (UTC day, ISO week from Monday, month). A stream
already running is never cut. Admitted, the request counts one request and one in flight at once; its tokens and
cost are counted when it ends (``Lease.settle``), so N requests admitted just under a limit overshoot it by at
most their own usage.

Refusals follow the API's own conventions: over a rate limit ``429 rate_limit_error`` with an integer
``retry-after`` and ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` (reset in RFC 3339; the
same headers go on every response of a key with limits); over a budget ``429 billing_error`` with
``x-should-retry: false`` and ``retry-after`` until the window resets (as Anthropic's gateway in Claude Code
answers a spend limit).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from gateway.errors import GatewayError
from gateway.settings import LimitSettings, Settings

if TYPE_CHECKING:
    from gateway.edge import ClientKey

__all__ = ["BudgetExceeded", "Lease", "Limiter", "RateLimited"]


class RateLimited(GatewayError):
    status_code = 429
    error_type = "rate_limit_error"


class BudgetExceeded(GatewayError):
    status_code = 429
    error_type = "billing_error"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def budget_window(per: str, now: float) -> tuple[str, float]:
    """The calendar window ``now`` is in (its key) and when it ends (epoch seconds), UTC."""
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "day":
        start, end = day, day + timedelta(days=1)
    elif per == "week":
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
    return f"{per}:{start.date().isoformat()}", end.timestamp()


Rule = tuple[str, LimitSettings]  # (scope, limits): scope "key:<name>" or "team:<name>"


class Lease:
    """An admitted request's hold on its rules: settled once, with the usage and cost it ended with."""

    __slots__ = ("_limiter", "_minute", "_rules", "settled")

    def __init__(self, limiter: Limiter, rules: list[Rule], minute: int) -> None:
        self._limiter = limiter
        self._rules = rules
        self._minute = minute
        self.settled = False

    def settle(self, tokens: int, cost: float | None) -> None:
        if self.settled:
            return
        self.settled = True
        self._limiter.settle(self._rules, tokens, cost)


class Limiter:
    """The counters of one process (in memory). ``clock``: wall time in seconds (injected in tests)."""

    def __init__(self, clock: Callable[[], float] = time.time, on_refusal: Callable[[str, str], None] | None = None):
        self._clock = clock
        self._on_refusal = on_refusal  # (limit, scope kind) -> count it (gateway_limited_total)
        self._counts: dict[tuple[str, str, object], float] = {}
        self.inflight: dict[str, int] = {}

    @staticmethod
    def rules(settings: Settings, key: ClientKey | None) -> list[Rule]:
        out: list[Rule] = []
        name = key.name if key is not None else ""
        own = key.limits if key is not None and key.limits is not None else settings.limits
        if own is not None:
            out.append((f"key:{name}", own))
        team = settings.teams.get(key.team) if key is not None and key.team else None
        if team is not None and team.limits is not None:
            out.append((f"team:{key.team if key else ''}", team.limits))
        return out

    def _get(self, scope: str, kind: str, window: object) -> float:
        return self._counts.get((scope, kind, window), 0.0)

    def _add(self, scope: str, kind: str, window: object, amount: float) -> None:
        key = (scope, kind, window)
        self._counts[key] = self._counts.get(key, 0.0) + amount

    def admit(self, settings: Settings, key: ClientKey | None) -> tuple[Lease | None, dict[str, str]]:
        """A lease for a request under every rule that applies (None when none does) and the rate-limit headers
        for its response; ``RateLimited`` or ``BudgetExceeded`` when a limit is reached."""
        rules = self.rules(settings, key)
        if not rules:
            return None, {}
        now = self._clock()
        minute = int(now // 60)
        reset = (minute + 1) * 60
        try:
            for scope, limits in rules:
                self._check(scope, limits, now, minute, reset)
        except (RateLimited, BudgetExceeded) as refused:
            refused.headers = {**self._headers(rules, minute, reset), **refused.headers}
            raise
        for scope, _ in rules:
            self._add(scope, "requests", minute, 1)
            self.inflight[scope] = self.inflight.get(scope, 0) + 1
        self._prune(minute)
        return Lease(self, rules, minute), self._headers(rules, minute, reset)

    def _check(self, scope: str, limits: LimitSettings, now: float, minute: int, reset: float) -> None:
        wait = max(1, math.ceil(reset - now))
        rpm, tpm, most = limits.requests_per_minute, limits.tokens_per_minute, limits.max_inflight
        if rpm is not None and self._get(scope, "requests", minute) >= rpm:
            self._refuse("requests_per_minute", scope)
            raise RateLimited(
                f"{_who(scope)} is over its limit of {rpm} requests per minute; retry in {wait} s",
                headers={"retry-after": str(wait)},
            )
        if tpm is not None and self._get(scope, "tokens", minute) >= tpm:
            self._refuse("tokens_per_minute", scope)
            raise RateLimited(
                f"{_who(scope)} is over its limit of {tpm} tokens per minute; retry in {wait} s",
                headers={"retry-after": str(wait)},
            )
        if most is not None and self.inflight.get(scope, 0) >= most:
            self._refuse("max_inflight", scope)
            raise RateLimited(
                f"{_who(scope)} has {most} requests in flight, its limit; retry when one ends",
                headers={"retry-after": "1"},
            )
        budget = limits.budget
        if budget is not None:
            window, ends = budget_window(budget.per, now)
            spent = self._get(scope, "usd", window)
            if spent >= budget.usd:
                self._refuse("budget", scope)
                left = max(1, math.ceil(ends - now))
                raise BudgetExceeded(
                    f"{_who(scope)} has spent ${spent:.2f} of its ${budget.usd:g} budget this {budget.per}; "
                    f"it resets at {_iso(ends)}",
                    headers={"retry-after": str(left), "x-should-retry": "false"},
                )

    def _refuse(self, limit: str, scope: str) -> None:
        if self._on_refusal is not None:
            self._on_refusal(limit, scope.split(":", 1)[0])

    def _headers(self, rules: list[Rule], minute: int, reset: float) -> dict[str, str]:
        """The API's rate-limit headers, for the most restrictive rule of each kind (after this request)."""
        headers: dict[str, str] = {}
        for kind, field in (("requests", "requests_per_minute"), ("tokens", "tokens_per_minute")):
            best: tuple[float, int] | None = None
            for scope, limits in rules:
                limit = getattr(limits, field)
                if limit is None:
                    continue
                remaining = max(0.0, limit - self._get(scope, kind, minute))
                if best is None or remaining < best[0]:
                    best = (remaining, limit)
            if best is not None:
                headers[f"anthropic-ratelimit-{kind}-limit"] = str(best[1])
                headers[f"anthropic-ratelimit-{kind}-remaining"] = str(int(best[0]))
                headers[f"anthropic-ratelimit-{kind}-reset"] = _iso(reset)
        return headers

    def settle(self, rules: list[Rule], tokens: int, cost: float | None) -> None:
        now = self._clock()
        minute = int(now // 60)
        for scope, limits in rules:
            self.inflight[scope] = max(0, self.inflight.get(scope, 0) - 1)
            if tokens:
                self._add(scope, "tokens", minute, tokens)
            if cost and limits.budget is not None:
                self._add(scope, "usd", budget_window(limits.budget.per, now)[0], cost)

    def _prune(self, minute: int) -> None:
        """Drop the minute counters of windows that have passed (the budget windows are few and kept)."""
        if len(self._counts) < 4096:
            return
        for key in [k for k in self._counts if isinstance(k[2], int) and k[2] < minute]:
            del self._counts[key]


def _who(scope: str) -> str:
    kind, _, name = scope.partition(":")
    return f"{kind} {name!r}" if name else "this gateway's default"

"""Rate limits and budgets per client key and per team (issue 19), in one process.

Rules come from the config: a key's own ``limits`` (else the top-level ``limits``, the default for every key), and
its team's (``teams.<name>.limits``); and, for a principal with a user, from the spend limits set at run time
(``gateway.governance.spend_limits``: a budget each, scopes ``spend-user:``, ``spend-group:``, ``spend-org``,
counted on the same counters; none asked for while there is no spend limit). A request must pass every rule that
applies. **Admission** is checked before anything is sent upstream, against what has been counted so far: requests
this minute, tokens this minute, requests in flight, spend in the budget's calendar window (UTC day, ISO week from
Monday, month). A stream already running is never cut. Admitted, the request counts one request and one in flight at
once; its tokens and cost are counted as the stream reports them (``Lease.count``, fed by the tally's fold: input
and cache tokens at ``message_start``, output at ``message_delta``; in shared counters within
``SHARED_COUNT_DELAY``) and the rest when it ends (``Lease.settle``), so N requests admitted just under a limit
overshoot it by at most their own usage.

**A request is counted in the windows it was admitted in**, however long it runs: its one request and its tokens in
the minute of its admission, its cost in the budget window (UTC day, ISO week, month) of its admission. A stream
admitted at 23:59:59 that ends after midnight is the day before's, once; the new day's budget starts at 0. The
lease carries the admission's counter keys to every count and to the settlement (in memory and in Redis alike: a
shared count sent by a flush in the next minute still lands in the admission's). That is what keeps each window's
bound: the requests admitted while a window had room overshoot it by at most their own usage, and none of a
window's usage is a request it never admitted (charged where it ended, yesterday's last stream would open today
with spending nobody admitted today; a delayed flush would move a token to whichever minute it ran in). So
``tokens_per_minute`` bounds the tokens of the requests admitted in a minute: a stream's output after its minute
has ended counts against none that is still open.

Refusals follow the API's own conventions: over a rate limit ``429 rate_limit_error`` with an integer
``retry-after`` and ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` (reset in RFC 3339; the
same headers go on every response of a key with limits); over a budget ``429 billing_error`` with
``x-should-retry: false`` and ``retry-after`` until the window resets (as Anthropic's gateway in Claude Code
answers a spend limit). A signed-in principal (Claude Code's ``/login``) is answered in Claude Code's own terms
instead: the ``anthropic-ratelimit-unified-*`` headers of ``gateway.governance.overage``.

Test-only: ``MESSAGES_GATEWAY_TEST_PERIOD_S=<seconds>`` in a gateway's environment, read when its ``Limiter`` is made,
makes every budget window (``day``, ``week`` and ``month`` alike) that many seconds long, aligned to the epoch, so an
end-to-end test sees a budget reset without waiting for midnight (``tests/e2e/test_limit_periods.py``). It is no
config setting and a gateway that has it logs a warning; never set it in production.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from gateway.governance import overage
from gateway.governance.audit import audit
from gateway.governance.pricing import Prices
from gateway.settings import ApiKey, LimitSettings, Settings
from gateway.wire.errors import GatewayError, InvalidRequest

if TYPE_CHECKING:
    from gateway.governance.keys import ClientKey
    from gateway.governance.redis_client import Unawaited
    from gateway.routing.table import Route

__all__ = [
    "BudgetExceeded",
    "Counters",
    "Lease",
    "LimitStoreDown",
    "Limiter",
    "MemoryCounters",
    "RateLimited",
    "RedisCounters",
    "SeedPlan",
    "SpendRules",
    "SpendUnchecked",
    "budget_counter",
    "check_priced",
    "ledger_spend",
    "unpriced_routes",
]

log = logging.getLogger("gateway")


_SEED_WAIT_S = 10.0  # a budgeted request waits at most this long for the ledger's spend at start-up
RESEED_S = 30.0  # with Redis: how often the ledger's spend is raised into it again (a flushed Redis recovers)


class RateLimited(GatewayError):
    status_code = 429
    error_type = "rate_limit_error"
    # The limit that refused, as the access line names it: the rule's scope kind and the limit's kind
    # ("key requests_per_minute", "team tokens_per_minute", "key max_inflight"); "" for a refusal of no rule.
    limit = ""
    scope = ""  # the rule refused under: "key:<key id>" or "team:<name>"


class BudgetExceeded(GatewayError):
    status_code = 429
    error_type = "billing_error"
    limit = ""  # "key budget", "team budget" (as RateLimited's)
    scope = ""


class LimitStoreDown(GatewayError):
    """The shared counters cannot be reached and ``limits.on_store_error`` is ``deny``."""

    status_code = 529
    error_type = "overloaded_error"


class SpendUnchecked(GatewayError):
    """``LimitStoreDown`` for a signed-in principal under a spend cap: Claude Code's ``fetch_error`` refusal
    (``gateway.governance.overage``)."""

    status_code = 429
    error_type = "billing_error"


class CountersError(Exception):
    """The counters' store failed (Redis unreachable)."""


def _iso(ts: float) -> str:
    """RFC 3339 to the second, UTC (the API's ``anthropic-ratelimit-*-reset``): a window's end is the same
    for every request in it, so the string is made once per second asked for, not once per request."""
    return _iso_second(int(ts))


@functools.lru_cache(maxsize=64)
def _iso_second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


TEST_PERIOD_ENV = "MESSAGES_GATEWAY_TEST_PERIOD_S"  # test-only: every budget window this many seconds long


def _test_period() -> float | None:
    raw = os.environ.get(TEST_PERIOD_ENV)
    if not raw:
        return None
    period = float(raw)
    if not period > 0:
        raise ValueError(f"{TEST_PERIOD_ENV} must be a positive number of seconds, not {raw!r}")
    log.warning("%s=%s (test-only): every budget resets every %g s", TEST_PERIOD_ENV, raw, period)
    return period


def usd(amount: float, scale: float) -> str:
    """Dollars with the precision a budget of ``scale`` needs: cents for $1 and up, else enough digits that a
    small budget's spend is readable (``$0.0012`` of ``$0.0015``, never ``$0.00`` of ``$0.0015``)."""
    if scale >= 1 or scale <= 0:  # (0: a paused pool of the spend limits)
        return f"${amount:,.2f}"
    digits = min(8, max(2, 1 - math.floor(math.log10(scale))))
    return f"${amount:.{digits}f}"


def budget_window_start(per: str, now: float, period_s: float | None = None) -> float:
    """When the window ``budget_window`` puts ``now`` in began (epoch seconds)."""
    if period_s is not None:
        return math.floor(now / period_s) * period_s
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "day":
        return day.timestamp()
    if per == "week":
        return (day - timedelta(days=day.weekday())).timestamp()
    return day.replace(day=1).timestamp()


def budget_window(per: str, now: float, period_s: float | None = None) -> tuple[str, float]:
    """The calendar window ``now`` is in (its key) and when it ends (epoch seconds), UTC: a day from midnight, an ISO
    week from Monday 00:00 (a week across New Year is one window, keyed by its Monday), a month from the 1st.
    ``period_s`` (test-only, ``MESSAGES_GATEWAY_TEST_PERIOD_S``): windows of that many seconds instead."""
    if period_s is not None:
        n = math.floor(now / period_s)
        return f"{per}:test-{period_s:g}s-{n}", (n + 1) * period_s
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


def budget_counter(scope: str, per: str, now: float, period_s: float | None = None) -> tuple[str, float]:
    """The counter of ``scope``'s budget in the window ``now`` is in (``{scope}|usd|{window}``), and when it ends."""
    window, ends = budget_window(per, now, period_s)
    return f"{scope}|usd|{window}", ends


Rule = tuple[str, LimitSettings]  # (scope, limits): scope "key:<key id>", "team:<name>" or a spend limit's (below)
# The rules of the spend limits set at run time (gateway.governance.spend_limits) for a principal with a user; their
# scopes are "spend-user:<user>", "spend-group:<group>" and "spend-org", never a key's or a team's.
SpendRules = Callable[["ClientKey"], Sequence[Rule]]
# What the ledger's spend seeds, for one budget period: (period, the ledger dimension summed, and the scope a value of
# it counts for, None: none); the values mapped to one scope are added up.
SeedPlan = tuple[str, str, Callable[[str], str | None]]


Check = tuple[str, float]  # (counter, limit): admitted only while the counter is below the limit
Add = tuple[str, float, int]  # (counter, amount, seconds to keep it; 0: no expiry)
# One rule's counters for a lease's usage, fixed at admission: (its tokens counter of the admission's minute,
# its budget counter of the admission's window or None, when that window ends).
Usage = tuple[str, str | None, float]


class Counters(Protocol):
    async def admit(self, checks: Sequence[Check], adds: Sequence[Add]) -> tuple[int, list[float]]:
        """Atomically: the index of the first check whose counter has reached its limit, or -1 after applying
        ``adds``; and every checked counter's value before the adds."""
        ...

    def add(self, adds: Sequence[Add]) -> Awaitable[None]:
        """Apply ``adds``; a future (or a coroutine) whose failure is the store's error."""
        ...

    async def read(self, keys: Sequence[str]) -> list[float]:
        """The counters' values (0 for one not set); ``CountersError`` when the store cannot be read."""
        ...

    async def aclose(self) -> None: ...


class MemoryCounters:
    """One process's counters (what one worker, or the unit tests, use)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self._expires: dict[str, float] = {}

    def _expire(self, now: float) -> None:
        for key in [k for k, at in self._expires.items() if at <= now]:
            self.values.pop(key, None)
            del self._expires[key]

    def admit_now(self, checks: Sequence[Check], adds: Sequence[Add], now: float) -> tuple[int, list[float]]:
        held = self.values
        values = [held.get(key, 0.0) for key, _ in checks]
        i = 0
        for _, limit in checks:  # (a loop of its own, not zip/enumerate: this runs for every request)
            if values[i] >= limit:
                return i, values
            i += 1  # noqa: SIM113 (enumerate and zip cost more, for every request)
        self.add_now(adds, now)
        return -1, values

    def raise_now(self, values: Sequence[Add], now: float) -> None:
        """Each counter to at least the value given (a budget seeded from the ledger: never lowered)."""
        for key, value, ttl in values:
            current = self.values.get(key, 0.0) if self._expires.get(key, math.inf) > now else 0.0
            self.values[key] = max(current, value)
            if ttl:
                self._expires[key] = now + ttl

    def add_now(self, adds: Sequence[Add], now: float) -> None:
        values, expires = self.values, self._expires
        for key, amount, ttl in adds:
            if amount < 0:  # a slot given back: never below zero, never into a counter that has expired
                if key not in values or expires.get(key, math.inf) <= now:
                    continue
                left = values[key] + amount
                values[key] = left if left > 0.0 else 0.0
            else:
                values[key] = values.get(key, 0.0) + amount
            if ttl:
                expires[key] = now + ttl
        if len(expires) > 4096:
            self._expire(now)

    async def admit(self, checks: Sequence[Check], adds: Sequence[Add]) -> tuple[int, list[float]]:
        return self.admit_now(checks, adds, time.time())

    async def add(self, adds: Sequence[Add]) -> None:
        self.add_now(adds, time.time())

    async def read(self, keys: Sequence[str]) -> list[float]:
        return [self.values.get(key, 0.0) for key in keys]

    async def aclose(self) -> None:
        return None


# Every check and every add of one admission in one round trip, atomically (a Lua script runs alone).
_ADMIT = """
local n = tonumber(ARGV[1])
local values = {}
for i = 1, n do
  values[i] = redis.call('GET', KEYS[i]) or '0'
end
for i = 1, n do
  if tonumber(values[i]) >= tonumber(ARGV[1 + i]) then return {i - 1, values} end
end
local m = #KEYS - n
for j = 1, m do
  redis.call('INCRBYFLOAT', KEYS[n + j], ARGV[1 + n + j])
  local ttl = tonumber(ARGV[1 + n + m + j])
  if ttl > 0 then redis.call('EXPIRE', KEYS[n + j], ttl) end
end
return {-1, values}
"""


# A settlement's adds in one command (a pipeline of INCRBYFLOAT + EXPIRE pairs costs redis-py more CPU). A negative
# add (a slot in flight given back) never takes a counter below zero and never recreates one that has expired: a
# stream that outlived the in-flight counter's TTL gives back only what the counter still holds.
_ADD = """
local m = #KEYS
for j = 1, m do
  local amount = tonumber(ARGV[j])
  local ttl = tonumber(ARGV[m + j])
  if amount < 0 then
    local held = tonumber(redis.call('GET', KEYS[j]))
    if held then
      if held + amount <= 0 then redis.call('DEL', KEYS[j])
      else
        redis.call('INCRBYFLOAT', KEYS[j], amount)
        if ttl > 0 then redis.call('EXPIRE', KEYS[j], ttl) end
      end
    end
  else
    redis.call('INCRBYFLOAT', KEYS[j], ARGV[j])
    if ttl > 0 then redis.call('EXPIRE', KEYS[j], ttl) end
  end
end
return m
"""


_RAISE = """
local m = #KEYS
for j = 1, m do
  local value = tonumber(ARGV[j])
  local current = tonumber(redis.call('GET', KEYS[j]) or '0')
  if current < value then redis.call('SET', KEYS[j], ARGV[j], 'EX', tonumber(ARGV[m + j])) end
end
return m
"""


STORE_TIMEOUT = 1.0  # seconds a Redis call (connect, or a script's round trip) may take before it counts as down


class RedisCounters:
    """Counters in Redis (or Valkey): shared by every worker and replica. One pipelined connection of the
    gateway's own client (``gateway.governance.redis_client``: ``asyncio.Protocol`` + ``hiredis``), each call one
    ``EVALSHA``."""

    def __init__(self, url: str, prefix: str = "mgw:") -> None:
        from gateway.governance.redis_client import RedisClient, Script

        self._redis = RedisClient(url, timeout=STORE_TIMEOUT)
        self._prefix = prefix
        self._admit = Script(_ADMIT)
        self._add = Script(_ADD)
        self._raise = Script(_RAISE)

    async def admit(self, checks: Sequence[Check], adds: Sequence[Add]) -> tuple[int, list[float]]:
        sent = self._redis.send_prepared(self._prepare(checks, adds))
        try:
            return self.admitted(await sent)
        except Exception as exc:
            if (failure := self.failure(exc)) is None:
                raise
            raise failure from exc

    def admit_planned(self, plan: _Plan) -> Awaitable[Any]:
        """``admit`` of a plan's checks and adds, packed once for all the admissions of its minute: the reply
        to give ``admitted`` (awaited by the limiter itself: a coroutine less between the request and Redis)."""
        prepared = plan.prepared
        if prepared is None:
            prepared = plan.prepared = self._prepare(plan.checks, plan.adds)
        return self._redis.send_prepared(prepared)

    @staticmethod
    def admitted(reply: Any) -> tuple[int, list[float]]:
        """``admit``'s answer from the script's reply."""
        failed, values = reply
        return int(failed), [float(v) for v in values]

    @staticmethod
    def failure(exc: Exception) -> CountersError | None:
        """The store's error (``CountersError``) that ``exc``, raised by a call, stands for; None: not one."""
        from gateway.governance.redis_client import RedisUnavailable, ReplyError

        return CountersError(str(exc)) if isinstance(exc, (RedisUnavailable, ReplyError)) else None

    def _prepare(self, checks: Sequence[Check], adds: Sequence[Add]) -> Any:
        prefix = self._prefix
        keys = [prefix + k for k, _ in checks] + [prefix + k for k, _, _ in adds]
        args = [len(checks), *(limit for _, limit in checks), *(a for _, a, _ in adds), *(t for _, _, t in adds)]
        return self._redis.prepare(self._admit, keys, args)

    def add(self, adds: Sequence[Add]) -> Awaitable[None]:
        """Sent at once; the future fails with the store's error."""
        prefix = self._prefix
        return self._redis.evalsha(
            self._add, [prefix + key for key, _, _ in adds], [a for _, a, _ in adds] + [t for _, _, t in adds]
        )

    def add_unawaited(self, adds: Sequence[Add], waiter: Unawaited) -> None:
        """``add`` that nobody awaits (the limiter's settlements and flushes): sent at once, a failure handed to
        ``waiter.on_error``; ``drain`` waits for every one sent."""
        prefix = self._prefix
        keys = [prefix + key for key, _, _ in adds]
        self._redis.evalsha_unawaited(self._add, keys, [a for _, a, _ in adds] + [t for _, _, t in adds], waiter)

    async def drain(self) -> None:
        """Every command sent so far answered, or failed."""
        await self._redis.drain()

    async def read(self, keys: Sequence[str]) -> list[float]:
        """The counters' values (0 for one not set), in one round trip."""
        from gateway.governance.redis_client import RedisUnavailable, ReplyError

        prefix = self._prefix
        try:
            values = await self._redis.call("MGET", *(prefix + key for key in keys))
        except (RedisUnavailable, ReplyError) as exc:
            raise CountersError(str(exc)) from exc
        return [float(v) if v is not None else 0.0 for v in values]

    async def raise_to(self, values: Sequence[Add]) -> None:
        """Each counter to at least the value given, in one atomic round trip (a budget seeded from the ledger)."""
        from gateway.governance.redis_client import RedisUnavailable, ReplyError

        prefix = self._prefix
        keys = [prefix + key for key, _, _ in values]
        try:
            await self._redis.evalsha(self._raise, keys, [v for _, v, _ in values] + [t for _, _, t in values])
        except (RedisUnavailable, ReplyError) as exc:
            raise CountersError(str(exc)) from exc

    async def aclose(self) -> None:
        await self._redis.aclose()


_MINUTE_TTL = 120  # a minute's counters outlive it a little
_INFLIGHT_TTL = 3600  # an in-flight count a crashed process never gave back is forgotten within the hour
SHARED_COUNT_DELAY = 1.0  # seconds a running request's tokens wait to be sent to shared counters


class Lease:
    """An admitted request's hold on its rules. Its tokens and cost are counted as they become known (``count``,
    with the running totals of the fold: input and cache tokens at ``message_start``, output at each
    ``message_delta``), and it is settled once, with the totals it ended with (partial for a failed or cancelled
    stream), which also gives back its slot in flight."""

    __slots__ = ("_cost", "_giveback", "_limiter", "_pending", "_tokens", "_usage", "settled")

    def __init__(self, limiter: Limiter, giveback: list[Add], usage: Sequence[Usage] = ()) -> None:
        self._limiter = limiter
        self._giveback = giveback  # its slots in flight given back (a spend limit's rule holds none): _giveback()
        self._usage = usage  # where its tokens and cost go: the admission's windows (module docstring)
        self._tokens = 0  # counted so far
        self._cost = 0.0
        self._pending: tuple[int, float] = (0, 0.0)  # counted here, not yet sent to shared counters
        self.settled = False

    def count(self, tokens: int, cost: float | None) -> None:
        """The request has used ``tokens`` and ``cost`` so far (running totals)."""
        if self.settled or not self._usage:
            return
        more, spent = tokens - self._tokens, (cost or 0.0) - self._cost
        if more <= 0 and spent <= 0:
            return
        if more < 0:
            more = 0
        if spent < 0.0:
            spent = 0.0
        self._tokens, self._cost = tokens, self._cost + spent
        self._limiter.count(self, more, spent)

    def settle(self, tokens: int, cost: float | None) -> None:
        if self.settled:
            return
        self.count(tokens, cost)
        self.settled = True
        pending, self._pending = self._pending, (0, 0.0)
        self._limiter.settle(self, *pending)


class _Plan:
    """``Limiter._plan`` of a set of rules without a budget in one minute, kept for the minute: the counters an
    admission checks and adds are the same for every request of a key in a minute, and so are the rate-limit headers'
    limits and resets (only ``remaining`` changes). ``limits``: the rules' settings it was made from (compared by
    identity: a reloaded config makes new ones, and a new plan)."""

    __slots__ = ("adds", "checks", "giveback", "headers", "minute", "prepared", "rules", "usage", "what")

    def __init__(self, rules: Sequence[Rule], minute: int, planned: _Planned) -> None:
        self.rules = rules  # (Limiter._key_rules's: one object per config and key id, team and own limits)
        self.minute = minute
        self.checks, self.what, self.adds, self.usage = planned
        self.prepared: Any = None  # its admission packed for Redis (RedisCounters.admit_planned), once asked
        self.headers = _header_table(self.checks, self.what)
        self.giveback = _giveback(rules)


# Per header kind (requests, tokens): its three header names, whether this request counts in it, and for each of its
# checks (index, limit, the limit's text, the reset's text).
_HeaderTable = list[tuple[str, str, str, bool, list[tuple[int, float, str, str]]]]


def _header_table(checks: Sequence[Check], what: Sequence[tuple[str, str, float]]) -> _HeaderTable:
    """What the API's rate-limit headers of an admission are made from, all but the counts (a ``_Plan`` keeps it a
    minute)."""
    table: _HeaderTable = []
    for kind, name in ((_RPM, "requests"), ("tokens_per_minute", "tokens")):
        mine = [
            (i, limit, f"{limit:g}", _iso(ends))
            for i, ((_, limit), (k, _, ends)) in enumerate(zip(checks, what, strict=True))
            if k == kind
        ]
        if mine:
            prefix = f"anthropic-ratelimit-{name}-"
            table.append((prefix + "limit", prefix + "remaining", prefix + "reset", kind == _RPM, mine))
    return table


def _rate_headers(table: _HeaderTable, values: Sequence[float], *, counted: bool) -> dict[str, str]:
    """The API's rate-limit headers, for the most restrictive rule of each kind (after this request, when
    ``counted``)."""
    headers: dict[str, str] = {}
    for limit_name, remaining_name, reset_name, requests, mine in table:
        taken = 1 if counted and requests else 0
        least = math.inf
        least_limit = least_reset = ""
        for i, limit, limit_text, reset_text in mine:  # (a kind is in the table only with a check)
            remaining = limit - values[i] - taken
            if remaining < 0.0:
                remaining = 0.0
            if remaining < least:
                least, least_limit, least_reset = remaining, limit_text, reset_text
        headers[limit_name] = least_limit
        headers[remaining_name] = str(int(least))
        headers[reset_name] = least_reset
    return headers


def _giveback(rules: Sequence[Rule]) -> list[Add]:
    """What a lease under ``rules`` gives back when it is settled: its slot in flight under each."""
    return [(f"{scope}|inflight", -1, _INFLIGHT_TTL) for scope, _ in rules]


_NO_KEY_RULES = ("", "")  # Limiter._key_rules's entry for requests without a key (auth.open)
_RPM = "requests_per_minute"
_Planned = tuple[list[Check], list[tuple[str, str, float]], list[Add], list[Usage]]
_MAX_PLANS = 1024  # plans kept (then all forgotten at once: they are made again as needed)


class Limiter:
    """Admission and accounting over ``counters`` (this process's, or Redis for many). ``clock``: wall time in
    seconds (injected in tests); ``on_refusal(limit, scope kind)`` and ``on_store_error()`` count."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        on_refusal: Callable[[str, str], None] | None = None,
        counters: Counters | None = None,
        *,
        on_store_error: str = "allow",
        store_errors: Callable[[], None] | None = None,
    ) -> None:
        self._clock = clock
        self._on_refusal = on_refusal
        self.counters: Counters = counters or MemoryCounters()
        self._policy = on_store_error
        self._store_errors = store_errors
        self._logged_at = 0.0
        self._sent: set[asyncio.Future[Any]] = set()  # settlements and flushes under way (but Redis's: drained)
        self._unawaited: Unawaited | None = None  # in a future's place for Redis's (RedisCounters.add_unawaited)
        self._waiting: set[Lease] = set()  # leases with counts not yet sent to shared counters
        self._flush_at: asyncio.TimerHandle | None = None
        self._period_s = _test_period()
        self.seeding: asyncio.Future[Any] | None = None  # the budgets' seed from the ledger, while it runs
        # the spend limits' rules for a principal with a user (gateway.governance.spend_limits); None while there
        # is no spend limit, so a request costs nothing more then
        self.spend: SpendRules | None = None
        # refusals by (scope, limit kind) since the limiter was made: this process's own (a worker's, not shared)
        self.refusals: collections.Counter[tuple[str, str]] = collections.Counter()
        self.started_at = clock()
        self._plans: dict[int, _Plan] = {}  # by the id of its rules (_key_rules's): this minute's plan
        # by a key's (id, team): (the config, the key's own limits, its rules under them, whether one has a budget)
        self._rules_of: dict[tuple[str, str], tuple[Settings, LimitSettings | None, Sequence[Rule], bool]] = {}

    @staticmethod
    def rules(settings: Settings, key: ClientKey | None) -> list[Rule]:
        out: list[Rule] = []
        key_id = key.id if key is not None else ""  # the id, not the name: a name issued again starts afresh
        own = key.limits if key is not None and key.limits is not None else settings.limits
        if own is not None:
            out.append((f"key:{key_id}", own))
        if key is not None and key.team:
            team = settings.teams.get(key.team)
            if team is not None and team.limits is not None:
                out.append((f"team:{key.team}", team.limits))
        return out

    def _key_rules(self, settings: Settings, key: ClientKey | None) -> tuple[Sequence[Rule], bool]:
        """``rules`` of ``key`` under ``settings``, and whether one has a budget: made once per config and per what
        they are made of (the key's id, team and own limits; a JWT's or a sign-in's principal is a new object each
        request, the same rules). The config and the limits are immutable, so a reload, or a key issued again with
        other limits, is a new object and gets rules of its own."""
        if key is None:
            ident, limits = _NO_KEY_RULES, None
        else:
            ident, limits = (key.id, key.team), key.limits
        held = self._rules_of.get(ident)
        if held is not None and held[0] is settings and held[1] is limits:
            return held[2], held[3]
        rules = tuple(self.rules(settings, key))
        budget = any(limits.budget is not None for _, limits in rules)
        if len(self._rules_of) >= _MAX_PLANS:
            self._rules_of.clear()
        self._rules_of[ident] = (settings, limits, rules, budget)
        return rules, budget

    def all_rules(self, settings: Settings, key: ClientKey | None) -> Sequence[Rule]:
        """``rules`` and, for a principal with a user, the spend limits' (``gateway.governance.spend_limits``)."""
        rules = self._key_rules(settings, key)[0]
        spend = self.spend
        if spend is not None and key is not None and key.user:
            extra = spend(key)
            if extra:
                return [*rules, *extra]
        return list(rules)

    def budgeted(self, settings: Settings, key: ClientKey | None) -> bool:
        """Whether a budget applies to the key's requests (its own or its default, its team's, a spend limit)."""
        if self._key_rules(settings, key)[1]:
            return True
        spend = self.spend
        if spend is not None and key is not None and key.user:
            return any(limits.budget is not None for _, limits in spend(key))
        return False

    async def seed(self, spent: Mapping[str, tuple[float, float]]) -> None:
        """Budget counters from the ledger (``seed_budgets``): each ``{scope}|usd|{window}`` raised to at least the
        spend the ledger holds for that window (``spent``: counter -> (usd, window end)), never lowered."""
        now = self._clock()
        values = [(key, usd, max(1, math.ceil(ends - now)) + 86_400) for key, (usd, ends) in spent.items()]
        if isinstance(self.counters, MemoryCounters):
            self.counters.raise_now(values, now)
        elif isinstance(self.counters, RedisCounters) and values:
            await self.counters.raise_to(values)

    def _cached_plan(self, rules: Sequence[Rule], now: float) -> _Plan:
        """This minute's plan of ``rules`` (``_key_rules``'s, without a budget: a budget's windows are not minutes,
        so it is planned at each admission), made once a minute per key and config."""
        minute = int(now // 60)
        plan = self._plans.get(id(rules))
        if plan is not None and plan.rules is rules and plan.minute == minute:
            return plan
        if len(self._plans) >= _MAX_PLANS:
            self._plans.clear()
        plan = self._plans[id(rules)] = _Plan(rules, minute, self._plan(rules, now))  # (holds rules: the id is theirs)
        return plan

    def _plan(
        self, rules: Sequence[Rule], now: float
    ) -> tuple[list[Check], list[tuple[str, str, float]], list[Add], list[Usage]]:
        """The counters an admission checks (with what each is), what it adds when admitted, and where the
        request's tokens and cost will go (the windows of ``now``, its admission)."""
        minute = int(now // 60)
        checks: list[Check] = []
        what: list[tuple[str, str, float]] = []  # (limit, scope, the window's end)
        adds: list[Add] = []
        usage: list[Usage] = []
        for scope, limits in rules:
            usd: tuple[str | None, float] = (None, 0.0)
            if limits.requests_per_minute is not None:
                checks.append((f"{scope}|requests|{minute}", limits.requests_per_minute))
                what.append(("requests_per_minute", scope, (minute + 1) * 60))
            if limits.tokens_per_minute is not None:
                checks.append((f"{scope}|tokens|{minute}", limits.tokens_per_minute))
                what.append(("tokens_per_minute", scope, (minute + 1) * 60))
            if limits.max_inflight is not None:
                checks.append((f"{scope}|inflight", limits.max_inflight))
                what.append(("max_inflight", scope, now + 1))
            if limits.budget is not None:
                usd = budget_counter(scope, limits.budget.per, now, self._period_s)
                ends = usd[1]
                checks.append((usd[0], limits.budget.usd))
                what.append(("budget", scope, ends))
            adds.append((f"{scope}|requests|{minute}", 1, _MINUTE_TTL))
            adds.append((f"{scope}|inflight", 1, _INFLIGHT_TTL))
            usage.append((f"{scope}|tokens|{minute}", *usd))
        return checks, what, adds, usage

    async def admit(self, settings: Settings, key: ClientKey | None) -> tuple[Lease | None, dict[str, str]]:
        """A lease for a request under every rule that applies (None when none does) and the rate-limit headers
        for its response; ``RateLimited`` or ``BudgetExceeded`` when a limit is reached. A signed-in principal
        (``ClientKey.session``) under a budget gets Claude Code's headers (``gateway.governance.overage``)."""
        rules, budget = self._key_rules(settings, key)
        spent = await self._spend_rules(key) if key is not None and key.user else ()
        if not rules and not spent:
            return None, {}
        seeding = self.seeding
        if budget and seeding is not None and not seeding.done():
            await _wait(seeding)  # a budget is checked against the ledger's spend, once read
        now = self._clock()
        plan = None if spent or budget else self._cached_plan(rules, now)
        if plan is not None:
            checks, what, adds, usage = plan.checks, plan.what, plan.adds, plan.usage
            rules_all: Sequence[Rule] = rules
        else:
            checks, what, adds, usage = self._plan(rules, now)
            if spent:
                _plan_spend(spent, now, checks, what, usage, self._period_s)
                rules_all = [*rules, *spent]
            else:
                rules_all = rules
        counters = self.counters
        try:
            if isinstance(counters, MemoryCounters):  # on the limiter's clock, as its counts and settlements
                failed, values = counters.admit_now(checks, adds, now)
            elif plan is not None and isinstance(counters, RedisCounters):
                try:
                    failed, values = counters.admitted(await counters.admit_planned(plan))
                except Exception as exc:
                    if (failure := counters.failure(exc)) is None:
                        raise
                    raise failure from exc
            else:
                failed, values = await counters.admit(checks, adds)
        except CountersError as exc:
            self._store_error(exc)
            if self._policy == "deny":
                raise _store_down(key, rules_all) from exc
            return Lease(self, []), {}  # allowed, uncounted
        table = plan.headers if plan is not None else _header_table(checks, what)
        headers = _rate_headers(table, values, counted=failed < 0)
        if failed >= 0:
            refusal = self._refusal(checks[failed][1], values[failed], what[failed], now, headers)
            if isinstance(refusal, BudgetExceeded):
                self._budget_refused(refusal, key, _caps(rules_all, checks, what, values), now)
            raise refusal
        if key is not None and key.session:
            headers.update(overage.allowed_headers(_caps(rules_all, checks, what, values)))
        return Lease(self, plan.giveback if plan is not None else _giveback(rules), usage), headers

    async def _spend_rules(self, key: ClientKey) -> Sequence[Rule]:
        """The spend limits' rules over a principal with a user (``gateway.governance.spend_limits``)."""
        seeding = self.seeding
        if seeding is not None and not seeding.done():
            await _wait(seeding)  # at start-up: once the limits, and the ledger's spend under them, are read
        spend = self.spend
        return spend(key) if spend is not None else ()

    @staticmethod
    def _budget_refused(refusal: BudgetExceeded, key: ClientKey | None, caps: list[overage.Cap], now: float) -> None:
        """Audited; and for a signed-in principal, Claude Code's refusal: the reached cap that resets last."""
        reached = [cap for cap in caps if cap.spent >= cap.limit] or caps
        cap = max(reached, key=lambda c: c.ends)
        audit(
            "spend.blocked",
            scope=refusal.scope,
            user=key.user if key is not None else None,
            email=key.email if key is not None and key.email else None,
            period=overage.PERIOD_NAMES.get(cap.per, cap.per),
            limit_usd=cap.limit,
            spent_usd=round(cap.spent, 6),
        )
        if key is not None and key.session:
            refusal.headers, refusal.message = overage.rejected(cap, now)
            refusal.args = (refusal.message,)

    async def caps(self, settings: Settings, key: ClientKey | None) -> list[overage.Cap] | None:
        """The budgets that apply to ``key`` with the spend of their current windows (None: the shared counters
        cannot be read)."""
        budgeted = [(scope, limits) for scope, limits in self.all_rules(settings, key) if limits.budget is not None]
        spends = await self.budget_spend(budgeted)
        caps = []
        for (scope, limits), (spent, ends) in zip(budgeted, spends, strict=True):
            assert limits.budget is not None
            if spent is None:
                return None
            caps.append(overage.Cap(scope, limits.budget.per, limits.budget.usd, spent, ends))
        return caps

    def _refusal(
        self, limit: float, value: float, what: tuple[str, str, float], now: float, headers: dict[str, str]
    ) -> RateLimited | BudgetExceeded:
        kind, scope, ends = what
        scope_kind = scope.split(":", 1)[0]
        if self._on_refusal is not None:
            self._on_refusal(kind, scope_kind)
        self.refusals[scope, kind] += 1
        wait = max(1, math.ceil(ends - now))
        refusal: RateLimited | BudgetExceeded
        if kind == "budget":
            refusal = BudgetExceeded(
                f"{_who(scope)} has spent {usd(value, limit)} of its "
                f"{f'${limit:g}' if limit >= 1 else usd(limit, limit)} budget; it resets at "
                f"{_iso(ends)}",
                headers={**headers, "retry-after": str(wait), "x-should-retry": "false"},
            )
        else:
            described = {
                "requests_per_minute": f"its limit of {limit:g} requests per minute",
                "tokens_per_minute": f"its limit of {limit:g} tokens per minute",
                "max_inflight": f"its limit of {limit:g} requests in flight",
            }[kind]
            refusal = RateLimited(
                f"{_who(scope)} is over {described}; retry in {wait} s", headers={**headers, "retry-after": str(wait)}
            )
        refusal.limit, refusal.scope = f"{scope_kind} {kind}", scope
        return refusal

    async def budget_spend(self, rules: Sequence[Rule]) -> list[tuple[float | None, float]]:
        """For each rule with a budget, in order: the spend counted in its current window (what admission compares
        with the budget; None when the shared counters cannot be read) and when that window ends."""
        now = self._clock()
        windows = [
            budget_counter(scope, limits.budget.per, now, self._period_s) for scope, limits in rules if limits.budget
        ]
        values: list[float | None] = [None] * len(windows)
        if windows:
            try:
                values = list(await self.counters.read([key for key, _ in windows]))
            except CountersError as exc:
                self._store_error(exc)
        return [(value, ends) for value, (_, ends) in zip(values, windows, strict=True)]

    def count(self, lease: Lease, tokens: int, cost: float) -> None:
        """More tokens and cost for a running request, in its admission's windows: counted now in this process's
        counters; for shared ones gathered on the lease and sent by the next flush (one every ``SHARED_COUNT_DELAY``
        seconds at most, every waiting lease in one round trip), or with the settlement when the request ends first
        (so a short request costs one round trip at its end, and a long stream's input tokens are counted for
        everyone while it runs)."""
        if isinstance(self.counters, MemoryCounters):
            now = self._clock()
            self.counters.add_now(self._usage_adds(lease._usage, tokens, cost, now), now)
            return
        held, spent = lease._pending
        lease._pending = (held + tokens, spent + cost)
        self._waiting.add(lease)
        if self._flush_at is None:
            self._flush_at = asyncio.get_running_loop().call_later(SHARED_COUNT_DELAY, self._flush)

    def _flush(self) -> None:
        self._flush_at = None
        now = self._clock()
        adds: list[Add] = []
        for lease in self._waiting:
            (tokens, cost), lease._pending = lease._pending, (0, 0.0)
            adds += self._usage_adds(lease._usage, tokens, cost, now)
        self._waiting.clear()
        if adds:
            self._send(adds)

    @staticmethod
    def _usage_adds(usage: Sequence[Usage], tokens: int, cost: float, now: float) -> list[Add]:
        """Tokens and cost to the admission's counters (``now`` only sets how long they are kept: a budget's
        counter a day past its window's end, however late the request ended)."""
        adds: list[Add] = []
        for tokens_key, usd_key, ends in usage:
            if tokens and tokens_key:  # (a spend limit's rule counts no tokens)
                adds.append((tokens_key, tokens, _MINUTE_TTL))
            if cost and usd_key is not None:
                left = math.ceil(ends - now)
                adds.append((usd_key, cost, (left if left > 1 else 1) + 86_400))
        return adds

    def settle(self, lease: Lease, tokens: int = 0, cost: float = 0.0) -> None:
        """A request ended: give back its slot in flight, with the tokens and cost not yet counted, in its
        admission's windows (off the request path with Redis: one round trip, sent at once)."""
        if not lease._usage:
            return
        self._waiting.discard(lease)
        now = self._clock()
        adds = (
            lease._giveback + self._usage_adds(lease._usage, tokens, cost, now) if tokens or cost else lease._giveback
        )
        if isinstance(self.counters, MemoryCounters):
            self.counters.add_now(adds, now)
            return
        self._send(adds)

    def _send(self, adds: list[Add]) -> None:
        """Off the request path: to Redis with nothing awaiting it (its failure counted by ``_store_error``);
        else a future the store settles (no task), or a task for a coroutine."""
        counters = self.counters
        if isinstance(counters, RedisCounters):
            waiter = self._unawaited
            if waiter is None:
                from gateway.governance.redis_client import Unawaited

                waiter = self._unawaited = Unawaited(self._store_error)
            counters.add_unawaited(adds, waiter)
            return
        sent = counters.add(adds)
        if not asyncio.isfuture(sent):
            sent = asyncio.get_running_loop().create_task(_awaited(sent))
        self._sent.add(sent)
        sent.add_done_callback(self._done)

    def _done(self, sent: asyncio.Future[Any]) -> None:
        self._sent.discard(sent)
        if not sent.cancelled() and (exc := sent.exception()) is not None:
            self._store_error(exc)

    def _store_error(self, exc: BaseException) -> None:
        if self._store_errors is not None:
            self._store_errors()
        now = time.monotonic()
        if now - self._logged_at >= 60:  # once a minute, however many requests see it
            self._logged_at = now
            log.warning("rate-limit store unreachable (%s): limits.on_store_error is %s", exc, self._policy)

    async def aclose(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush()
        if self._sent:
            await asyncio.gather(*self._sent, return_exceptions=True)
        if isinstance(self.counters, RedisCounters):
            await self.counters.drain()
        await self.counters.aclose()


async def _awaited(sent: Awaitable[None]) -> None:
    await sent


def _plan_spend(
    rules: Sequence[Rule],
    now: float,
    checks: list[Check],
    what: list[tuple[str, str, float]],
    usage: list[Usage],
    period_s: float | None,
) -> None:
    """``Limiter._plan`` for the spend limits' rules: a budget each, checked and charged; no requests, tokens or
    slot in flight counted for them."""
    for scope, limits in rules:
        budget = limits.budget
        assert budget is not None
        counter, ends = budget_counter(scope, budget.per, now, period_s)
        checks.append((counter, budget.usd))
        what.append(("budget", scope, ends))
        usage.append(("", counter, ends))


def _store_down(key: ClientKey | None, rules: Sequence[Rule]) -> GatewayError:
    """The refusal when the counters cannot be read and ``on_store_error`` is ``deny``: Claude Code's
    ``fetch_error`` for a signed-in principal under a budget, else ``LimitStoreDown``."""
    if key is not None and key.session and any(limits.budget for _, limits in rules):
        headers, message = overage.fetch_error()
        return SpendUnchecked(message, headers=headers)
    return LimitStoreDown("the gateway's rate-limit store cannot be reached; retry shortly")


async def _wait(seeding: asyncio.Future[Any]) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(seeding), _SEED_WAIT_S)


def _caps(
    rules: Sequence[Rule], checks: list[Check], what: list[tuple[str, str, float]], values: list[float]
) -> list[overage.Cap]:
    """The budget checks of an admission (in the rules' order) as ``overage.Cap``s."""
    pers = [limits.budget.per for _, limits in rules if limits.budget is not None]
    budgets = [(check, w, value) for check, w, value in zip(checks, what, values, strict=True) if w[0] == "budget"]
    return [
        overage.Cap(scope, per, limit, value, ends)
        for per, ((_, limit), (_, scope, ends), value) in zip(pers, budgets, strict=True)
    ]


_SPEND_SCOPES = {"spend-user": "user", "spend-group": "group"}  # the spend limits' (gateway.governance.spend_limits)


def _who(scope: str) -> str:
    kind, _, name = scope.partition(":")
    if scope == "spend-org":
        return "the organization"
    return f"{_SPEND_SCOPES.get(kind, kind)} {name!r}" if name else "this gateway's default"


def check_priced(route: Route, model: str, price_of: Callable[[str], object | None]) -> None:
    """``InvalidRequest`` (400) naming the model when a target of ``route`` would be asked for a model without a
    price: a budget-limited request must be one whose cost can be counted (a glob route forwards any name, and an
    unpriced model costs 0 — five requests under a $0.0001 budget were all served)."""
    for target in route.targets:
        upstream = target.upstream_model(model)
        if price_of(upstream) is None:
            raise InvalidRequest(
                f"model {upstream!r} has no price in the gateway's `pricing`, and this key has a budget: a budget "
                "can only hold spending the gateway can count (ask the operator to price the model)"
            )


def unpriced_routes(settings: Settings) -> list[str]:
    """``check-config``'s warnings: the routes a budget-limited key may be refused on because a target's model
    has no price (a glob route passing the client's names through, unless a price matches every name)."""
    budgets = (
        (settings.limits is not None and settings.limits.budget is not None)
        or any(t.limits is not None and t.limits.budget is not None for t in settings.teams.values())
        or any(
            isinstance(k, ApiKey) and k.limits is not None and k.limits.budget is not None for k in settings.auth.keys
        )
        or bool(settings.admin.keys)  # keys issued at run time may carry budgets
    )
    if not budgets:
        return []

    prices = Prices(settings.pricing, builtin=settings.builtin_pricing)
    shipped = " or the shipped Claude table" if settings.builtin_pricing else ""
    out = []
    for alias, route in settings.models.items():
        for target in route.targets:
            if target.model is not None and not prices.covers(target.model):
                out.append(
                    f"route {alias!r}: target model {target.model!r} has no price: a key with a budget is refused it"
                )
            elif target.model is None and not prices.covers(alias):  # the alias's names, passed through
                out.append(
                    f"route {alias!r} passes the client's model names through and no price matches all of them: a key "
                    f"with a budget is refused the names `pricing`{shipped} does not price"
                )
    return out


def budget_periods(settings: Settings) -> set[str]:
    """The budget periods any principal may be under: the defaults', the teams', the file's keys' (an admin key may
    issue keys with any of them)."""
    periods: set[str] = set()
    budgets = [settings.limits.budget if settings.limits is not None else None]
    budgets += [t.limits.budget for t in settings.teams.values() if t.limits is not None]
    budgets += [k.limits.budget for k in settings.auth.keys if isinstance(k, ApiKey) and k.limits is not None]
    for budget in budgets:
        if budget is not None:
            periods.add(budget.per)
    if settings.admin.keys:
        periods |= {"day", "week", "month"}
    return periods


async def seed_budgets(
    limiter: Limiter, settings: Settings, store: Any, now: float | None = None, plans: Sequence[SeedPlan] = ()
) -> int:
    """Budgets that survive a restart (issue 33): the spend of the current window of every budget period, per key
    (its id) and per team, read from the ledger and set into the limiter's counters before it admits a budgeted
    request; and what ``plans`` add (the spend limits': ``gateway.governance.spend_limits.SpendLimits.seed_plans``).
    Returns the counters seeded."""
    base: list[SeedPlan] = []
    for per in sorted(budget_periods(settings)):
        base += [(per, "key_name", _prefixed("key:")), (per, "team", _prefixed("team:"))]
    spent = await ledger_spend(limiter, store, [*base, *plans], now)
    await limiter.seed(spent)
    return len(spent)


def _prefixed(prefix: str) -> Callable[[str], str | None]:
    return lambda name: prefix + name


async def ledger_spend(
    limiter: Limiter, store: Any, plans: Sequence[SeedPlan], now: float | None = None
) -> dict[str, tuple[float, float]]:
    """What the ledger holds for ``plans``: budget counter -> (spend in the current window, the window's end); one
    query per period and dimension, the values each plan maps to one scope added up."""
    from gateway.governance.store import UsageQuery

    now = limiter._clock() if now is None else now
    grouped: dict[tuple[str, str], list[Callable[[str], str | None]]] = {}
    for per, column, scope_of in plans:
        grouped.setdefault((per, column), []).append(scope_of)
    spent: dict[str, tuple[float, float]] = {}
    for (per, column), scopes in grouped.items():
        ends = budget_window(per, now, limiter._period_s)[1]
        start = budget_window_start(per, now, limiter._period_s)
        query = UsageQuery(
            start_ms=int(start * 1000),
            end_ms=int(now * 1000) + 1,
            bucket_ms=max(1, int((ends - start) * 1000)),
            group_by=(column,),
        )
        for total in await store.totals(query):
            name = total.dimensions.get(column, "")
            if not name or not total.cost_usd:
                continue
            for scope_of in scopes:
                scope = scope_of(name)
                if scope is not None:
                    counter = budget_counter(scope, per, now, limiter._period_s)[0]
                    spent[counter] = (spent.get(counter, (0.0, ends))[0] + total.cost_usd, ends)
    return spent

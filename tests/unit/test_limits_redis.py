"""The limiter over a real Redis (``redis-server`` started for the session): the same limits as in memory,
shared by two limiters (two processes' worth); Redis down → ``allow`` serves and counts, ``deny`` answers 529;
Redis back → the limits hold again."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.governance.keys import build_keys
from gateway.governance.limits import BudgetExceeded, Limiter, LimitStoreDown, RateLimited, RedisCounters
from gateway.settings import parse_settings
from tests.unit.test_limits import EDGE_IDS, EDGES, PRICING, RESETS, at

CONFIG = """
auth:
  keys:
    - {{name: ci, key: k1, team: pay, limits: {{requests_per_minute: 10}}}}
    - {{name: ops, key: k2, team: pay}}
teams:
  pay: {{limits: {{budget: {{usd: 1, per: day}}}}}}
limits: {{redis_url: "{url}", on_store_error: {policy}}}
pricing: {{"m*": {{input: 1}}}}
"""


def limiter_pair(url: str, prefix: str, policy: str = "allow") -> tuple[Any, dict[str, Any], list[Limiter], list[int]]:
    settings = parse_settings(CONFIG.format(url=url, policy=policy))
    keys = {k.name: k for k in build_keys(settings.auth.keys, settings.teams)}
    errors: list[int] = []
    limiters = [
        Limiter(
            counters=RedisCounters(url, prefix=prefix),
            on_store_error=policy,
            store_errors=lambda: errors.append(1),
        )
        for _ in range(2)
    ]
    return settings, keys, limiters, errors


def test_two_limiters_share_a_rate_limit_and_a_team_budget(redis_server: Any) -> None:
    settings, keys, (a, b), _ = limiter_pair(redis_server.url, "t1:")

    async def go() -> None:
        for i in range(10):  # ten admitted, alternating between the two "processes"
            lease, headers = await (a if i % 2 else b).admit(settings, keys["ci"])
            assert lease is not None and headers["anthropic-ratelimit-requests-remaining"] == str(9 - i)
            lease.settle(5, None)
        for limiter in (a, b):  # the 11th, whichever serves it
            with pytest.raises(RateLimited) as info:
                await limiter.admit(settings, keys["ci"])
            assert info.value.headers["anthropic-ratelimit-requests-remaining"] == "0"
        lease, _ = await a.admit(settings, keys["ops"])  # the team's budget: spent through one limiter ...
        assert lease is not None
        lease.settle(1, 1.0)
        await asyncio.sleep(0.1)  # the settlement is one pipelined round trip in a task
        with pytest.raises(BudgetExceeded):  # ... refused through the other
            await b.admit(settings, keys["ops"])
        for limiter in (a, b):
            await limiter.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("policy", ["allow", "deny"])
def test_redis_down_allows_or_denies_and_comes_back(redis_server: Any, policy: str) -> None:
    settings, keys, (a, _), errors = limiter_pair(redis_server.url, f"t2{policy}:", policy)

    async def go() -> None:
        lease, _ = await a.admit(settings, keys["ci"])
        assert lease is not None
        redis_server.stop()
        try:
            if policy == "allow":
                lease, headers = await a.admit(settings, keys["ci"])  # served, uncounted
                assert lease is not None and headers == {}
            else:
                with pytest.raises(LimitStoreDown) as info:
                    await a.admit(settings, keys["ci"])
                assert (info.value.status_code, info.value.error_type) == (529, "overloaded_error")
            assert errors
        finally:
            redis_server.start()
        for _ in range(50):  # the client reconnects by itself
            try:
                lease, headers = await a.admit(settings, keys["ci"])
                if headers:
                    break
            except LimitStoreDown:
                pass
            await asyncio.sleep(0.05)
        assert headers["anthropic-ratelimit-requests-limit"] == "10"
        await a.aclose()

    asyncio.run(go())


def test_a_running_requests_tokens_reach_redis_within_the_delay_and_a_short_ones_with_its_settlement(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis as sync_redis

    import gateway.governance.limits

    monkeypatch.setattr(gateway.governance.limits, "SHARED_COUNT_DELAY", 0.2)
    settings = parse_settings(
        "auth: {keys: [{name: a, key: k, limits: {tokens_per_minute: 100}}]}\n"
        f'limits: {{redis_url: "{redis_server.url}"}}'
    )
    key = build_keys(settings.auth.keys, settings.teams)[0]
    direct = sync_redis.Redis.from_url(redis_server.url)
    sends: list[int] = []

    async def go() -> None:
        def watched(prefix: str) -> Limiter:
            counters = RedisCounters(redis_server.url, prefix=prefix)
            original = counters.add_unawaited

            def counted(adds: Any, waiter: Any) -> None:
                sends.append(len(adds))
                original(adds, waiter)

            counters.add_unawaited = counted  # type: ignore[method-assign]
            return Limiter(counters=counters)

        a, b = watched("t3:"), Limiter(counters=RedisCounters(redis_server.url, prefix="t3:"))
        lease, _ = await a.admit(settings, key)
        assert lease is not None
        lease.count(60, None)  # message_start of a long stream
        lease.count(100, None)  # a message_delta soon after: gathered with it
        assert not [k for k in direct.keys("t3:*") if b"|tokens|" in k]
        await asyncio.sleep(0.4)
        assert sends == [1]  # one round trip for both
        with pytest.raises(RateLimited, match="tokens per minute"):  # seen by the other process while it runs
            await b.admit(settings, key)
        lease.settle(100, None)
        await asyncio.sleep(0.1)
        assert sends == [1, 1]  # the settlement: the slot in flight only
        tokens = next(k for k in direct.keys("t3:*") if b"|tokens|" in k)
        assert float(direct.get(tokens) or 0) == 100
        c = watched("t4:")
        short, _ = await c.admit(settings, key)
        assert short is not None
        short.count(5, None)
        short.settle(8, None)  # ended before the delay: everything in the settlement's one round trip
        await asyncio.sleep(0.4)
        assert sends == [1, 1, 2]
        for limiter in (a, b, c):
            await limiter.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("policy", ["allow", "deny"])
def test_a_redis_that_stops_answering_is_down_within_the_store_timeout(redis_server: Any, policy: str) -> None:
    """A real redis-server frozen (SIGSTOP: the connection stays open, nothing answers): the call gives up after
    ``STORE_TIMEOUT`` and the policy applies; thawed, the limiter counts again on a fresh connection."""
    import os
    import signal
    import time

    from gateway.governance.limits import STORE_TIMEOUT

    settings, keys, (a, _), errors = limiter_pair(redis_server.url, f"t4{policy}:", policy)

    async def go() -> None:
        lease, headers = await a.admit(settings, keys["ci"])
        assert lease is not None and headers
        assert redis_server.proc is not None
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            if policy == "allow":
                lease, headers = await a.admit(settings, keys["ci"])
                assert lease is not None and headers == {}
            else:
                with pytest.raises(LimitStoreDown):
                    await a.admit(settings, keys["ci"])
            waited = time.monotonic() - started
            assert STORE_TIMEOUT * 0.9 <= waited < STORE_TIMEOUT + 1.0
            assert errors
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        lease, headers = await a.admit(settings, keys["ci"])
        assert lease is not None and headers["anthropic-ratelimit-requests-limit"] == "10"
        await a.aclose()

    asyncio.run(go())


def test_a_settlement_redis_cannot_take_is_counted_as_a_store_error_without_a_task(redis_server: Any) -> None:
    """The settlement is sent at once on the client's connection with nothing awaiting it (no task, no future, no
    callback per request); when Redis has gone it fails and ``gateway_limit_store_errors_total`` counts it, once."""
    import redis as sync_redis

    settings, keys, (a, _), errors = limiter_pair(redis_server.url, "t5:")
    direct = sync_redis.Redis.from_url(redis_server.url)

    async def go() -> None:
        lease, _ = await a.admit(settings, keys["ci"])
        assert lease is not None
        assert float(direct.get("t5:key:ci|inflight") or 0) == 1
        tasks = len(asyncio.all_tasks())
        lease.settle(5, None)
        assert len(asyncio.all_tasks()) == tasks and not a._sent
        assert isinstance(a.counters, RedisCounters)
        await a.counters.drain()  # answered: the slot is back
        assert direct.get("t5:key:ci|inflight") is None and not errors
        lease, _ = await a.admit(settings, keys["ci"])
        assert lease is not None
        redis_server.stop()
        try:
            lease.settle(5, None)
            for _ in range(100):
                if errors:
                    break
                await asyncio.sleep(0.02)
            assert errors == [1] and not a._sent
        finally:
            redis_server.start()
        await a.aclose()

    asyncio.run(go())


# Periods at their edges, in Redis as in memory (tests/unit/test_limits.py has the same cases): a request is
# counted once, in the windows it was admitted in, even when its counts reach Redis after the window has ended.


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def clocked(url: str, prefix: str, yaml: str) -> tuple[Any, Any, Limiter, Clock, Any]:
    import redis as sync_redis

    settings = parse_settings(yaml + f'\nlimits: {{redis_url: "{url}"}}')
    key = build_keys(settings.auth.keys, settings.teams)[0]
    clock = Clock()
    direct = sync_redis.Redis.from_url(url)
    direct.delete(*direct.keys(prefix + "*") or ["-"])
    return settings, key, Limiter(clock, counters=RedisCounters(url, prefix=prefix)), clock, direct


def budget_yaml(per: str) -> str:
    return f"auth: {{keys: [{{name: a, key: k, limits: {{budget: {{usd: 5, per: {per}}}}}}}]}}\n" + PRICING


@pytest.mark.parametrize(("per", "admitted", "settled", "window", "following"), EDGES, ids=EDGE_IDS)
def test_in_redis_a_request_across_a_budget_windows_end_is_charged_once_to_its_admissions_window(
    redis_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    per: str,
    admitted: str,
    settled: str,
    window: str,
    following: str,
) -> None:
    import gateway.governance.limits

    monkeypatch.setattr(gateway.governance.limits, "SHARED_COUNT_DELAY", 0.05)
    prefix = f"p1{per}{admitted[:10]}:"
    settings, key, limiter, clock, direct = clocked(redis_server.url, prefix, budget_yaml(per))

    async def go() -> None:
        clock.now = at(admitted)
        lease, _ = await limiter.admit(settings, key)
        assert lease is not None
        clock.now += 0.3
        lease.count(10, 1.0)  # message_start before the end; its flush runs after it, in the next window
        clock.now = at(settled)
        await asyncio.sleep(0.2)
        assert float(direct.get(f"{prefix}key:a|usd|{window}") or 0) == 1.0
        lease.count(30, 4.5)
        lease.settle(40, 5.0)
        await asyncio.sleep(0.1)
        assert float(direct.get(f"{prefix}key:a|usd|{window}") or 0) == 5.0
        assert direct.ttl(f"{prefix}key:a|usd|{window}") > 86_000  # kept a day past its window's end
        assert not direct.exists(f"{prefix}key:a|usd|{following}")  # the next window starts at 0 ...
        second, _ = await limiter.admit(settings, key)  # ... and admits
        assert second is not None
        second.settle(40, 5.0)
        await asyncio.sleep(0.1)
        assert float(direct.get(f"{prefix}key:a|usd|{following}") or 0) == 5.0
        with pytest.raises(BudgetExceeded, match=r"spent \$5\.00 of its \$5 budget"):
            await limiter.admit(settings, key)
        await limiter.aclose()

    asyncio.run(go())


@pytest.mark.parametrize(("per", "last", "first"), RESETS, ids=[f"{p}-{last[:10]}" for p, last, _ in RESETS])
def test_in_redis_an_exhausted_budget_refuses_to_its_last_second_and_admits_at_the_next_windows_first(
    redis_server: Any, per: str, last: str, first: str
) -> None:
    prefix = f"p2{per}{last[:10]}:"
    settings, key, limiter, clock, _ = clocked(redis_server.url, prefix, budget_yaml(per))

    async def go() -> None:
        clock.now = at(last) - 3600
        lease, _ = await limiter.admit(settings, key)
        assert lease is not None
        lease.settle(40, 5.0)
        await asyncio.sleep(0.1)
        for now in (at(last), at(last) + 0.999):
            clock.now = now
            with pytest.raises(BudgetExceeded) as info:
                await limiter.admit(settings, key)
            assert info.value.headers["retry-after"] == "1" and f"resets at {first}Z" in str(info.value.message)
        clock.now = at(first)
        lease, _ = await limiter.admit(settings, key)
        assert lease is not None
        await limiter.aclose()

    asyncio.run(go())


def test_in_redis_a_request_admitted_at_a_minutes_end_is_counted_once_in_it_though_its_flush_runs_in_the_next(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gateway.governance.limits

    monkeypatch.setattr(gateway.governance.limits, "SHARED_COUNT_DELAY", 0.05)
    prefix = "p3:"
    settings, key, limiter, clock, direct = clocked(
        redis_server.url,
        prefix,
        "auth: {keys: [{name: a, key: k, limits: {requests_per_minute: 2, tokens_per_minute: 100}}]}",
    )

    async def go() -> None:
        clock.now = at("2026-12-02T10:00:59.5")
        minute = int(clock.now // 60)
        lease, _ = await limiter.admit(settings, key)
        assert lease is not None
        clock.now += 0.4
        lease.count(60, None)  # message_start at 10:00:59.9; the flush that sends it runs at 10:01:00.5
        clock.now = at("2026-12-02T10:01:00.5")
        await asyncio.sleep(0.2)
        assert float(direct.get(f"{prefix}key:a|tokens|{minute}") or 0) == 60
        lease.count(90, None)  # a message_delta in the next minute
        lease.settle(100, None)
        await asyncio.sleep(0.1)
        assert float(direct.get(f"{prefix}key:a|requests|{minute}") or 0) == 1
        assert float(direct.get(f"{prefix}key:a|tokens|{minute}") or 0) == 100
        assert not direct.exists(f"{prefix}key:a|tokens|{minute + 1}", f"{prefix}key:a|requests|{minute + 1}")
        assert float(direct.get(f"{prefix}key:a|inflight") or 0) == 0
        _, headers = await limiter.admit(settings, key)
        assert headers["anthropic-ratelimit-tokens-remaining"] == "100"
        assert headers["anthropic-ratelimit-requests-remaining"] == "1"
        await limiter.aclose()

    asyncio.run(go())


def test_in_redis_a_slot_given_back_after_its_counter_expired_leaves_no_negative_count(redis_server: Any) -> None:
    """The in-flight counter expires (a slot a crashed process never gave back is forgotten); a stream that outlived
    it gives back only what the counter still holds: never below zero, never a recreated key."""
    import redis as sync_redis

    direct = sync_redis.Redis.from_url(redis_server.url)
    counters = RedisCounters(redis_server.url, prefix="floor:")

    async def go() -> None:
        await counters.add([("a|inflight", 1, 3600), ("b|inflight", 2, 3600)])
        direct.delete("floor:a|inflight")  # expired meanwhile
        await counters.add([("a|inflight", -1, 3600), ("b|inflight", -1, 3600), ("c|inflight", -1, 3600)])
        assert direct.get("floor:a|inflight") is None and direct.get("floor:c|inflight") is None
        assert float(direct.get("floor:b|inflight") or 0) == 1
        await counters.add([("b|inflight", -1, 3600), ("b|inflight", -1, 3600)])
        assert direct.get("floor:b|inflight") is None
        await counters.add([("b|tokens|1", 5, 120), ("b|tokens|1", -2, 120)])  # a positive count is unchanged
        assert float(direct.get("floor:b|tokens|1") or 0) == 3
        await counters.aclose()

    asyncio.run(go())


def test_in_redis_a_keys_admission_is_packed_once_a_minute_and_counts_in_each_minutes_own_counter(
    redis_server: Any,
) -> None:
    """The admission's EVALSHA is packed once per key and minute (``_Plan.prepared``) and sent as it is: the
    counts land in the minute's own counter, a new minute packs a new one, and a reloaded limit is applied at once."""
    from tests.unit.test_limits import Clock

    yaml = "auth: {keys: [{name: a, key: k, limits: {requests_per_minute: %d}}]}\n"
    yaml += f'limits: {{redis_url: "{redis_server.url}"}}\n'.replace("%", "%%")
    settings = parse_settings(yaml % 5)
    keys = {k.name: k for k in build_keys(settings.auth.keys, settings.teams)}
    clock = Clock()
    limiter = Limiter(clock, counters=RedisCounters(redis_server.url, prefix="plan:"))

    async def go() -> None:
        from gateway.governance.redis_client import RedisClient

        await limiter.admit(settings, keys["a"])
        (plan,) = limiter._plans.values()
        prepared = plan.prepared
        assert prepared is not None
        _, headers = await limiter.admit(settings, keys["a"])
        assert plan.prepared is prepared and headers["anthropic-ratelimit-requests-remaining"] == "3"
        raw = RedisClient(redis_server.url)
        minute = int(clock.now // 60)
        key_id = keys["a"].id
        assert await raw.call("GET", f"plan:key:{key_id}|requests|{minute}") == b"2"
        clock.now += 30  # the next minute
        _, headers = await limiter.admit(settings, keys["a"])
        (later,) = limiter._plans.values()
        assert later is not plan and later.prepared is not prepared
        assert headers["anthropic-ratelimit-requests-remaining"] == "4"
        assert await raw.call("GET", f"plan:key:{key_id}|requests|{minute + 1}") == b"1"
        reloaded = parse_settings(yaml % 1)
        reloaded_keys = {k.name: k for k in build_keys(reloaded.auth.keys, reloaded.teams)}
        with pytest.raises(RateLimited, match="1 requests per minute"):
            await limiter.admit(reloaded, reloaded_keys["a"])
        await raw.aclose()
        await limiter.aclose()
        await limiter.counters.aclose()

    asyncio.run(go())


def test_unawaited_commands_cost_no_future_and_hand_each_failure_to_their_caller(redis_server: Any) -> None:
    """``evalsha_unawaited`` (the limiter's settlements): no future is made; a reply is dropped, an error reply
    (and a script the server has not seen yet, sent again whole after ``NOSCRIPT``) handled as for an awaited call;
    ``drain`` returns once everything sent is answered; a connection lost fails each command under way, once."""
    import redis as sync_redis

    from gateway.governance.redis_client import RedisClient, ReplyError, Script, Unawaited

    direct = sync_redis.Redis.from_url(redis_server.url)
    incr = Script("return redis.call('INCRBY', KEYS[1], ARGV[1]) -- t7 " + str(time.time()))  # unknown to the server
    boom = Script("return redis.error_reply('boom')")
    failures: list[BaseException] = []
    waiter = Unawaited(failures.append)

    async def go() -> None:
        client = RedisClient(redis_server.url)
        made = 0
        loop = asyncio.get_running_loop()
        original = loop.create_future

        def counted() -> asyncio.Future[Any]:
            nonlocal made
            made += 1
            return original()

        loop.create_future = counted  # type: ignore[method-assign]
        await client.call(b"PING")  # connected
        made = 0
        for _ in range(50):
            client.evalsha_unawaited(incr, [b"t7:n"], [2], waiter)
        client.evalsha_unawaited(boom, [], [], waiter)
        assert made == 0
        await client.drain()
        assert int(direct.get("t7:n") or 0) == 100  # every one, the first sent again whole after NOSCRIPT
        assert len(failures) == 1 and isinstance(failures[0], ReplyError) and "boom" in str(failures[0])
        failures.clear()
        redis_server.stop()
        try:
            for _ in range(3):
                client.evalsha_unawaited(incr, [b"t7:n"], [1], waiter)
            for _ in range(100):
                if len(failures) >= 3:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.05)
            assert len(failures) == 3  # each command once, whether lost with the connection or refused at once
        finally:
            redis_server.start()
        await client.drain()
        await client.aclose()

    asyncio.run(go())


def test_a_key_issued_again_with_other_limits_is_admitted_under_its_own(redis_server: Any) -> None:
    """Rules are made once per key object and config (``Limiter._key_rules``): a key issued again under the same
    name and config (a new object with other limits) is never admitted under the old one's."""
    from gateway.governance.keys import ClientKey
    from gateway.settings import LimitSettings

    settings = parse_settings(f'auth: {{open: true}}\nlimits: {{redis_url: "{redis_server.url}"}}')
    limiter = Limiter(counters=RedisCounters(redis_server.url, prefix="t8:"))
    old = ClientKey(name="k", key=b"k1", limits=LimitSettings(requests_per_minute=100))
    new = ClientKey(name="k", key=b"k1", limits=LimitSettings(requests_per_minute=1), id="k")

    async def go() -> None:
        _, headers = await limiter.admit(settings, old)
        assert headers["anthropic-ratelimit-requests-limit"] == "100"
        with pytest.raises(RateLimited, match="its limit of 1 requests per minute"):  # one counted in its minute
            await limiter.admit(settings, new)
        _, headers = await limiter.admit(settings, old)  # the old object still has its own
        assert headers["anthropic-ratelimit-requests-limit"] == "100"
        assert headers["anthropic-ratelimit-requests-remaining"] == "98"
        await limiter.aclose()

    asyncio.run(go())

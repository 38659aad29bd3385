"""The limiter over a real Redis (``redis-server`` started for the session): the same limits as in memory,
shared by two limiters (two processes' worth); Redis down → ``allow`` serves and counts, ``deny`` answers 529;
Redis back → the limits hold again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.edge import build_keys
from gateway.limits import BudgetExceeded, Limiter, LimitStoreDown, RateLimited, RedisCounters
from gateway.settings import parse_settings

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

    import gateway.limits

    monkeypatch.setattr(gateway.limits, "SHARED_COUNT_DELAY", 0.2)
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
            original = counters.add

            async def counted(adds: Any) -> None:
                sends.append(len(adds))
                await original(adds)

            counters.add = counted  # type: ignore[method-assign]
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

    from gateway.limits import STORE_TIMEOUT

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
    """The settlement is sent at once on the client's connection (a future, no task per request); when Redis has
    gone it fails and ``gateway_limit_store_errors_total`` counts it."""
    settings, keys, (a, _), errors = limiter_pair(redis_server.url, "t5:")

    async def go() -> None:
        lease, _ = await a.admit(settings, keys["ci"])
        assert lease is not None
        tasks = len(asyncio.all_tasks())
        lease.settle(5, None)
        assert len(asyncio.all_tasks()) == tasks and len(a._sent) == 1
        await asyncio.gather(*a._sent)
        assert not errors
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

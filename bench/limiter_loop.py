"""The limiter alone, in a loop: ``python -m bench.limiter_loop memory redis://127.0.0.1:6379/0 …`` — CPU per
request (admission, two counts as a stream reports its usage, the settlement, the rate-limit headers) at C = 10,
this process pinned to core 0 (start the ``redis-server`` on core 1: ``taskset -c 1 redis-server``). Five repeats
of 5,000 requests each, after a warm-up; limits no request reaches, as ``bench.run --limits`` sets them."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import uvloop

from gateway.governance.limits import Limiter, RedisCounters
from gateway.settings import parse_settings

SETTINGS = parse_settings(
    "auth: {open: true}\n"
    "limits: {requests_per_minute: 100000000, tokens_per_minute: 100000000000, max_inflight: 100000}\n",
    environ={},
)


async def one(limiter: Limiter) -> None:
    lease, _ = await limiter.admit(SETTINGS, None)
    assert lease is not None
    lease.count(10, None)
    lease.count(210, None)
    lease.settle(210, None)


async def worker(limiter: Limiter, n: int) -> None:
    for _ in range(n):
        await one(limiter)


async def measure(where: str) -> list[float]:
    limiter = Limiter(counters=RedisCounters(where)) if where.startswith("redis") else Limiter()
    await asyncio.gather(*(worker(limiter, 100) for _ in range(10)))
    out = []
    for _ in range(5):
        started = time.process_time()
        await asyncio.gather(*(worker(limiter, 500) for _ in range(10)))
        out.append((time.process_time() - started) / 5000 * 1e6)
    await limiter.aclose()
    await limiter.counters.aclose()
    return out


def main() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    for where in sys.argv[1:] or ["memory"]:
        figures = uvloop.run(measure(where))
        print(where, " ".join(f"{f:.1f}" for f in figures), "µs CPU per request (C=10)")


if __name__ == "__main__":
    main()

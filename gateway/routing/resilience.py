"""How hard the gateway tries for a request before its first byte: the retry policy, the first-event and total
timeouts, and the clock, sleep and randomness they run on (injected in tests). One per runtime; the pipeline's
attempt loop reads it."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from gateway.routing.balance import RetryPolicy
from gateway.settings import ResilienceSettings

__all__ = ["Resilience"]


class Resilience:
    """How hard the gateway tries before the first byte: the retry policy, the first-event and total timeouts,
    and the clock, sleep and randomness they use (injected in tests)."""

    def __init__(
        self,
        settings: ResilienceSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        settings = settings or ResilienceSettings()
        retry = settings.retry
        self.policy = RetryPolicy(retry.max_attempts, retry.base_delay_s, retry.max_delay_s)
        self.first_event_s = settings.timeouts.first_event_s
        self.total_s = settings.timeouts.total_s
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()

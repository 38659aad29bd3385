"""The ledger's writer over the memory store: batches, back-off while the store is down, nothing dropped
silently, the queue flushed at shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import pytest

from gateway.governance.ledger import Ledger
from gateway.governance.store import LedgerRow, MemoryStore
from gateway.observability.metrics import Metrics


class Counted:
    def __init__(self) -> None:
        self.rows: Counter[str] = Counter()
        self.depth = 0

    def ledger_rows(self, result: str, n: int) -> None:
        self.rows[result] += n

    def ledger_queue(self, depth: int) -> None:
        self.depth = depth


def rows(n: int, start: int = 0) -> list[LedgerRow]:
    now = int(time.time() * 1000)  # recent: the retention prune keeps them
    return [LedgerRow(started_ms=now + i, request_id=f"req_{i}") for i in range(start, start + n)]


def test_rows_are_written_in_batches_and_counted() -> None:
    store, counted = MemoryStore(), Counted()
    ledger = Ledger(store, counted, batch_rows=4)
    for row in rows(10):
        ledger.add(row)
    assert counted.depth == 10 and store.rows == {}  # add() writes nothing itself
    assert asyncio.run(ledger.flush())
    assert len(store.rows) == 10 and store.writes == 3  # 4 + 4 + 2
    assert counted.rows == {"written": 10} and counted.depth == 0


def test_a_store_that_is_down_keeps_the_rows_queued_and_retries_with_backoff() -> None:
    store, counted = MemoryStore(), Counted()
    ledger = Ledger(store, counted, batch_rows=100, flush_interval_s=1.0)
    for row in rows(5):
        ledger.add(row)
    store.fail = ConnectionError("down")

    async def go() -> list[float]:
        waits = []
        for _ in range(3):
            assert not await ledger.flush()
            waits.append(ledger._backoff())
        store.fail = None
        assert await ledger.flush()
        waits.append(ledger._backoff())
        return waits

    assert asyncio.run(go()) == [2.0, 4.0, 8.0, 1.0]
    assert len(store.rows) == 5
    assert counted.rows == {"retried": 15, "written": 5}


def test_a_full_queue_drops_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    store, counted = MemoryStore(), Counted()
    ledger = Ledger(store, counted, max_queue=3)
    for row in rows(5):
        ledger.add(row)
    assert counted.rows == {"dropped": 2} and ledger.depth == 3
    with caplog.at_level(logging.ERROR, logger="gateway"):
        asyncio.run(ledger.flush())
    assert "2 rows dropped" in caplog.text
    assert sorted(store.rows) == ["req_0", "req_1", "req_2"]


def test_aclose_flushes_what_is_queued_and_counts_what_it_cannot() -> None:
    store, counted = MemoryStore(), Counted()
    ledger = Ledger(store, counted)
    for row in rows(3):
        ledger.add(row)
    asyncio.run(ledger.aclose(within=1))
    assert len(store.rows) == 3

    down, counted = MemoryStore(), Counted()
    down.fail = ConnectionError("down")
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        await asyncio.sleep(0)

    ledger = Ledger(down, counted, sleep=sleep, flush_interval_s=0.01)
    for row in rows(3):
        ledger.add(row)
    asyncio.run(ledger.aclose(within=0.2))
    assert slept and counted.rows["dropped"] == 3 and ledger.depth == 0


def test_the_background_writer_flushes_every_interval() -> None:
    store = MemoryStore()
    ledger = Ledger(store, Metrics(), flush_interval_s=0.01)

    async def go() -> None:
        task = asyncio.ensure_future(ledger.run())
        for row in rows(3):
            ledger.add(row)
        for _ in range(200):
            if len(store.rows) == 3:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(go())
    assert len(store.rows) == 3


def test_the_background_writer_prunes_past_the_retention() -> None:
    store = MemoryStore()
    old = LedgerRow(started_ms=int(time.time() * 1000) - 3 * 86_400_000, request_id="old")
    store.rows["old"] = old
    ledger = Ledger(store, Counted(), flush_interval_s=0.01, retention_days=2)

    async def go() -> None:
        task = asyncio.ensure_future(ledger.run())
        ledger.add(rows(1)[0])
        for _ in range(200):
            if "old" not in store.rows and store.rows:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(go())
    assert list(store.rows) == ["req_0"]

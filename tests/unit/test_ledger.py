"""The ledger's writer over the memory store: batches, back-off while the store is down, nothing dropped
silently, the queue flushed at shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import pytest

from gateway.governance.ledger import Ledger, row_bytes
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


def test_the_queue_is_bounded_by_the_bytes_its_rows_hold() -> None:
    """Rows of 30 KB session ids (what the edge now drops) or many small ones: the byte bound holds either way,
    and a row's bytes are given back when it is written."""
    store, counted = MemoryStore(), Counted()
    ledger = Ledger(store, counted, max_queue_bytes=100_000)
    now = int(time.time() * 1000)
    big = [LedgerRow(started_ms=now, request_id=f"big_{i}", session_id="x" * 30_000) for i in range(5)]
    for row in big:
        ledger.add(row)
    assert ledger.depth == 3 and counted.rows == {"dropped": 2}
    assert ledger.queued_bytes == sum(row_bytes(r) for r in big[:3]) <= 100_000
    store.fail = ConnectionError("down")
    small = rows(200)
    for row in small:
        ledger.add(row)
    assert ledger.queued_bytes <= 100_000 and counted.rows["dropped"] == 2 + 200 - (ledger.depth - 3)
    store.fail = None
    assert asyncio.run(ledger.flush())
    assert ledger.queued_bytes == 0 and ledger.depth == 0
    assert len(store.rows) + counted.rows["dropped"] == 205
    assert 600 < row_bytes(small[0]) < 700  # the overhead measured with tracemalloc, plus "req_0"


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


@pytest.mark.parametrize("session_id", ["0b9c5d1e-7f3a-4c2b-9e8d-1a2b3c4d5e6f", "x" * 30_000])
def test_row_bytes_is_near_what_tracemalloc_measures(session_id: str) -> None:
    import tracemalloc
    from collections import deque

    def row(i: int) -> LedgerRow:
        return LedgerRow(
            started_ms=1_700_000_000_000 + i,
            request_id=f"req_gw_{i:024x}",
            upstream_request_id=f"req_{i:032x}",
            key_name="alice",
            team="payments",
            user="alice@example.com",
            session_id=session_id[:-6] + f"{i:06d}",
            agent_id=f"agent-{i}",
            alias="claude-sonnet-4-6",
            provider="claude",
            model="claude-sonnet-4-6",
            outcome="completed",
            status=200,
            input_tokens=1000 + i,
            output_tokens=2000 + i,
            cache_read_input_tokens=300_000 + i,
            cost_usd=0.001 * i,
            ttft_ms=1.5 * i,
            duration_ms=2.5 * i,
            attempts=1,
        )

    queue: deque[LedgerRow] = deque()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2000):
            queue.append(row(i))
        measured = (tracemalloc.get_traced_memory()[0] - before) / len(queue)
    finally:
        tracemalloc.stop()
    assert 0.8 < row_bytes(queue[0]) / measured < 1.25, (row_bytes(queue[0]), measured)


def test_row_bytes_counts_each_string_field_of_a_row() -> None:
    """``row_bytes`` (one ``attrgetter`` of every string field, in C) against the field-by-field sum: each field's
    length counts once, whatever the field."""
    import msgspec

    names = [f.name for f in msgspec.structs.fields(LedgerRow) if f.type is str]
    assert len(names) > 10
    base = rows(1)[0]
    for i, name in enumerate(names):  # each string field in turn made long, the others as they are
        row = msgspec.structs.replace(base, **{name: "x" * (1000 + i)})
        assert row_bytes(row) == 600 + sum(len(getattr(row, n)) for n in names)
        assert row_bytes(row) - row_bytes(base) == 1000 + i - len(getattr(base, name))

"""The usage ledger's writer: rows queued by the request path, written to the store in batches off it.

``add`` never blocks and never awaits: the row joins a bounded queue. A background task (``run``) writes the
queue at least every ``flush_interval_s`` (sooner when a batch is full). When the store is slow or down the
rows stay queued and the write is retried with exponential back-off; only when the queue is full (by rows, or
by the bytes its rows hold: ``store.max_queue_bytes``, 64 MiB by default) is a row dropped — counted
(``gateway_ledger_rows_total{result="dropped"}``) and logged, never silently. The store's writes are idempotent
by request id, so a batch retried after a write that in fact committed stores nothing twice. ``aclose`` flushes
what is queued (within the drain's time) before the store is closed; a ``kill -9`` loses at most what was queued
since the last flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import operator
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from gateway.governance.store import LedgerRow, Store, StoreError

__all__ = ["Ledger", "LedgerCounters"]

log = logging.getLogger("gateway")

_DAY_MS = 86_400_000
_PRUNE_EVERY_S = 3600.0


class LedgerCounters(Protocol):
    """Where the writer reports (``gateway.observability.metrics.Metrics`` in the gateway; a recorder in tests)."""

    def ledger_rows(self, result: str, n: int) -> None: ...

    def ledger_queue(self, depth: int) -> None: ...


class Ledger:
    def __init__(
        self,
        store: Store,
        counters: LedgerCounters,
        *,
        flush_interval_s: float = 1.0,
        max_queue: int = 100_000,
        max_queue_bytes: int = 64 * 1024 * 1024,
        batch_rows: int = 1000,
        retention_days: int = 400,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self._counters = counters
        self._interval = flush_interval_s
        self._max = max_queue
        self._max_bytes = max_queue_bytes
        self._bytes = 0  # what the queued rows hold, by ``row_bytes``
        self._batch = batch_rows
        self._retention_ms = retention_days * _DAY_MS
        self._clock = clock
        self._sleep = sleep
        self._queue: deque[LedgerRow] = deque()
        self._sizes: deque[int] = deque()  # each queued row's ``row_bytes``, in the same order (reckoned once)
        self._wake: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._dropped_unlogged = 0
        self.failures = 0  # consecutive failed writes (the back-off's exponent)
        self._last_prune = 0.0
        self._opened = False  # the store is opened (and migrated) by the first flush, and again after a failure

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def add(self, row: LedgerRow) -> None:
        """Queue a row (from the request path: no I/O, no await); dropped, counted, when the queue holds
        ``max_queue`` rows or the row would take it past ``max_queue_bytes``."""
        size = row_bytes(row)
        if len(self._queue) >= self._max or self._bytes + size > self._max_bytes:
            self._counters.ledger_rows("dropped", 1)
            self._dropped_unlogged += 1
            return
        self._bytes += size
        self._queue.append(row)
        self._sizes.append(size)
        self._counters.ledger_queue(len(self._queue))
        if len(self._queue) >= self._batch and self._wake is not None:
            self._wake.set()

    async def flush(self) -> bool:
        """Write everything queued now, batch by batch; False when the store failed (the rows stay queued)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            self._log_dropped()
            if not self._opened:
                try:
                    await self._open()
                except StoreError as exc:
                    self.failures += 1
                    log.warning(
                        "usage ledger: the store %s cannot be opened (%s); %d rows queued",
                        _safe(self.store.url),
                        exc,
                        self.depth,
                    )
                    return False
            while self._queue:
                batch = list(itertools.islice(self._queue, self._batch))
                try:
                    await self.store.write(batch)
                except StoreError as exc:
                    self.failures += 1
                    self._counters.ledger_rows("retried", len(batch))
                    log.warning(
                        "usage ledger: writing %d rows failed (%s); %d rows queued", len(batch), exc, self.depth
                    )
                    return False
                queue, sizes = self._queue, self._sizes
                for _ in batch:
                    queue.popleft()
                    self._bytes -= sizes.popleft()
                self.failures = 0
                self._counters.ledger_rows("written", len(batch))
                self._counters.ledger_queue(len(self._queue))
            return True

    async def _open(self) -> None:
        await self.store.open()
        self._opened = True

    async def ready(self) -> Store:
        """The store, opened (and its schema created or migrated) once, for its other users (the issued keys);
        ``StoreError`` when it cannot be."""
        if not self._opened:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if not self._opened:
                    await self._open()
        return self.store

    def _log_dropped(self) -> None:
        if self._dropped_unlogged:
            log.error(
                "usage ledger: %d rows dropped: the queue is full (%d rows or %d MiB) and the store is not keeping up",
                self._dropped_unlogged,
                self._max,
                self._max_bytes // (1024 * 1024),
            )
            self._dropped_unlogged = 0

    def _backoff(self) -> float:
        return min(30.0, self._interval * (2 ** min(self.failures, 8))) if self.failures else self._interval

    async def run(self) -> None:
        """The background writer: a flush every interval (or when a batch is full), back-off while failing, and
        the retention prune once an hour."""
        self._wake = asyncio.Event()
        await self.flush()  # opens the store (and creates or migrates its schema) at start-up
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._backoff()):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()
            await self._prune()

    async def _prune(self) -> None:
        now = self._clock()
        if now - self._last_prune < _PRUNE_EVERY_S:
            return
        self._last_prune = now
        try:
            pruned = await self.store.prune(int(now * 1000) - self._retention_ms)
        except StoreError as exc:
            log.warning("usage ledger: pruning failed: %s", exc)
            return
        if pruned:
            log.info("usage ledger: pruned %d rows older than the retention", pruned)

    async def aclose(self, within: float = 10.0) -> None:
        """Flush what is queued (retrying for ``within`` seconds), then close the store; rows still queued are
        counted as dropped and logged."""
        deadline = time.monotonic() + within
        while not await self.flush():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await self._sleep(min(left, self._backoff()))
        if self._queue:
            self._counters.ledger_rows("dropped", len(self._queue))
            self._dropped_unlogged += len(self._queue)
            self._queue.clear()
            self._sizes.clear()
            self._bytes = 0
            self._log_dropped()
        if self._opened:
            await self.store.aclose()


_ROW_OVERHEAD = 600
"""What a queued ``LedgerRow`` holds besides its strings' characters (the Struct, its ints and floats, one str
object per field, the deque's slot): 575 bytes measured with ``tracemalloc`` (CPython 3.11, 5000 rows)."""
_STR_FIELDS = tuple(f.name for f in msgspec.structs.fields(LedgerRow) if f.type is str)
_strings = operator.attrgetter(*_STR_FIELDS)  # a row's strings, as one tuple, in C (a request's row passes here)


def row_bytes(row: LedgerRow) -> int:
    """The memory a queued row holds, near enough to bound the queue by (ASCII strings: a byte a character)."""
    return _ROW_OVERHEAD + sum(map(len, _strings(row)))


def _safe(url: str) -> str:
    """A store URL without its password, for the log."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"

"""What the usage ledger's store costs the gateway process per row, on 500-row batches (the ledger writes
batches): the chosen drivers through ``gateway.governance.store`` itself (stdlib sqlite3 in a worker thread;
asyncpg), and the alternatives on the same table and statement (aiosqlite; psycopg 3's async executemany).

    python -m bench.ledger_store          # from the repository root; PostgreSQL from Debian's package

Needs aiosqlite and psycopg[binary] for the alternatives (skipped when missing). The choice it measured is
recorded in gateway/governance/store.py and docs/design.md.
"""

from __future__ import annotations

import asyncio
import resource
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from gateway.governance.store import _SQL_COLUMNS, LedgerRow, open_store
from tests.postgres import new_database, start_postgres

BATCH, BATCHES = 500, 40
_SQLITE_INSERT = (
    f"INSERT INTO requests ({', '.join(_SQL_COLUMNS)}) VALUES ({', '.join('?' * len(_SQL_COLUMNS))}) "
    "ON CONFLICT (request_id) DO NOTHING"
)
_PSYCOPG_INSERT = _SQLITE_INSERT.replace("?", "%s")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rows(n: int, run: str) -> list[LedgerRow]:
    now = int(time.time() * 1000)
    return [
        LedgerRow(
            started_ms=now + i,
            request_id=f"req_{run}_{i}",
            upstream_request_id=f"req_up_{i}",
            key_name="key-1",
            team="team-a",
            user="alice",
            session_id="sess",
            alias="sonnet",
            provider="claude",
            model="claude-sonnet-4-5",
            stream=True,
            outcome="completed",
            status=200,
            input_tokens=1200,
            output_tokens=350,
            cache_read_input_tokens=5000,
            cost_usd=0.0123,
            ttft_ms=412.5,
            duration_ms=2001.2,
            attempts=1,
        )
        for i in range(n)
    ]


async def measure(name: str, write: Callable[[list[LedgerRow]], Awaitable[Any]]) -> None:
    batches = [rows(BATCH, f"{name}-{b}") for b in range(BATCHES)]
    cpu, wall = _cpu(), time.perf_counter()
    for batch in batches:
        await write(batch)
    n = BATCH * BATCHES
    per_cpu, per_wall = (_cpu() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6
    print(f"{name:34s} {per_cpu:6.1f} µs CPU/row {per_wall:7.1f} µs wall/row")


async def main() -> None:
    server = start_postgres()
    try:
        for _ in range(2):
            with tempfile.TemporaryDirectory() as tmp:
                store = open_store(f"sqlite:///{tmp}/ledger.db")
                await store.open()
                await measure("gateway.governance.store SQLite (sqlite3)", store.write)
                await store.aclose()
                try:
                    import aiosqlite
                except ImportError:
                    print("aiosqlite not installed: skipped")
                else:
                    async with aiosqlite.connect(f"{tmp}/ledger.db") as db:

                        async def write(batch: list[LedgerRow]) -> None:
                            await db.executemany(_SQLITE_INSERT, [msgspec.structs.astuple(r) for r in batch])
                            await db.commit()

                        await measure("aiosqlite", write)
            url = new_database(server)
            pg = open_store(url)
            await pg.open()
            await measure("gateway.governance.store PostgreSQL (asyncpg)", pg.write)
            await pg.aclose()
            try:
                import psycopg
            except ImportError:
                print("psycopg not installed: skipped")
                continue
            async with await psycopg.AsyncConnection.connect(url) as conn:

                async def write_pg(batch: list[LedgerRow]) -> None:
                    async with conn.cursor() as cur:
                        await cur.executemany(_PSYCOPG_INSERT, [msgspec.structs.astuple(r) for r in batch])
                    await conn.commit()

                await measure("psycopg 3 (async executemany)", write_pg)
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())

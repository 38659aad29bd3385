"""The ledger's stores, one suite over the three: memory (the twin), SQLite (a file) and a real PostgreSQL
server started for the session (``tests/postgres.py``)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.governance.store import (
    _SQL_COLUMNS,
    SCHEMA_VERSION,
    IssuedKey,
    LedgerRow,
    MemoryStore,
    Store,
    StoreError,
    UsageQuery,
    open_store,
)
from tests.postgres import PostgresServer, new_database

HOUR = 3_600_000
T0 = 1_764_547_200_000  # 2025-12-01T00:00:00Z


def row(i: int, **fields: Any) -> LedgerRow:
    base: dict[str, Any] = {
        "started_ms": T0 + i * 60_000,
        "request_id": f"req_{i}",
        "key_name": "ci",
        "team": "payments",
        "user": "alice",
        "alias": "sonnet",
        "provider": "claude",
        "model": "claude-sonnet-4-5",
        "outcome": "completed",
        "status": 200,
        "input_tokens": 100,
        "output_tokens": 10,
        "cache_read_input_tokens": 1,
        "cache_creation_input_tokens": 2,
        "cost_usd": 0.5,
        "duration_ms": 12.5,
        "attempts": 1,
    }
    return LedgerRow(**{**base, **fields})


def run(store: Store, work: Any) -> Any:
    async def go() -> Any:
        await store.open()
        try:
            return await work(store)
        finally:
            await store.aclose()

    return asyncio.run(go())


def test_rows_are_summed_per_bucket_and_dimension(store_url: str) -> None:
    rows = [
        row(0),
        row(1, key_name="ops", team="infra", user="bob", cost_usd=None),
        row(2, output_tokens=20),
        row(61, model="claude-haiku-4-5", cost_usd=0.25),  # the next hour
        row(200, request_id="late"),  # past the end
        row(-1, request_id="early"),  # before the start
    ]

    async def work(store: Store) -> Any:
        await store.write(rows)
        by_key = await store.totals(
            UsageQuery(start_ms=T0, end_ms=T0 + 2 * HOUR, bucket_ms=HOUR, group_by=("key_name",))
        )
        overall = await store.totals(UsageQuery(start_ms=T0, end_ms=T0 + 2 * HOUR, bucket_ms=HOUR))
        only_ops = await store.totals(
            UsageQuery(
                start_ms=T0, end_ms=T0 + 2 * HOUR, bucket_ms=HOUR, group_by=("team",), filters={"key_name": ("ops",)}
            )
        )
        by_user_model = await store.totals(
            UsageQuery(start_ms=T0, end_ms=T0 + 2 * HOUR, bucket_ms=2 * HOUR, group_by=("user", "model"))
        )
        return by_key, overall, only_ops, by_user_model

    by_key, overall, only_ops, by_user_model = run(open_store(store_url), work)
    assert [(t.bucket, t.dimensions, t.requests, t.input_tokens, t.output_tokens, t.cost_usd) for t in by_key] == [
        (0, {"key_name": "ci"}, 2, 200, 30, 1.0),
        (0, {"key_name": "ops"}, 1, 100, 10, None),  # no row of the group was priced
        (1, {"key_name": "ci"}, 1, 100, 10, 0.25),
    ]
    assert [(t.bucket, t.requests, t.cache_read_input_tokens, t.cache_creation_input_tokens) for t in overall] == [
        (0, 3, 3, 6),
        (1, 1, 1, 2),
    ]
    assert [(t.dimensions, t.requests) for t in only_ops] == [({"team": "infra"}, 1)]
    assert [(t.dimensions, t.requests) for t in by_user_model] == [
        ({"user": "alice", "model": "claude-haiku-4-5"}, 1),
        ({"user": "alice", "model": "claude-sonnet-4-5"}, 2),
        ({"user": "bob", "model": "claude-sonnet-4-5"}, 1),
    ]


def test_a_batch_written_twice_is_stored_once(store_url: str) -> None:
    """At least once, never twice: a batch retried after a failure that had in fact committed adds nothing."""

    async def work(store: Store) -> Any:
        await store.write([row(0), row(1)])
        await store.write([row(1), row(2)])
        return await store.totals(UsageQuery(start_ms=T0, end_ms=T0 + HOUR, bucket_ms=HOUR))

    (total,) = run(open_store(store_url), work)
    assert total.requests == 3 and total.input_tokens == 300


def test_prune_removes_what_is_older_than_the_retention(store_url: str) -> None:
    async def work(store: Store) -> Any:
        await store.write([row(0), row(1), row(120)])
        pruned = await store.prune(T0 + 90 * 60_000)
        left = await store.totals(UsageQuery(start_ms=T0, end_ms=T0 + 4 * HOUR, bucket_ms=4 * HOUR))
        return pruned, left

    pruned, (left,) = run(open_store(store_url), work)
    assert pruned == 2 and left.requests == 1


def test_the_schema_is_created_once_and_versioned(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    for _ in range(2):  # a restart finds the schema at its version and changes nothing
        run(open_store(url), lambda store: store.write([row(0)]))
    db = sqlite3.connect(tmp_path / "ledger.db")
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    assert db.execute("SELECT COUNT(*) FROM requests").fetchone() == (1,)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION + 1,))
    db.commit()
    with pytest.raises(StoreError, match="newer than this gateway"):
        run(open_store(url), lambda store: store.write([]))


def test_postgres_migrates_once_with_many_replicas_starting(postgres: PostgresServer | None) -> None:
    """Replicas starting together: the advisory lock lets one create the schema; the others find it done."""
    if postgres is None:
        pytest.skip("PostgreSQL is not installed")
    url = new_database(postgres)

    async def go() -> list[int]:
        stores = [open_store(url) for _ in range(4)]
        await asyncio.gather(*(s.open() for s in stores))
        await asyncio.gather(
            *(s.write([row(i, request_id=f"r{n}_{i}") for i in range(3)]) for n, s in enumerate(stores))
        )
        totals = await stores[0].totals(UsageQuery(start_ms=T0, end_ms=T0 + HOUR, bucket_ms=HOUR))
        for s in stores:
            await s.aclose()
        import asyncpg

        conn = await asyncpg.connect(url)
        versions = [r[0] for r in await conn.fetch("SELECT version FROM schema_version")]
        await conn.close()
        assert totals[0].requests == 12
        return versions

    assert asyncio.run(go()) == list(range(1, SCHEMA_VERSION + 1))


def test_an_unreachable_store_is_a_store_error() -> None:
    with pytest.raises(StoreError):
        run(open_store("postgresql://nobody@127.0.0.1:1/none"), lambda store: store.write([row(0)]))
    memory = MemoryStore()
    memory.fail = RuntimeError("down")
    with pytest.raises(StoreError):
        asyncio.run(memory.write([row(0)]))


@pytest.mark.parametrize("url", ["sqlite://", "mysql://x", "ftp://x", "sqlite:///"])
def test_store_urls_are_checked(url: str) -> None:
    with pytest.raises(ValueError):
        open_store(url)


def test_a_query_refuses_unknown_dimensions() -> None:
    with pytest.raises(ValueError):
        UsageQuery(start_ms=0, end_ms=1, bucket_ms=1, group_by=("request_id; DROP TABLE requests",))


def issued(name: str, digest: str, key_id: str | None = None, **fields: Any) -> IssuedKey:
    return IssuedKey(
        id=key_id or f"apikey_{name}", name=name, key_sha256=digest, hint="sk-gw-…abcd", created_ms=T0, **fields
    )


def test_issued_keys_are_added_listed_and_deleted_and_each_change_raises_the_version(store_url: str) -> None:
    async def work(store: Store) -> None:
        assert await store.list_keys() == [] and await store.keys_version() == 0
        alice = issued(
            "alice",
            "a" * 64,
            team="pay",
            user="alice@example.com",
            models=["sonnet"],
            limits={"requests_per_minute": 5},
            expires_ms=T0 + HOUR,
        )
        assert await store.add_key(alice)
        assert await store.add_key(issued("bob", "b" * 64))
        assert not await store.add_key(issued("alice", "c" * 64, "apikey_other"))  # the name is taken
        assert not await store.add_key(issued("carol", "a" * 64))  # so is the digest
        assert await store.keys_version() == 2
        listed = await store.list_keys()
        assert [k.name for k in listed] == ["alice", "bob"] and listed[0] == alice
        assert not await store.delete_key("alice")  # by id, not by name
        assert await store.delete_key("apikey_alice") and not await store.delete_key("apikey_alice")
        assert [k.name for k in await store.list_keys()] == ["bob"] and await store.keys_version() == 3

    run(open_store(store_url), work)


def test_a_key_is_known_by_its_id_and_its_name_may_be_issued_again_once_it_is_revoked(store_url: str) -> None:
    """Issue 31: the name is a label, unique among the stored keys; the id is unique for good and the key's row
    is deleted by it. A name revoked and issued again is a new key under a new id."""

    async def work(store: Store) -> None:
        first = issued("dev-1", "a" * 64, "apikey_01AAAA")
        assert await store.add_key(first)
        assert not await store.add_key(issued("dev-1", "b" * 64, "apikey_01BBBB"))  # the name, while it is stored
        assert not await store.add_key(issued("dev-2", "c" * 64, "apikey_01AAAA"))  # the id, always
        assert await store.delete_key("apikey_01AAAA")
        second = issued("dev-1", "b" * 64, "apikey_01BBBB")
        assert await store.add_key(second)
        assert await store.list_keys() == [second]
        assert not await store.delete_key("apikey_01AAAA") and not await store.delete_key("dev-1")
        assert await store.add_key(issued("dev-0", "d" * 64, "apikey_01ZZZZ"))
        assert [k.id for k in await store.list_keys()] == ["apikey_01BBBB", "apikey_01ZZZZ"]  # listed by id

    run(open_store(store_url), work)


def test_a_version_1_ledger_is_migrated_to_hold_keys_and_keeps_its_rows(tmp_path: Path) -> None:
    from gateway.governance import store as store_module

    db = sqlite3.connect(tmp_path / "ledger.db")
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for statement in store_module._MIGRATIONS[1]:
        db.execute(statement.format(serial="INTEGER"))
    db.execute("INSERT INTO schema_version VALUES (1)")
    db.commit()
    db.close()
    url = f"sqlite:///{tmp_path}/ledger.db"
    run(open_store(url), lambda store: store.write([row(0)]))

    async def work(store: Store) -> list[IssuedKey]:
        await store.add_key(issued("alice", "a" * 64))
        return await store.list_keys()

    assert [k.name for k in run(open_store(url), work)] == ["alice"]
    db = sqlite3.connect(tmp_path / "ledger.db")
    assert db.execute("SELECT MAX(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    assert db.execute("SELECT COUNT(*) FROM requests").fetchone() == (1,)


def test_a_query_limit_keeps_the_earliest_buckets_totals(store_url: str) -> None:
    """``limit``: the totals of the earliest buckets first, so all but the last bucket returned are whole."""
    rows = [row(i, key_name=f"k{i % 3}") for i in range(180)]  # three hours, three keys each hour

    async def work(store: Store) -> Any:
        await store.write(rows)
        query = UsageQuery(start_ms=T0, end_ms=T0 + 3 * HOUR, bucket_ms=HOUR, group_by=("key_name",), limit=4)
        return await store.totals(query)

    totals = run(open_store(store_url), work)
    assert [(t.bucket, t.dimensions["key_name"]) for t in totals] == [(0, "k0"), (0, "k1"), (0, "k2"), (1, "k0")]


def version_2_sqlite(path: Path) -> None:
    from gateway.governance import store as store_module

    db = sqlite3.connect(path)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for version in (1, 2):
        for statement in store_module._MIGRATIONS[version]:
            db.execute(statement.format(serial="INTEGER"))
        db.execute("INSERT INTO schema_version VALUES (?)", (version,))
    db.commit()
    db.close()


def test_a_version_2_ledger_gets_the_report_index_and_a_client_report_uses_it(tmp_path: Path) -> None:
    from gateway.governance.store import _totals_sql

    version_2_sqlite(tmp_path / "ledger.db")
    run(open_store(f"sqlite:///{tmp_path}/ledger.db"), lambda store: store.write([row(0)]))
    db = sqlite3.connect(tmp_path / "ledger.db")
    assert db.execute("SELECT MAX(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    query = UsageQuery(
        start_ms=T0, end_ms=T0 + HOUR, bucket_ms=HOUR, group_by=("model",), filters={"key_name": ("ci",)}
    )
    sql, params = _totals_sql(query, lambda n: "?")
    plan = " ".join(str(r[-1]) for r in db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    assert "requests_key_started" in plan, plan


def test_the_keys_poll_and_the_reports_do_not_wait_for_the_writer(tmp_path: Path) -> None:
    """The poll of the keys and a report's aggregate run on connections of their own: the writer's connection
    busy (its lock held, as a long batch or, before, a long report held it) delays neither."""

    async def work(store: Store) -> tuple[float, float]:
        await store.write([row(0)])
        held = store._lock  # type: ignore[attr-defined]
        held.acquire()
        try:
            started = time.monotonic()
            version = await asyncio.wait_for(store.keys_version(), 2)
            polled = time.monotonic() - started
            totals = await asyncio.wait_for(store.totals(UsageQuery(start_ms=T0, end_ms=T0 + HOUR, bucket_ms=HOUR)), 2)
            assert version == 0 and totals[0].requests == 1
            return polled, time.monotonic() - started
        finally:
            held.release()

    polled, reported = run(open_store(f"sqlite:///{tmp_path}/ledger.db"), work)
    assert polled < 0.5 and reported < 1.0


def test_a_keys_poll_that_takes_too_long_is_interrupted_and_the_next_one_answers(tmp_path: Path) -> None:
    """A poll still running after ``KEYS_TIMEOUT_S`` is given up (its query interrupted, a ``StoreError``: the
    poller keeps the keys last read), and the keys' connection answers the next poll at once."""
    from gateway.governance.store import KEYS_TIMEOUT_S

    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n"

    async def work(store: Any) -> tuple[float, float]:
        started = time.monotonic()
        with pytest.raises(StoreError, match="within"):
            await store._poll(lambda db: db.execute(endless).fetchone())
        given_up = time.monotonic() - started
        started = time.monotonic()
        assert await store.keys_version() == 0
        return given_up, time.monotonic() - started

    given_up, next_poll = run(open_store(f"sqlite:///{tmp_path}/ledger.db"), work)
    assert KEYS_TIMEOUT_S <= given_up < KEYS_TIMEOUT_S + 0.5 and next_poll < 0.2, (given_up, next_poll)


_V3_KEY = (
    "INSERT INTO api_keys (name, key_sha256, hint, team, user_name, models, limits, created_ms, expires_ms)"
    " VALUES ('dev-1', '{digest}', 'sk-gw-…abcd', 'pay', 'bob', '[\"sonnet\"]', '{limits}', {t0}, NULL)"
).format(digest="e" * 64, limits='{"requests_per_minute": 2}', t0=T0)


def version_3_ledger(store_url: str) -> None:
    """A ledger as a version-3 gateway left it: keys known by their names, one issued key ``dev-1`` and a row of
    its usage (``key_name`` its name)."""
    from gateway.governance import store as store_module

    statements = [
        "CREATE TABLE schema_version (version INTEGER NOT NULL)",
        *(s for v in (1, 2, 3) for s in store_module._MIGRATIONS[v]),
        "INSERT INTO schema_version VALUES (1), (2), (3)",
    ]
    values = msgspec.structs.astuple(row(0, key_name="dev-1"))
    columns = ", ".join("user_name" if c == "user" else c for c in LedgerRow.__struct_fields__)
    if store_url.startswith("sqlite:///"):
        db = sqlite3.connect(store_url[len("sqlite:///") :])
        for statement in statements:
            db.execute(statement.format(serial="INTEGER"))
        db.execute(_V3_KEY)
        db.execute(f"INSERT INTO requests ({columns}) VALUES ({', '.join('?' * len(values))})", values)
        db.commit()
        db.close()
        return

    async def postgres() -> None:
        import asyncpg

        conn = await asyncpg.connect(store_url)
        for statement in statements:
            await conn.execute(statement.format(serial="BIGSERIAL"))
        await conn.execute(_V3_KEY)
        marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
        await conn.execute(f"INSERT INTO requests ({columns}) VALUES ({marks})", *values)
        await conn.close()

    asyncio.run(postgres())


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_a_version_3_ledger_gives_its_keys_their_names_as_ids_so_their_history_stays_theirs(store_url: str) -> None:
    """Schema 4 (issue 31): a key issued before it keeps its name as its id — the ``key_name`` its ledger rows and
    its limits' counters already carry — with every other field; the name is unique among stored keys, the id
    for good, and a key issued after has an id of its own."""
    version_3_ledger(store_url)

    async def work(store: Store) -> Any:
        keys = await store.list_keys()
        refused = await store.add_key(issued("dev-1", "f" * 64, "apikey_01NEW"))  # its name is still stored
        added = await store.add_key(issued("dev-2", "f" * 64, "apikey_01NEW"))
        query = UsageQuery(start_ms=T0, end_ms=T0 + HOUR, bucket_ms=HOUR, filters={"key_name": (keys[0].id,)})
        totals = await store.totals(query)
        deleted = await store.delete_key("dev-1")
        return keys, refused, added, totals, deleted, await store.list_keys(), await store.keys_version()

    keys, refused, added, totals, deleted, after, version = run(open_store(store_url), work)
    assert keys == [
        IssuedKey(
            id="dev-1",
            name="dev-1",
            key_sha256="e" * 64,
            hint="sk-gw-…abcd",
            team="pay",
            user="bob",
            models=["sonnet"],
            limits={"requests_per_minute": 2},
            created_ms=T0,
        )
    ]
    assert not refused and added and [t.requests for t in totals] == [1] and deleted
    assert [(k.id, k.name) for k in after] == [("apikey_01NEW", "dev-2")]
    assert version == 2  # the add and the delete (the migration changed no key)
    run(open_store(store_url), lambda store: store.write([]))  # a restart finds schema 4 and changes nothing


def test_sqlite_writes_a_batch_in_statements_of_as_many_rows_as_its_parameters_allow_and_keeps_each_exactly(
    tmp_path: Path,
) -> None:
    """SQLite's writer puts many rows in one ``INSERT`` (one step, one hand-over of the GIL): with the connection's
    limit lowered to five rows' parameters, a batch of eleven rows (one of them twice, one already stored) goes in
    statements of 5, 5 and 1 rows and one of eight in 5, 2 and 1 — the most the limit allows, then powers of two, so
    few statement sizes are ever compiled — and every stored value is the one written, floats to the bit."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    store = open_store(url)
    rows = [row(i, cost_usd=0.1 * i + 1e-17 * i, duration_ms=i / 3) for i in range(18)]
    statements: list[str] = []

    async def work(store: Store) -> Any:
        await store.write([rows[0]])
        db = store._db  # type: ignore[attr-defined]
        db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 5 * len(_SQL_COLUMNS) + 3)
        db.set_trace_callback(lambda sql: statements.append(sql) if sql.startswith("INSERT") else None)
        await store.write([*rows[:10], rows[4]])
        await store.write(rows[10:])

    run(store, work)
    assert [sql.count("), (") + 1 for sql in statements] == [5, 5, 1, 5, 2, 1]
    db = sqlite3.connect(tmp_path / "ledger.db")
    stored = db.execute(f"SELECT {', '.join(_SQL_COLUMNS)} FROM requests ORDER BY started_ms").fetchall()
    db.close()
    assert stored == [msgspec.structs.astuple(r) for r in rows]

"""The usage ledger's store: one row per routed request, in SQLite (the default: an embedded file, no server),
PostgreSQL (many replicas), or memory (the unit tests' twin).

One narrow interface (``Store``): ``open`` (connect, create or migrate the schema to ``SCHEMA_VERSION``),
``write`` a batch of rows (idempotent: a row already stored, by its request id, is skipped, so a batch retried
after a failure that was in fact committed stores nothing twice), ``totals`` (token and cost sums per time
bucket and chosen dimensions, for the usage and cost reports), ``prune`` (retention) and ``aclose``; and the
keys issued at run time (``POST /v1/gateway/keys``), stored by their SHA-256 digest only: ``add_key`` (False when
the id, the name or the digest is taken), ``list_keys``, ``delete_key`` (by id) and ``keys_version`` — a number
every change of the keys raises, in the change's own transaction, so a replica polls one integer to learn that it
must read the keys again.

An issued key's ``id`` is what it is known by (issue 31): its limits' scope, the ``key_name`` of its ledger rows
(the column keeps its old name and holds the id) and the reports' ``api_key_id``; its ``name`` is a label, unique
among the stored keys (a revoked key's row is deleted, so its name may be issued again, under a new id, with
none of the old key's counters or history). Schema version 4 gives every stored key an id: a key issued before
keeps its name as its id, which is what its ledger rows and counters already carry.

Reads of the two kinds never queue behind each other or behind the writes (issue 31): the reports' aggregates
(``totals``) run on connections of their own, in a pool of threads of their own, and the poll of the keys
(``keys_version``, ``list_keys``) on one connection and thread of its own, given up after ``KEYS_TIMEOUT_S`` (the
query interrupted, a ``StoreError``: the poller keeps the keys last read and asks again at its next poll). So a
key revoked through one process reaches the others within the poll interval whatever reports they are building.
The index ``requests_key_started`` (``key_name, started_ms``: schema version 3, added to an older ledger when it is
opened) answers a client key's report, always filtered to its own key, from its own rows only.

Libraries, by measurement (``bench/ledger_store.py``, 500-row batches, CPU of the gateway process per row):
stdlib ``sqlite3`` in a worker thread 3.3 µs (aiosqlite, the same thread underneath, 3.0 µs: no reason for
the dependency); ``asyncpg`` executemany 1.7 µs against psycopg 3's async executemany 10.7 µs. Either is far
below the issue's 50 µs per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Protocol
from urllib.parse import unquote, urlsplit

import msgspec

__all__ = [
    "DIMENSIONS",
    "KEYS_TIMEOUT_S",
    "REPORT_READERS",
    "SCHEMA_VERSION",
    "IssuedKey",
    "LedgerRow",
    "MemoryStore",
    "PostgresStore",
    "SqlResult",
    "SqlStep",
    "SqlStore",
    "SqliteStore",
    "Store",
    "StoreError",
    "Totals",
    "UsageQuery",
    "open_store",
]


class StoreError(Exception):
    """The store could not be reached or refused a write (the ledger retries)."""


class LedgerRow(msgspec.Struct, frozen=True, kw_only=True):
    """One request that reached routing, whatever its outcome: attribution, route, outcome, usage, cost, timing."""

    started_ms: int  # UTC, milliseconds since the epoch
    request_id: str
    upstream_request_id: str = ""
    key_name: str = ""
    team: str = ""
    user: str = ""
    session_id: str = ""
    agent_id: str = ""
    alias: str = ""
    provider: str = ""
    model: str = ""  # the upstream model id asked for
    stream: bool = False
    outcome: str = ""
    status: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cost_usd: float | None = None  # None: no price for the model
    ttft_ms: float | None = None
    duration_ms: float = 0.0
    attempts: int = 0


class IssuedKey(msgspec.Struct, frozen=True, kw_only=True):
    """A key issued at run time, as stored: never the secret, only its SHA-256 digest (hex) and a hint. ``id``:
    immutable, what limits, the ledger and the reports know it by; ``name``: its label."""

    id: str
    name: str
    key_sha256: str
    hint: str = ""  # the secret's first and last characters, to recognise it in a list
    team: str = ""
    user: str = ""
    models: list[str] | None = None
    limits: dict[str, Any] | None = None  # the key's `limits` as given (validated by the caller)
    created_ms: int = 0
    expires_ms: int | None = None


_KEY_COLUMNS = ("id", "name", "key_sha256", "hint", "team", "user_name", "models", "limits", "created_ms", "expires_ms")


def _key_values(key: IssuedKey) -> tuple[Any, ...]:
    encode = msgspec.json.encode
    models = None if key.models is None else encode(key.models).decode()
    limits = None if key.limits is None else encode(key.limits).decode()
    return (
        key.id,
        key.name,
        key.key_sha256,
        key.hint,
        key.team,
        key.user,
        models,
        limits,
        key.created_ms,
        key.expires_ms,
    )


def _issued(record: Sequence[Any]) -> IssuedKey:
    key_id, name, digest, hint, team, user, models, limits, created, expires = record
    return IssuedKey(
        id=key_id,
        name=name,
        key_sha256=digest,
        hint=hint,
        team=team,
        user=user,
        models=None if models is None else msgspec.json.decode(models),
        limits=None if limits is None else msgspec.json.decode(limits),
        created_ms=int(created),
        expires_ms=None if expires is None else int(expires),
    )


COLUMNS: tuple[str, ...] = LedgerRow.__struct_fields__
DIMENSIONS = frozenset({"key_name", "team", "user", "session_id", "agent_id", "alias", "provider", "model", "outcome"})
"""The columns a report may group and filter by."""
_SUMS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


class UsageQuery(msgspec.Struct, frozen=True, kw_only=True):
    """Rows with ``start_ms <= started_ms < end_ms``, in buckets of ``bucket_ms`` from ``start_ms``, summed per
    ``group_by`` dimensions; ``filters``: dimension -> the values kept (any of them); ``limit``: at most that many
    totals, those of the earliest buckets (so every bucket but the last one returned is whole)."""

    start_ms: int
    end_ms: int
    bucket_ms: int
    group_by: tuple[str, ...] = ()
    filters: dict[str, tuple[str, ...]] = {}
    limit: int | None = None

    def __post_init__(self) -> None:
        for name in (*self.group_by, *self.filters):
            if name not in DIMENSIONS:
                raise ValueError(f"not a ledger dimension: {name!r}")
        if self.bucket_ms <= 0 or self.end_ms < self.start_ms:
            raise ValueError("a query needs a positive bucket width and an end after its start")
        if self.limit is not None and self.limit < 1:
            raise ValueError("a query's limit is at least 1")


class Totals(msgspec.Struct, frozen=True, kw_only=True):
    """The sums of one bucket for one combination of the grouped dimensions."""

    bucket: int  # index from the query's start
    dimensions: dict[str, str]
    requests: int
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    cost_usd: float | None  # None: no row of the group had a price


class Store(Protocol):
    url: str

    async def open(self) -> None: ...

    async def write(self, rows: Sequence[LedgerRow]) -> None: ...

    async def totals(self, query: UsageQuery) -> list[Totals]: ...

    async def prune(self, before_ms: int) -> int: ...

    async def add_key(self, key: IssuedKey) -> bool: ...

    async def list_keys(self) -> list[IssuedKey]: ...

    async def delete_key(self, key_id: str) -> bool: ...

    async def keys_version(self) -> int: ...

    async def aclose(self) -> None: ...


class SqlStore(Store, Protocol):
    """A store that runs SQL (SQLite and PostgreSQL): the other concerns that keep their state in it — sign-in
    (``gateway.governance.signin_store``), spend limits — write their own statements, with ``?`` placeholders
    (made ``$1``… for PostgreSQL), through ``sql``."""

    async def sql(self, steps: Sequence[SqlStep], *, read_only: bool = False) -> list[SqlResult]: ...


class SqlStep(NamedTuple):
    """One statement and its parameters; ``fetch``: read its rows (a SELECT, or a statement with RETURNING)."""

    statement: str
    params: Sequence[Any] = ()
    fetch: bool = False


class SqlResult(NamedTuple):
    rowcount: int
    rows: list[tuple[Any, ...]]


def _dollar_marks(statement: str) -> str:
    """``?`` placeholders as PostgreSQL's ``$1``, ``$2``… (the statements given hold no ``?`` in literals)."""
    parts = statement.split("?")
    return "".join(part + (f"${i}" if i < len(parts) else "") for i, part in enumerate(parts, start=1))


def _sorted(totals: Iterable[Totals], group_by: Sequence[str]) -> list[Totals]:
    return sorted(totals, key=lambda t: (t.bucket, *(t.dimensions[d] for d in group_by)))


class MemoryStore:
    """The twin of the SQL stores for unit tests: the same semantics over a dict."""

    url = "memory://"

    def __init__(self) -> None:
        self.rows: dict[str, LedgerRow] = {}
        self.keys: dict[str, IssuedKey] = {}  # by id
        self.version = 0
        self.fail: BaseException | None = None  # tests: the next writes raise this
        self.writes = 0

    async def open(self) -> None:
        return None

    async def write(self, rows: Sequence[LedgerRow]) -> None:
        if self.fail is not None:
            raise StoreError(str(self.fail))
        self.writes += 1
        for row in rows:
            self.rows.setdefault(row.request_id, row)

    async def totals(self, query: UsageQuery) -> list[Totals]:
        groups: dict[tuple[Any, ...], list[LedgerRow]] = {}
        for row in self.rows.values():
            if not query.start_ms <= row.started_ms < query.end_ms:
                continue
            if any(getattr(row, name) not in values for name, values in query.filters.items()):
                continue
            bucket = (row.started_ms - query.start_ms) // query.bucket_ms
            groups.setdefault((bucket, *(getattr(row, d) for d in query.group_by)), []).append(row)
        out = []
        for key, rows in groups.items():
            costs = [r.cost_usd for r in rows if r.cost_usd is not None]
            sums = {name: sum(getattr(r, name) for r in rows) for name in _SUMS}
            dimensions = dict(zip(query.group_by, key[1:], strict=True))
            cost = sum(costs) if costs else None
            out.append(Totals(bucket=key[0], dimensions=dimensions, requests=len(rows), cost_usd=cost, **sums))
        return _sorted(out, query.group_by)[: query.limit]

    async def prune(self, before_ms: int) -> int:
        old = [rid for rid, row in self.rows.items() if row.started_ms < before_ms]
        for rid in old:
            del self.rows[rid]
        return len(old)

    def _check(self) -> None:
        if self.fail is not None:
            raise StoreError(str(self.fail))

    async def add_key(self, key: IssuedKey) -> bool:
        self._check()
        if key.id in self.keys or any(k.name == key.name or k.key_sha256 == key.key_sha256 for k in self.keys.values()):
            return False
        self.keys[key.id] = key
        self.version += 1
        return True

    async def list_keys(self) -> list[IssuedKey]:
        self._check()
        return sorted(self.keys.values(), key=lambda k: k.id)

    async def delete_key(self, key_id: str) -> bool:
        self._check()
        if self.keys.pop(key_id, None) is None:
            return False
        self.version += 1
        return True

    async def keys_version(self) -> int:
        self._check()
        return self.version

    async def aclose(self) -> None:
        return None


SCHEMA_VERSION = 5

_TABLE = """CREATE TABLE requests (
    id {serial} PRIMARY KEY,
    started_ms BIGINT NOT NULL,
    request_id TEXT NOT NULL UNIQUE,
    upstream_request_id TEXT NOT NULL,
    key_name TEXT NOT NULL,
    team TEXT NOT NULL,
    user_name TEXT NOT NULL,
    session_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    alias TEXT NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    stream BOOLEAN NOT NULL,
    outcome TEXT NOT NULL,
    status INTEGER NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cache_read_input_tokens BIGINT NOT NULL,
    cache_creation_input_tokens BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION,
    ttft_ms DOUBLE PRECISION,
    duration_ms DOUBLE PRECISION NOT NULL,
    attempts INTEGER NOT NULL
)"""

_KEYS_TABLE = """CREATE TABLE api_keys (
    name TEXT PRIMARY KEY,
    key_sha256 TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    team TEXT NOT NULL,
    user_name TEXT NOT NULL,
    models TEXT,
    limits TEXT,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT
)"""

# version 4: the keys by an immutable id, the name a label (issue 31); a key issued before keeps its name as its id,
# so its ledger rows and counters stay its own. (A new table: SQLite cannot change a primary key in place.)
_KEYS_TABLE_4 = """CREATE TABLE api_keys_4 (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    key_sha256 TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    team TEXT NOT NULL,
    user_name TEXT NOT NULL,
    models TEXT,
    limits TEXT,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT
)"""
_OLD_KEY_COLUMNS = "name, key_sha256, hint, team, user_name, models, limits, created_ms, expires_ms"

# version -> the statements that bring the schema from the version before to it
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (_TABLE, "CREATE INDEX requests_started_ms ON requests (started_ms)"),
    2: (
        _KEYS_TABLE,
        "CREATE TABLE api_keys_version (version BIGINT NOT NULL)",
        "INSERT INTO api_keys_version (version) VALUES (0)",
    ),
    # a client key's report is always filtered to its key: its rows, not the whole window's (issue 31)
    3: ("CREATE INDEX IF NOT EXISTS requests_key_started ON requests (key_name, started_ms)",),
    4: (
        _KEYS_TABLE_4,
        f"INSERT INTO api_keys_4 (id, {_OLD_KEY_COLUMNS}) SELECT name, {_OLD_KEY_COLUMNS} FROM api_keys",
        "DROP TABLE api_keys",
        "ALTER TABLE api_keys_4 RENAME TO api_keys",
    ),
    # version 5: Claude Code's /login (issue 34): device codes, sessions, the bearers' signing secret, spend limits
    # set at run time, and the admin changes' audit; each concern's statements are in its own module
    5: (
        """CREATE TABLE login_devices (
            device_sha256 TEXT PRIMARY KEY,
            user_code TEXT NOT NULL UNIQUE,
            surface TEXT NOT NULL,
            client_ip TEXT NOT NULL,
            created_ms BIGINT NOT NULL,
            expires_ms BIGINT NOT NULL,
            interval_s INTEGER NOT NULL,
            polled_ms BIGINT NOT NULL,
            status TEXT NOT NULL,
            state TEXT UNIQUE,
            nonce TEXT,
            code_verifier TEXT,
            browser_sha256 TEXT,
            principal TEXT
        )""",
        "CREATE INDEX login_devices_expires ON login_devices (expires_ms)",
        """CREATE TABLE login_sessions (
            id TEXT PRIMARY KEY,
            subject TEXT NOT NULL,
            email TEXT NOT NULL,
            name TEXT NOT NULL,
            groups_json TEXT NOT NULL,
            surface TEXT NOT NULL,
            created_ms BIGINT NOT NULL,
            refreshed_ms BIGINT NOT NULL,
            ends_ms BIGINT NOT NULL,
            bearer_expires_ms BIGINT NOT NULL,
            refresh_sha256 TEXT NOT NULL UNIQUE,
            idp_refresh_token TEXT,
            revoked_ms BIGINT,
            revoked_why TEXT
        )""",
        "CREATE TABLE login_version (version BIGINT NOT NULL)",
        "INSERT INTO login_version (version) VALUES (0)",
        "CREATE TABLE login_secret (id INTEGER PRIMARY KEY, secret TEXT NOT NULL)",
        """CREATE TABLE spend_limits (
            id TEXT PRIMARY KEY,
            scope_type TEXT NOT NULL,
            scope_id TEXT NOT NULL,
            period TEXT NOT NULL,
            amount_cents BIGINT NOT NULL,
            pooled TEXT,
            created_ms BIGINT NOT NULL,
            updated_ms BIGINT NOT NULL,
            UNIQUE (scope_type, scope_id, period)
        )""",
        "CREATE TABLE spend_limits_version (version BIGINT NOT NULL)",
        "INSERT INTO spend_limits_version (version) VALUES (0)",
        """CREATE TABLE admin_audit (
            id TEXT PRIMARY KEY,
            at_ms BIGINT NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL,
            detail TEXT NOT NULL
        )""",
        "CREATE INDEX admin_audit_at ON admin_audit (at_ms)",
    ),
}

_KEY_INSERT = f"INSERT INTO api_keys ({', '.join(_KEY_COLUMNS)}) VALUES ({{marks}}) ON CONFLICT DO NOTHING"
_KEY_SELECT = f"SELECT {', '.join(_KEY_COLUMNS)} FROM api_keys ORDER BY id"
_KEY_BUMP = "UPDATE api_keys_version SET version = version + 1"  # the row lock orders concurrent changes

_SQL_COLUMNS = tuple("user_name" if c == "user" else c for c in COLUMNS)  # `user` is reserved in PostgreSQL


def _statement_rows(left: int, per: int) -> int:
    """The rows of the next ``INSERT`` of a batch with ``left`` rows to go: ``per`` (the most the connection's
    parameters allow), else the largest power of two not above ``left``. So a batch of any size is written by
    statements of a dozen sizes at most, each compiled once and kept (``sqlite3``'s statement cache, and
    ``_sqlite_insert``'s): a statement of a size never seen costs its compiling, which doubled a 1,000-row batch's
    time when every batch had a size of its own (measured: 10.4 against 5.0 µs a row)."""
    return per if left >= per else 1 << (left.bit_length() - 1)


@functools.lru_cache(maxsize=16)
def _sqlite_insert(rows: int) -> str:
    """``INSERT`` of ``rows`` ledger rows in one statement (a stored row's ``request_id`` again: nothing)."""
    marks = "(" + ", ".join("?" * len(_SQL_COLUMNS)) + ")"
    values = ", ".join([marks] * rows)
    return f"INSERT INTO requests ({', '.join(_SQL_COLUMNS)}) VALUES {values} ON CONFLICT (request_id) DO NOTHING"


def _column(name: str) -> str:
    return "user_name" if name == "user" else name


def _totals_sql(query: UsageQuery, placeholder: Callable[[int], str]) -> tuple[str, list[Any]]:
    """The one aggregate both SQL stores run (``placeholder(n)``: the driver's n-th parameter, 1-based)."""
    params: list[Any] = [query.start_ms, query.bucket_ms, query.start_ms, query.end_ms]
    where = [f"started_ms >= {placeholder(3)}", f"started_ms < {placeholder(4)}"]
    for name, values in query.filters.items():
        marks = []
        for value in values:
            params.append(value)
            marks.append(placeholder(len(params)))
        where.append(f"{_column(name)} IN ({', '.join(marks)})" if marks else "1 = 0")
    dims = [_column(d) for d in query.group_by]
    select = ", ".join(
        [
            f"(started_ms - {placeholder(1)}) / {placeholder(2)} AS bucket",
            *dims,
            "COUNT(*)",
            *(f"SUM({name})" for name in _SUMS),
            "SUM(cost_usd)",
        ]
    )
    group = ", ".join(["bucket", *dims])
    sql = f"SELECT {select} FROM requests WHERE {' AND '.join(where)} GROUP BY {group}"
    if query.limit is not None:  # the earliest buckets first: all but the last one returned are whole
        params.append(query.limit)
        sql += f" ORDER BY bucket LIMIT {placeholder(len(params))}"
    return sql, params


def _totals_of(records: Iterable[Sequence[Any]], group_by: Sequence[str]) -> list[Totals]:
    out = []
    n = len(group_by)
    for record in records:
        sums = dict(zip(_SUMS, (int(v or 0) for v in record[2 + n : 6 + n]), strict=True))
        cost = record[6 + n]
        out.append(
            Totals(
                bucket=int(record[0]),
                dimensions=dict(zip(group_by, (str(v) for v in record[1 : 1 + n]), strict=True)),
                requests=int(record[1 + n]),
                cost_usd=None if cost is None else float(cost),
                **sums,
            )
        )
    return _sorted(out, group_by)


KEYS_TIMEOUT_S = 1.0
"""How long a poll of the issued keys may take before it is given up (interrupted: a ``StoreError``)."""
REPORT_READERS = 8
"""Threads (each with its own connection) for the reports' aggregates on SQLite; the reports' own admission
(``reports.concurrency``) bounds how many run at once."""


class SqliteStore:
    """An embedded SQLite file in WAL mode with a busy timeout, so several workers of one machine share it.

    Three paths, none waiting on another (WAL: readers never wait for the writer, nor it for them), the event
    loop on none: the writes (the ledger's batches, pruning, issuing and revoking keys) on one connection and
    thread; the reports' aggregates each on a connection of its own, on ``REPORT_READERS`` threads (interrupted
    when the report is given up); the poll of the keys on one connection and thread, interrupted after
    ``KEYS_TIMEOUT_S``. (``:memory:`` has one connection for all three: another connection is another database.)"""

    def __init__(self, path: str) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._keys_db: sqlite3.Connection | None = None
        self._keys_lock = threading.Lock()
        self._shared = path == ":memory:"
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="ledger-sqlite-write")
        self._poller = ThreadPoolExecutor(1, thread_name_prefix="ledger-sqlite-keys")
        self._readers = ThreadPoolExecutor(REPORT_READERS, thread_name_prefix="ledger-sqlite-report")

    def _connect(self, *, busy_ms: int = 10_000) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=busy_ms / 1000, check_same_thread=False, isolation_level=None)
        db.execute(f"PRAGMA busy_timeout={busy_ms}")
        return db

    def _call(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._lock:
            db = self._db
            if db is None:
                raise StoreError("the store is closed")
            try:
                return work(db)
            except sqlite3.Error as exc:
                raise StoreError(f"sqlite: {exc}") from exc

    async def _write(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._call, work)

    async def open(self) -> None:
        def connect() -> sqlite3.Connection:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = self._connect()
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            return db

        try:
            self._db = await asyncio.get_running_loop().run_in_executor(self._writer, connect)
        except (sqlite3.Error, OSError) as exc:  # OSError: its directory cannot be made (a file is in the way)
            raise StoreError(f"sqlite: cannot open {self.path}: {exc}") from exc
        await self._write(_sqlite_migrate)

    async def write(self, rows: Sequence[LedgerRow]) -> None:
        """The rows in one transaction, as few multi-row ``INSERT``s as the connection's limit on parameters allows
        (1,489 rows a statement at SQLite's default of 32,766). Not ``executemany``: it steps the statement once a
        row, and ``sqlite3`` gives the GIL up around each step, so a batch of 1,000 rows hands the GIL to and from
        the event loop's thread 1,000 times while the loop is busy. Measured (``bench.run --quick --scenarios
        json-c10 --store sqlite`` against no ledger, alternating runs): +89 and +51 µs of the gateway's CPU per
        JSON request with ``executemany``; +43, +34 with one statement a batch."""
        values = [value for row in rows for value in msgspec.structs.astuple(row)]
        width = len(_SQL_COLUMNS)

        def work(db: sqlite3.Connection) -> None:
            per = max(1, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width)
            db.execute("BEGIN")
            try:
                start = 0
                while start < len(rows):
                    count = _statement_rows(len(rows) - start, per)
                    db.execute(_sqlite_insert(count), values[start * width : (start + count) * width])
                    start += count
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

        await self._write(work)

    async def totals(self, query: UsageQuery) -> list[Totals]:
        sql, params = _totals_sql(query, lambda n: "?")

        def aggregate(db: sqlite3.Connection) -> list[Totals]:
            return _totals_of(db.execute(sql, params).fetchall(), query.group_by)  # built here, off the loop

        if self._shared:
            result: list[Totals] = await self._write(aggregate)
            return result
        if self._db is None:
            raise StoreError("the store is closed")
        reading: list[sqlite3.Connection] = []

        def read() -> list[Totals]:
            try:
                db = self._connect()
                reading.append(db)
                try:
                    db.execute("PRAGMA query_only=1")
                    return aggregate(db)
                finally:
                    db.close()
            except sqlite3.Error as exc:
                raise StoreError(f"sqlite: {exc}") from exc

        try:
            totals: list[Totals] = await asyncio.get_running_loop().run_in_executor(self._readers, read)
        except asyncio.CancelledError:  # the report was given up: so is its query
            for db in reading:
                with contextlib.suppress(sqlite3.Error):  # closed already: it had finished
                    db.interrupt()
            raise
        return totals

    async def prune(self, before_ms: int) -> int:
        def work(db: sqlite3.Connection) -> int:
            return db.execute("DELETE FROM requests WHERE started_ms < ?", (before_ms,)).rowcount

        pruned: int = await self._write(work)
        return pruned

    def _changed(self, sql: str, params: tuple[Any, ...]) -> bool:
        def work(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")
            try:
                changed = db.execute(sql, params).rowcount > 0
                if changed:
                    db.execute(_KEY_BUMP)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return changed

        result: bool = self._call(work)
        return result

    async def add_key(self, key: IssuedKey) -> bool:
        sql = _KEY_INSERT.format(marks=", ".join("?" * len(_KEY_COLUMNS)))
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._changed, sql, _key_values(key))

    async def delete_key(self, key_id: str) -> bool:
        sql = "DELETE FROM api_keys WHERE id = ?"
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._changed, sql, (key_id,))

    def _keys_call(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._keys_lock:
            if self._db is None:
                raise StoreError("the store is closed")
            try:
                if self._keys_db is None:  # opened on first use, on this thread
                    self._keys_db = self._connect(busy_ms=int(KEYS_TIMEOUT_S * 1000))
                    self._keys_db.execute("PRAGMA query_only=1")
                return work(self._keys_db)
            except sqlite3.Error as exc:
                raise StoreError(f"sqlite: {exc}") from exc

    async def _poll(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """``work`` on the keys' own connection, given up (the query interrupted) after ``KEYS_TIMEOUT_S``."""
        if self._shared:
            return await self._write(work)
        future = asyncio.get_running_loop().run_in_executor(self._poller, self._keys_call, work)
        try:
            return await asyncio.wait_for(future, KEYS_TIMEOUT_S)
        except TimeoutError:
            db = self._keys_db
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.interrupt()
            raise StoreError(f"sqlite: the issued keys were not read within {KEYS_TIMEOUT_S:g} s") from None

    async def list_keys(self) -> list[IssuedKey]:
        records = await self._poll(lambda db: db.execute(_KEY_SELECT).fetchall())
        return [_issued(r) for r in records]

    async def keys_version(self) -> int:
        record = await self._poll(lambda db: db.execute("SELECT version FROM api_keys_version").fetchone())
        return int(record[0])

    async def sql(self, steps: Sequence[SqlStep], *, read_only: bool = False) -> list[SqlResult]:
        """``steps`` in one transaction: on the writes' connection, or (``read_only``) on the poll's, given up
        after ``KEYS_TIMEOUT_S`` as the keys' poll is."""

        def run(db: sqlite3.Connection) -> list[SqlResult]:
            out = []
            for step in steps:
                cursor = db.execute(step.statement, tuple(step.params))
                rows = cursor.fetchall() if step.fetch else []
                out.append(SqlResult(cursor.rowcount, rows))
            return out

        def work(db: sqlite3.Connection) -> list[SqlResult]:
            db.execute("BEGIN IMMEDIATE")
            try:
                out = run(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return out

        if read_only:
            result: list[SqlResult] = await self._poll(run)
            return result
        result = await self._write(work)
        return result

    async def aclose(self) -> None:
        def close() -> None:
            with self._keys_lock:
                if self._keys_db is not None:
                    self._keys_db.close()
                    self._keys_db = None
            with self._lock:
                if self._db is not None:
                    self._db.close()
                    self._db = None

        await asyncio.get_running_loop().run_in_executor(self._writer, close)
        for pool in (self._writer, self._poller, self._readers):
            pool.shutdown(wait=False)


def _sqlite_migrate(db: sqlite3.Connection) -> None:
    db.execute("BEGIN IMMEDIATE")  # one migrating worker at a time; the others wait (busy timeout), then see it done
    try:
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        current = db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
        _check_version(current)
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[version]:
                db.execute(statement.format(serial="INTEGER"))
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _check_version(current: int) -> None:
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"the ledger's schema is version {current}, newer than this gateway's {SCHEMA_VERSION}: upgrade the gateway"
        )


_MIGRATION_LOCK = 0x6D67_6C65  # pg_advisory_xact_lock key: one replica migrates at a time


class PostgresStore:
    """PostgreSQL through asyncpg: many replicas write to one database. Three pools, so that neither reads nor
    writes wait for a free connection behind the other kind: the writes (and the migration); the reports'
    aggregates; the poll of the keys (one connection, each call given up after ``KEYS_TIMEOUT_S``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._pool: Any = None
        self._reads: Any = None
        self._keys: Any = None

    async def open(self) -> None:
        import asyncpg

        try:
            self._pool = await asyncpg.create_pool(self.url, min_size=1, max_size=4, command_timeout=30)
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
                await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                current = await conn.fetchval("SELECT MAX(version) FROM schema_version") or 0
                _check_version(current)
                for version in range(current + 1, SCHEMA_VERSION + 1):
                    for statement in _MIGRATIONS[version]:
                        await conn.execute(statement.format(serial="BIGSERIAL"))
                    await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
            self._reads = await asyncpg.create_pool(self.url, min_size=0, max_size=4, command_timeout=120)
            self._keys = await asyncpg.create_pool(self.url, min_size=1, max_size=1, command_timeout=KEYS_TIMEOUT_S)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.aclose()
            raise StoreError(f"postgresql: {type(exc).__name__}: {exc}") from exc

    async def _run(self, work: Callable[[Any], Any], pool: Any = None, give_up_s: float | None = None) -> Any:
        import asyncpg

        pool = self._pool if pool is None else pool
        if pool is None:
            raise StoreError("the store is closed")
        try:
            async with asyncio.timeout(give_up_s), pool.acquire() as conn:
                return await work(conn)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"postgresql: {type(exc).__name__}: {exc}") from exc

    async def write(self, rows: Sequence[LedgerRow]) -> None:
        marks = ", ".join(f"${i}" for i in range(1, len(_SQL_COLUMNS) + 1))
        sql = f"INSERT INTO requests ({', '.join(_SQL_COLUMNS)}) VALUES ({marks}) ON CONFLICT (request_id) DO NOTHING"
        values = [msgspec.structs.astuple(row) for row in rows]

        async def work(conn: Any) -> None:
            async with conn.transaction():
                await conn.executemany(sql, values)

        await self._run(work)

    async def totals(self, query: UsageQuery) -> list[Totals]:
        sql, params = _totals_sql(query, lambda n: f"${n}::bigint" if n <= 4 else f"${n}")  # 1-4: the times
        records = await self._run(lambda conn: conn.fetch(sql, *params), self._reads)
        totals: list[Totals] = await asyncio.to_thread(_totals_of, records, query.group_by)  # off the loop
        return totals

    async def prune(self, before_ms: int) -> int:
        status = await self._run(lambda conn: conn.execute("DELETE FROM requests WHERE started_ms < $1", before_ms))
        return int(str(status).rsplit(" ", 1)[-1] or 0)

    async def _changed(self, sql: str, params: Sequence[Any]) -> bool:
        async def work(conn: Any) -> bool:
            async with conn.transaction():
                status = await conn.execute(sql, *params)
                changed = int(str(status).rsplit(" ", 1)[-1] or 0) > 0
                if changed:
                    await conn.execute(_KEY_BUMP)
                return changed

        result: bool = await self._run(work)
        return result

    async def add_key(self, key: IssuedKey) -> bool:
        sql = _KEY_INSERT.format(marks=", ".join(f"${i}" for i in range(1, len(_KEY_COLUMNS) + 1)))
        return await self._changed(sql, _key_values(key))

    async def list_keys(self) -> list[IssuedKey]:
        records = await self._run(lambda conn: conn.fetch(_KEY_SELECT), self._keys, KEYS_TIMEOUT_S)
        return [_issued(tuple(r)) for r in records]

    async def delete_key(self, key_id: str) -> bool:
        return await self._changed("DELETE FROM api_keys WHERE id = $1", (key_id,))

    async def keys_version(self) -> int:
        version = await self._run(
            lambda conn: conn.fetchval("SELECT version FROM api_keys_version"), self._keys, KEYS_TIMEOUT_S
        )
        return int(version)

    async def sql(self, steps: Sequence[SqlStep], *, read_only: bool = False) -> list[SqlResult]:
        """``steps`` in one transaction: on the writes' pool, or (``read_only``) on the poll's connection, given up
        after ``KEYS_TIMEOUT_S``."""

        async def work(conn: Any) -> list[SqlResult]:
            out = []
            async with conn.transaction():
                for step in steps:
                    statement = _dollar_marks(step.statement)
                    if step.fetch:
                        rows = [tuple(r) for r in await conn.fetch(statement, *step.params)]
                        out.append(SqlResult(len(rows), rows))
                    else:
                        status = await conn.execute(statement, *step.params)
                        count = str(status).rsplit(" ", 1)[-1]
                        out.append(SqlResult(int(count) if count.isdigit() else 0, []))
            return out

        if read_only:
            result: list[SqlResult] = await self._run(work, self._keys, KEYS_TIMEOUT_S)
            return result
        result = await self._run(work)
        return result

    async def aclose(self) -> None:
        pools = [p for p in (self._keys, self._reads, self._pool) if p is not None]
        self._keys = self._reads = self._pool = None
        for pool in pools:
            await pool.close()


def open_store(url: str) -> Store:
    """The store a ``store.url`` names: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``,
    ``postgresql://user:password@host:port/database`` (``postgres://`` too), or ``memory://``."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        path = unquote(url[len("sqlite:///") :]) if url.startswith("sqlite:///") else ""
        if not path:
            raise ValueError(f"store.url {url!r}: a SQLite URL names a file: sqlite:///path/to/ledger.db")
        return SqliteStore(path)
    if scheme in ("postgresql", "postgres"):
        return PostgresStore(url)
    if scheme == "memory":
        return MemoryStore()
    raise ValueError(f"store.url {url!r}: use sqlite:///…, postgresql://… or memory://")

"""Reports that hostile or heavy use cannot turn against the gateway (issue 31, item 3, and the CSV item of 5): a
ledger of 300k rows over 31 days, generated straight into a SQLite file (a version-2 schema, as a gateway of
before wrote it) before the gateway starts, so start-up must add the report index; then a client's 31-day
report, ``/healthz`` while a 155k-result CSV is built, the concurrency and per-principal rate bounds (429 with
``retry-after``), the cap on results per page, a revocation through a second process reaching the first within
2 s while 8 reports run on it, and CSV cells that cannot be formulas."""

from __future__ import annotations

import asyncio
import csv as stdlib_csv
import io
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.governance import store as store_module
from tests.conftest import run_gateway
from tests.postgres import PostgresServer, new_database

ADMIN = {"x-api-key": "sk-admin"}
CLIENT = {"x-api-key": "sk-ci"}
USAGE = "/v1/organizations/usage_report/messages"
COST = "/v1/organizations/cost_report"
DAY_MS = 86_400_000
ROWS = 300_000
SESSIONS = 5_000  # distinct sessions a day: 31 days x 5000 = 155k results grouped by session
_COLUMNS = tuple("user_name" if c == "user" else c for c in store_module.LedgerRow.__struct_fields__)


def _rows(n: int, now_ms: int, *, extra: Callable[[int], dict[str, Any]] | None = None) -> list[tuple[Any, ...]]:
    span = 30 * DAY_MS
    out = []
    for i in range(n):
        fields = {
            "started_ms": now_ms - span + i * span // n,
            "request_id": f"gen_{i}",
            "upstream_request_id": "",
            "key_name": "ci" if i % 4 == 0 else f"k{i % 40:02d}",
            "team": f"t{i % 7}",
            "user_name": f"u{i % 101}",
            "session_id": f"s{i % SESSIONS}",
            "agent_id": "",
            "alias": "sonnet",
            "provider": "claude",
            "model": "claude-sonnet-4-5" if i % 3 else "claude-haiku-4-5",
            "stream": True,
            "outcome": "completed",
            "status": 200,
            "input_tokens": 100,
            "output_tokens": 10,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cost_usd": 0.001,
            "ttft_ms": 50.0,
            "duration_ms": 120.0,
            "attempts": 1,
        }
        if extra is not None:
            fields.update(extra(i))
        out.append(tuple(fields[c] for c in _COLUMNS))
    return out


def version_2_ledger(path: Path, rows: list[tuple[Any, ...]]) -> None:
    """A ledger as a version-2 gateway left it: its schema (no report index), ``rows`` written in one go."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("BEGIN")
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for version in (1, 2):
        for statement in store_module._MIGRATIONS[version]:
            db.execute(statement.format(serial="INTEGER"))
        db.execute("INSERT INTO schema_version VALUES (?)", (version,))
    marks = ", ".join("?" * len(_COLUMNS))
    db.executemany(f"INSERT INTO requests ({', '.join(_COLUMNS)}) VALUES ({marks})", rows)
    db.execute("COMMIT")
    db.close()


@pytest.fixture(scope="module")
def big_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300k rows over the 30 whole days before today, UTC (generated once; each test copies it). Whole days: a
    report's first day bucket (``window``'s start, a midnight) holds a whole day's rows at any time of day; rows
    up to now made it hold only the minutes before midnight when run just before one (19 of 31 keys at 23:5x)."""
    path = tmp_path_factory.mktemp("ledger") / "ledger.db"
    today_ms = int(time.time() * 1000) // DAY_MS * DAY_MS
    version_2_ledger(path, _rows(ROWS, today_ms))
    return path


def copy_of(ledger: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ledger.db"
    shutil.copyfile(ledger, target)
    return target


def config(store_url: str, reports: str = "") -> str:
    return f"""
auth: {{keys: [{{name: ci, key: sk-ci}}]}}
admin: {{keys: [sk-admin]}}
store: {{url: "{store_url}", flush_interval_s: 0.05}}
{reports}
providers:
  m1: {{kind: mock, deltas: 3}}
models:
  live: {{targets: [{{provider: m1}}]}}
"""


def window() -> dict[str, str]:
    now = time.time()
    return {
        "starting_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(now - 30 * 86_400)),
        "ending_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 60)),
        "limit": "31",
    }


def test_a_client_report_over_31_days_reads_the_key_index_added_at_start_up(big_ledger: Path, tmp_path: Path) -> None:
    path = copy_of(big_ledger, tmp_path)
    with run_gateway(config(f"sqlite:///{path}")) as gw:
        started = time.monotonic()
        answer = httpx.get(f"{gw.url}{COST}", params=window(), headers=CLIENT, timeout=30)
        took = time.monotonic() - started
        assert answer.status_code == 200, answer.text
    cents = sum(float(r["amount"]) for b in answer.json()["data"] for r in b["results"])
    assert round(cents) == ROWS // 4 * 0.1  # the client's own rows only: 75k at 0.1 cent
    db = sqlite3.connect(path)
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "requests_key_started" in indexes
    client = store_module.UsageQuery(start_ms=0, end_ms=1, bucket_ms=DAY_MS, filters={"key_name": ("ci",)})
    sql, params = store_module._totals_sql(client, lambda n: "?")  # the query a client's report runs
    plan = " ".join(str(r[-1]) for r in db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    assert "requests_key_started" in plan, plan
    assert took < 1.0, f"a client's 31-day report took {took:.2f} s"


def test_an_existing_postgres_ledger_gets_the_report_index_on_start(postgres: PostgresServer | None) -> None:
    if postgres is None:
        pytest.skip("PostgreSQL is not installed")
    url = new_database(postgres)

    async def version_2(query: str | None = None) -> Any:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            if query is not None:
                return await conn.fetch(query)
            await conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for version in (1, 2):
                for statement in store_module._MIGRATIONS[version]:
                    await conn.execute(statement.format(serial="BIGSERIAL"))
                await conn.execute("INSERT INTO schema_version VALUES ($1)", version)
        finally:
            await conn.close()

    asyncio.run(version_2())
    with run_gateway(config(url)) as gw:
        assert httpx.get(f"{gw.url}{USAGE}", params=window(), headers=CLIENT).status_code == 200
    indexes = asyncio.run(version_2("SELECT indexdef FROM pg_indexes WHERE tablename = 'requests'"))
    assert any("(key_name, started_ms)" in r[0] for r in indexes), indexes


def test_healthz_answers_while_a_155k_result_csv_is_built(big_ledger: Path, tmp_path: Path) -> None:
    path = copy_of(big_ledger, tmp_path)
    reports = "reports: {max_results: 200000}"
    with run_gateway(config(f"sqlite:///{path}", reports)) as gw:
        params = {**window(), "group_by[]": "session_id", "format": "csv"}
        done = threading.Event()
        latencies: list[float] = []

        def poll() -> None:
            with httpx.Client() as client:
                while not done.is_set():
                    started = time.monotonic()
                    assert client.get(f"{gw.url}/healthz").status_code == 200
                    latencies.append(time.monotonic() - started)
                    time.sleep(0.02)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            started = time.monotonic()
            csv = httpx.get(f"{gw.url}{USAGE}", params=params, headers=ADMIN, timeout=60)
            took = time.monotonic() - started
        finally:
            done.set()
            poller.join()
    assert csv.status_code == 200, csv.text[:300]
    lines = csv.text.count("\n")
    assert lines >= 150_000, lines
    print(f"155k-result CSV: {took:.2f} s; /healthz max {max(latencies) * 1000:.0f} ms over {len(latencies)} probes")
    assert max(latencies) < 0.5, f"/healthz took {max(latencies):.2f} s during the report ({took:.2f} s)"


def test_reports_beyond_the_concurrency_or_the_rate_are_429s_with_retry_after(big_ledger: Path, tmp_path: Path) -> None:
    path = copy_of(big_ledger, tmp_path)
    reports = "reports: {concurrency: 1, queue_s: 0, per_minute: 3}"
    with run_gateway(config(f"sqlite:///{path}", reports)) as gw:
        heavy = {**window(), "group_by[]": ["api_key_id", "model"]}
        admins = [{"x-api-key": "sk-admin"}] * 3

        def report(headers: dict[str, str]) -> httpx.Response:
            return httpx.get(f"{gw.url}{USAGE}", params=heavy, headers=headers, timeout=30)

        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(report, admins))
        statuses = sorted(a.status_code for a in answers)
        assert statuses[0] == 200 and 429 in statuses, statuses
        busy = next(a for a in answers if a.status_code == 429)
        assert busy.json()["error"]["type"] == "rate_limit_error" and int(busy.headers["retry-after"]) >= 1
        small = {**window(), "limit": "1"}
        seen = [httpx.get(f"{gw.url}{USAGE}", params=small, headers=CLIENT).status_code for _ in range(4)]
        assert seen == [200, 200, 200, 429], seen  # the client's own three a minute
        refused = httpx.get(f"{gw.url}{USAGE}", params=small, headers=CLIENT)
        assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "rate_limit_error"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert httpx.get(f"{gw.url}{USAGE}", params=small, headers=ADMIN).status_code == 200  # another principal


def test_a_page_holds_at_most_max_results_and_ends_on_a_whole_bucket(big_ledger: Path, tmp_path: Path) -> None:
    path = copy_of(big_ledger, tmp_path)
    with run_gateway(config(f"sqlite:///{path}", "reports: {max_results: 70}")) as gw:
        by_key = {**window(), "group_by[]": "api_key_id"}  # 31 keys a day (ci and 30 others): two whole days a page
        first = httpx.get(f"{gw.url}{USAGE}", params=by_key, headers=ADMIN).json()
        assert first["has_more"] and len(first["data"]) == 2, [len(b["results"]) for b in first["data"]]
        assert [len(b["results"]) for b in first["data"]] == [31, 31]
        second = httpx.get(f"{gw.url}{USAGE}", params={**by_key, "page": first["next_page"]}, headers=ADMIN).json()
        assert second["data"][0]["starting_at"] == first["data"][-1]["ending_at"]
        too_wide = httpx.get(f"{gw.url}{USAGE}", params={**window(), "group_by[]": "session_id"}, headers=ADMIN)
        assert too_wide.status_code == 400, too_wide.text
        message = too_wide.json()["error"]["message"]
        assert message.startswith("group_by[]") and "max_results" in message, message


def test_a_revocation_through_another_process_is_refused_within_2_s_under_8_reports(
    big_ledger: Path, tmp_path: Path, serve: Any
) -> None:
    path = copy_of(big_ledger, tmp_path)
    conf = tmp_path / "g.yaml"
    conf.write_text(config(f"sqlite:///{path}", "reports: {concurrency: 8, per_minute: 10000}"))
    a, b = serve(conf), serve(conf)
    made = httpx.post(f"{b.url}/v1/gateway/keys", json={"name": "roaming"}, headers=ADMIN)
    assert made.status_code == 201, made.text
    key = {"x-api-key": made.json()["key"]}
    body = {"model": "live", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}

    def status_on_a() -> int:
        return httpx.post(f"{a.url}/v1/messages", json=body, headers=key, timeout=30).status_code

    deadline = time.monotonic() + 3
    while status_on_a() != 200:
        assert time.monotonic() < deadline, "process A never took the new key"
        time.sleep(0.05)
    stop = threading.Event()
    heavy = {**window(), "group_by[]": ["api_key_id", "model"]}
    finished: list[float] = []

    def reports() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                started = time.monotonic()
                assert client.get(f"{a.url}{USAGE}", params=heavy, headers=ADMIN).status_code == 200
                finished.append(time.monotonic() - started)

    with ThreadPoolExecutor(8) as pool:
        running = [pool.submit(reports) for _ in range(8)]
        try:
            time.sleep(1.0)  # the eight under way
            assert httpx.delete(f"{b.url}/v1/gateway/keys/roaming", headers=ADMIN).status_code == 200
            revoked = time.monotonic()
            while (status := status_on_a()) == 200:
                assert time.monotonic() - revoked < 2.0, "process A still takes the revoked key"
                time.sleep(0.05)
            took = time.monotonic() - revoked
        finally:
            stop.set()
        for future in running:
            future.result()
    assert status == 401
    print(f"revocation reached A in {took:.2f} s under 8 reports (each {max(finished):.2f} s at most)")
    assert took < 2.0


def test_csv_cells_are_never_formulas_and_never_hold_a_raw_newline(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    hostile = ['=HYPERLINK("http://evil","x")', "+1", "-2", "@SUM(A1)", "\tx", "\rx", "a\nb", "c\r\nd"]
    version_2_ledger(
        path,
        _rows(len(hostile), int(time.time() * 1000), extra=lambda i: {"session_id": hostile[i]}),
    )
    with run_gateway(config(f"sqlite:///{path}")) as gw:
        csv = httpx.get(
            f"{gw.url}{USAGE}", params={**window(), "group_by[]": "session_id", "format": "csv"}, headers=ADMIN
        )
    assert csv.status_code == 200, csv.text
    text = csv.text
    assert "\r" not in text and text.count("\n") == len(hostile) + 1  # a header and one line a session
    parsed = list(stdlib_csv.DictReader(io.StringIO(text)))
    cells = sorted(r["session_id"] for r in parsed)
    assert len(cells) == len(hostile)
    for cell in cells:
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
    assert "'=HYPERLINK" in text and "'+1" in text and "'-2" in text and "'@SUM(A1)" in text
    assert "a\\nb" in text and "c\\r\\nd" in text  # the line breaks escaped, as two characters

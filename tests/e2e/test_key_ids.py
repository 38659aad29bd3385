"""An issued key is known by an immutable id, its name a label (issue 31), end to end over SQLite and a real
PostgreSQL server: ``dev-1`` revoked and issued again to someone else is a new key — fresh rate-limit counters,
a client report of none of the old holder's usage, two ``api_key_id`` groups in the admin report — and a ledger a
version-3 gateway left (keys known by their names) gets ids on start, its old keys still working with their
history."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from gateway.governance import store as store_module
from gateway.governance.store import LedgerRow
from tests.conftest import RunningGateway, run_gateway
from tests.postgres import PostgresServer, new_database

ADMIN = {"x-api-key": "sk-admin"}
KW: dict[str, Any] = {"model": "live", "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}
DAY = 86_400
USAGE = "/v1/organizations/usage_report/messages"
LEGACY_SECRET = "sk-gw-issued-by-a-version-3-gateway"


def config(store_url: str) -> str:
    return f"""
admin: {{keys: [sk-admin]}}
store: {{url: "{store_url}", flush_interval_s: 0.05}}
providers:
  m1: {{kind: mock, deltas: 2}}
models:
  live: {{targets: [{{provider: m1}}]}}
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Any, postgres: PostgresServer | None) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    if postgres is None:
        pytest.skip("PostgreSQL is not installed")
    return new_database(postgres)


@pytest.fixture
def gw(store_url: str) -> Iterator[RunningGateway]:
    with run_gateway(config(store_url)) as running:
        yield running


def issue(gw: RunningGateway, name: str, **fields: Any) -> dict[str, Any]:
    made = httpx.post(f"{gw.url}/v1/gateway/keys", json={"name": name, **fields}, headers=ADMIN)
    assert made.status_code == 201, made.text
    body: dict[str, Any] = made.json()
    return body


def send(gw: RunningGateway, secret: str) -> int:
    return httpx.post(f"{gw.url}/v1/messages", json=KW, headers={"x-api-key": secret}).status_code


def by_key(gw: RunningGateway, headers: dict[str, str]) -> dict[str, int]:
    """Requests per ``api_key_id`` from yesterday to tomorrow (UTC days), as ``headers`` may read them."""
    today = int(time.time()) // DAY * DAY
    params = {
        "starting_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(today - DAY)),
        "ending_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(today + DAY)),
        "group_by[]": "api_key_id",
    }
    report = httpx.get(f"{gw.url}{USAGE}", params=params, headers=headers)
    assert report.status_code == 200, report.text
    out: dict[str, int] = {}
    for bucket in report.json()["data"]:
        for result in bucket["results"]:
            out[result["api_key_id"]] = out.get(result["api_key_id"], 0) + result["requests"]
    return out


def early_in_a_minute() -> None:
    """Wait for a minute with room for the test's requests: the counters it checks are this minute's."""
    if time.time() % 60 > 40:
        time.sleep(61 - time.time() % 60)


def test_a_name_issued_again_is_a_new_key_with_fresh_counters_and_none_of_the_old_history(
    gw: RunningGateway,
) -> None:
    early_in_a_minute()
    two = {"limits": {"requests_per_minute": 2}}
    old = issue(gw, "dev-1", **two)
    assert [send(gw, old["key"]) for _ in range(3)] == [200, 200, 429]  # the old holder used its two
    revoked = httpx.delete(f"{gw.url}/v1/gateway/keys/{old['id']}", headers=ADMIN)  # by id
    assert revoked.status_code == 200 and send(gw, old["key"]) == 401
    new = issue(gw, "dev-1", **two)  # the name is free again
    # before: both were key:dev-1, and the newcomer's first request was the old holder's third (429)
    assert [send(gw, new["key"]) for _ in range(3)] == [200, 200, 429]
    assert by_key(gw, {"x-api-key": new["key"]}) == {new["id"]: 2}  # its own usage only, none of dev-1's before
    assert by_key(gw, ADMIN) == {old["id"]: 2, new["id"]: 2}  # two keys, not one "dev-1" with four
    assert (new["name"], old["name"]) == ("dev-1", "dev-1") and new["id"] != old["id"]
    assert new["id"].startswith("apikey_") and old["id"].startswith("apikey_")
    assert revoked.json() == {"type": "api_key_deleted", "id": old["id"], "name": "dev-1"}
    listed = httpx.get(f"{gw.url}/v1/gateway/keys", headers=ADMIN).json()["data"]
    assert [(k["id"], k["name"]) for k in listed] == [(new["id"], "dev-1")]
    by_name = httpx.delete(f"{gw.url}/v1/gateway/keys/dev-1", headers=ADMIN)  # a name is taken too
    assert by_name.status_code == 200 and by_name.json()["id"] == new["id"]
    assert send(gw, new["key"]) == 401


def version_3_ledger(store_url: str, started_ms: int) -> None:
    """What a version-3 gateway left: the schema of its migrations, an issued key ``legacy`` (known by its name,
    two requests a minute) and one request of it in the ledger (``key_name`` its name)."""
    statements = [
        "CREATE TABLE schema_version (version INTEGER NOT NULL)",
        *(s for v in (1, 2, 3) for s in store_module._MIGRATIONS[v]),
        "INSERT INTO schema_version VALUES (1), (2), (3)",
    ]
    digest = hashlib.sha256(LEGACY_SECRET.encode()).hexdigest()
    key = (
        "INSERT INTO api_keys (name, key_sha256, hint, team, user_name, models, limits, created_ms, expires_ms)"
        f" VALUES ('legacy', '{digest}', 'sk-gw-iss…on-3', '', '', NULL, '{{\"requests_per_minute\": 2}}', 0, NULL)"
    )
    columns = ", ".join("user_name" if c == "user" else c for c in LedgerRow.__struct_fields__)
    row = LedgerRow(started_ms=started_ms, request_id="req_before", key_name="legacy", outcome="completed", status=200)
    values = msgspec.structs.astuple(row)
    if store_url.startswith("sqlite:///"):
        db = sqlite3.connect(store_url[len("sqlite:///") :])
        for statement in statements:
            db.execute(statement.format(serial="INTEGER"))
        db.execute(key)
        db.execute(f"INSERT INTO requests ({columns}) VALUES ({', '.join('?' * len(values))})", values)
        db.commit()
        db.close()
        return

    async def postgres() -> None:
        import asyncpg

        conn = await asyncpg.connect(store_url)
        for statement in statements:
            await conn.execute(statement.format(serial="BIGSERIAL"))
        await conn.execute(key)
        marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
        await conn.execute(f"INSERT INTO requests ({columns}) VALUES ({marks})", *values)
        await conn.close()

    asyncio.run(postgres())


def test_a_version_3_ledger_gets_ids_on_start_and_its_old_keys_keep_working_with_their_history(
    store_url: str,
) -> None:
    version_3_ledger(store_url, int(time.time() * 1000) - 1000)
    early_in_a_minute()
    with run_gateway(config(store_url)) as gw:
        listed = httpx.get(f"{gw.url}/v1/gateway/keys", headers=ADMIN)
        assert listed.status_code == 200, listed.text
        assert [(k["id"], k["name"]) for k in listed.json()["data"]] == [("legacy", "legacy")]  # its name, its id
        assert [send(gw, LEGACY_SECRET) for _ in range(3)] == [200, 200, 429]  # it works, under its own limits
        legacy = {"x-api-key": LEGACY_SECRET}
        assert by_key(gw, legacy) == {"legacy": 3}  # the row from before the upgrade, and today's two
        new = issue(gw, "fresh")
        assert new["id"].startswith("apikey_") and send(gw, new["key"]) == 200
        assert by_key(gw, ADMIN) == {"legacy": 3, new["id"]: 1}
        assert httpx.delete(f"{gw.url}/v1/gateway/keys/legacy", headers=ADMIN).status_code == 200
        assert send(gw, LEGACY_SECRET) == 401
        again = issue(gw, "legacy")  # its name issued again: a new id, none of the old history
        assert again["id"].startswith("apikey_") and send(gw, again["key"]) == 200
        assert by_key(gw, {"x-api-key": again["key"]}) == {again["id"]: 1}

"""The ledger cannot be grown by what a client chooses (issue 31, item 2): session and agent ids that are not
1-128 printable ASCII characters are dropped at the edge and counted (the request is served: clients never break
on them); a request the gateway refuses itself (429, 403) is counted and logged but is no ledger row, so a key
over its limit cannot write rows at the rate it can send; and what the ledger queues while its store is down is
bounded by bytes, with every row beyond it counted as dropped."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import access_lines, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI

KW: dict[str, Any] = {"model": "fake-text", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
UUID = "0b9c5d1e-7f3a-4c2b-9e8d-1a2b3c4d5e6f"


def config(fake: FakeClaudeAPI, db: Path, extra: str = "") -> str:
    return f"""
auth:
  keys:
    - {{name: ci, key: sk-ci, limits: {{requests_per_minute: 2}}}}
    - {{name: narrow, key: sk-narrow, models: [other-*]}}
    - {{name: free, key: sk-free}}
store: {{url: "sqlite:///{db}", flush_interval_s: 0.05{extra}}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""


def rows(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT key_name, status, session_id, agent_id FROM requests ORDER BY id").fetchall()


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        (UUID, UUID),  # what Claude Code sends
        ("x" * 128, "x" * 128),
        ("a b~!", "a b~!"),
        ("x" * 129, ""),
        ("x" * 30_000, ""),
        ("caf\u00e9", ""),  # latin-1 on the wire: not ASCII
        ("a\tb", ""),
        ("\x80\xff", ""),  # obs-text
    ],
)
def test_session_and_agent_ids_are_kept_only_when_they_are_ids(
    fake: FakeClaudeAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture, value: str, kept: str
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    db = tmp_path / "ledger.db"
    raw = value.encode("latin-1")
    with run_gateway(config(fake, db)) as gw:
        headers = {"x-api-key": "sk-free", "x-claude-code-session-id": raw, "x-claude-code-agent-id": raw}
        resp = httpx.post(f"{gw.url}/v1/messages", json=KW, headers=headers)  # type: ignore[arg-type]
        assert resp.status_code == 200  # never refused for it
        (line,) = access_lines(caplog, resp.headers["request-id"])
        assert (line["session_id"], line["agent_id"]) == (kept, kept)
        dropped = 0.0 if kept else 1.0
        for header in ("x-claude-code-session-id", "x-claude-code-agent-id"):
            assert gw.sample("gateway_client_ids_dropped_total", header=header) == dropped
        models = httpx.get(f"{gw.url}/v1/models", headers=headers)  # type: ignore[arg-type]  # another route's line
        (line,) = access_lines(caplog, models.headers["request-id"])
        assert (line["session_id"], line["agent_id"]) == (kept, kept)
    assert rows(db) == [("free", 200, kept, kept)]


def test_refused_requests_are_counted_and_logged_but_are_no_ledger_rows(
    fake: FakeClaudeAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 2-per-minute key sending 60 requests wrote 60 rows (3,494 in 10 s with a loop): now 2, the ones served."""
    caplog.set_level(logging.INFO, logger="gateway.access")
    db = tmp_path / "ledger.db"
    with run_gateway(config(fake, db)) as gw:
        if time.time() % 60 > 50:  # the whole loop inside one minute window
            time.sleep(61 - time.time() % 60)
        statuses = []
        with httpx.Client(base_url=gw.url, headers={"x-api-key": "sk-ci", "x-claude-code-session-id": UUID}) as c:
            for _ in range(60):
                statuses.append(c.post("/v1/messages", json=KW).status_code)
        assert statuses.count(200) == 2 and statuses.count(429) == 58
        narrow = httpx.post(f"{gw.url}/v1/messages", json=KW, headers={"x-api-key": "sk-narrow"})
        assert narrow.status_code == 403
        (line,) = access_lines(caplog, narrow.headers["request-id"])
        assert (line["status"], line["outcome"]) == (403, "rejected")
        assert gw.sample("gateway_limited_total", limit="requests_per_minute", scope="key") == 58
        rejected = sum(
            s.value
            for metric in gw.metrics.registry.collect()
            for s in metric.samples
            if s.name == "gateway_requests_total" and s.labels.get("outcome") == "rejected"
        )
        assert rejected == 59
    assert rows(db) == [("ci", 200, UUID, ""), ("ci", 200, UUID, "")]


def test_the_queue_of_a_stalled_store_is_bounded_by_bytes(fake: FakeClaudeAPI, tmp_path: Path) -> None:
    """The store is held locked by another connection (a stalled disk, a long migration): rows queue; past
    ``max_queue_bytes`` each further row is dropped and counted; once the store is free the queued rows are all
    written — the dropped ones are exactly what the metric says."""
    db = tmp_path / "ledger.db"
    with run_gateway(config(fake, db, ", max_queue_bytes: 8000")) as gw:
        ok = httpx.post(f"{gw.url}/v1/messages", json=KW, headers={"x-api-key": "sk-free"})
        assert ok.status_code == 200
        deadline = time.monotonic() + 10
        while gw.sample("gateway_ledger_rows_total", result="written") < 1:  # the store is open, its table made
            assert time.monotonic() < deadline
            time.sleep(0.05)
        holder = sqlite3.connect(db, timeout=0, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # every write of the gateway's now fails: "database is locked"
        try:
            with httpx.Client(base_url=gw.url, headers={"x-api-key": "sk-free", "x-claude-code-session-id": UUID}) as c:
                for _ in range(30):
                    assert c.post("/v1/messages", json=KW).status_code == 200
            dropped = gw.sample("gateway_ledger_rows_total", result="dropped")
            # 8000 bytes hold 11 rows of ~700 bytes (600 + their strings): the rest of the 30 are dropped
            assert 15 <= dropped <= 25, dropped
            assert gw.sample("gateway_ledger_queue_rows") == 30 - dropped
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        deadline = time.monotonic() + 30  # the back-off after failed writes: at most a few seconds here
        while gw.sample("gateway_ledger_rows_total", result="written") < 1 + 30 - dropped:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert len(rows(db)) == 1 + 30 - dropped

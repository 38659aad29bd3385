"""The report query parser: the Admin API's parameters, strictly (found by schemathesis: a non-ASCII cursor and a
date before 1970 were 500s, an empty format was taken for json)."""

from __future__ import annotations

import asyncio
import csv as stdlib_csv
import io
from typing import Any

import pytest

from gateway.governance.limits import RateLimited
from gateway.governance.store import LedgerRow, MemoryStore
from gateway.http.reports import ReportGate, ReportQuery, _csv, _cursor, _document, csv_cell, parse_report_query
from gateway.settings import ReportSettings
from gateway.wire.errors import InvalidRequest

NOW = 1_764_633_600_000  # 2025-12-02T00:00:00Z
DAY = 86_400_000
HOUR = 3_600_000


def parse(cost: bool = False, **params: str | list[str]) -> object:
    query = {k: v if isinstance(v, list) else [v] for k, v in params.items()}
    return parse_report_query(query, cost=cost, now_ms=NOW)


def test_buckets_are_snapped_and_the_window_ends_at_now() -> None:
    report = parse(starting_at="2025-11-28T13:45:00Z")
    assert report.query.start_ms == NOW - 4 * DAY and report.query.end_ms == NOW  # type: ignore[attr-defined]
    assert report.buckets == 4 and report.limit == 7  # type: ignore[attr-defined]
    hourly = parse(starting_at="2025-12-01", bucket_width="1h", limit="5", **{"group_by[]": ["api_key_id", "model"]})
    assert hourly.query.group_by == ("key_name", "model") and hourly.buckets == 24  # type: ignore[attr-defined]
    assert hourly.query.end_ms - hourly.query.start_ms == 5 * 3_600_000  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "params",
    [
        {},  # no starting_at
        {"starting_at": "0235-01-01T00:00:00Z"},
        {"starting_at": "3500-01-01T00:00:00Z"},
        {"starting_at": "2025-12-01T00:00:00Z", "page": "=\x83"},
        {"starting_at": "2025-12-01T00:00:00Z", "page": "page_bm9wZQ=="},
        {"starting_at": "2025-12-01T00:00:00Z", "format": ""},
        {"starting_at": "2025-12-01T00:00:00Z", "bucket_width": ""},
        {"starting_at": "2025-12-01T00:00:00Z", "ending_at": "2025-12-01T00:00:00Z"},
        {"starting_at": "2025-12-01T13:45:00Z", "ending_at": "2025-12-01T13:30:00Z"},  # before it, in its bucket
        {"starting_at": "2025-12-02T00:00:00Z"},  # ending_at defaults to now: 2025-12-02T00:00:00Z
        {"starting_at": "2025-12-03T00:00:00Z"},
        {"starting_at": "2025-12-01T00:00:00Z", "limit": "0"},
        {"starting_at": "2025-12-01T00:00:00Z", "group_by": "model"},
        {"starting_at": "2025-12-01T00:00:00Z", "unknown": "x"},
        {"starting_at": ["2025-12-01T00:00:00Z", "2025-12-01T00:00:00Z"]},
    ],
)
def test_bad_queries_are_invalid_requests(params: dict[str, str]) -> None:
    with pytest.raises(InvalidRequest):
        parse(**params)


def test_the_cost_report_takes_days_and_its_own_groups() -> None:
    with pytest.raises(InvalidRequest):
        parse(cost=True, starting_at="2025-12-01", bucket_width="1h")
    with pytest.raises(InvalidRequest):
        parse(cost=True, starting_at="2025-12-01", **{"models[]": "x"})  # no filters on the cost report
    report = parse(cost=True, starting_at="2025-11-01", **{"group_by[]": ["workspace_id", "description"]})
    assert report.query.group_by == ("team", "model")  # type: ignore[attr-defined]


MIDDAY = NOW + 13 * HOUR + 1_000  # 2025-12-02T13:00:01Z


def answer(report: ReportQuery, *rows: LedgerRow, cost: bool = False) -> dict[str, Any]:
    """The report's document over an in-memory ledger holding ``rows``."""
    store = MemoryStore()
    asyncio.run(store.write(rows))
    return _document(report, asyncio.run(store.totals(report.query)), cost=cost)


def row(started_ms: int, n: int, tokens: int = 10, cost: float = 0.01) -> LedgerRow:
    return LedgerRow(started_ms=started_ms, request_id=f"r{n}", input_tokens=tokens, cost_usd=cost)


def test_the_bucket_that_holds_the_end_is_included_partial() -> None:
    """``starting_at`` today (ending_at: now, mid-day) is a valid window of one bucket, today's so far; its
    ``ending_at`` is the day's end, but the query stops at now."""
    report = parse_report_query({"starting_at": ["2025-12-02"]}, cost=False, now_ms=MIDDAY)
    assert report.buckets == 1 and (report.query.start_ms, report.query.end_ms) == (NOW, MIDDAY)
    doc = answer(report, row(NOW + 5, 1), row(MIDDAY - 1, 2), row(NOW - 1, 3))
    assert doc["data"] == [
        {
            "starting_at": "2025-12-02T00:00:00Z",
            "ending_at": "2025-12-03T00:00:00Z",
            "results": doc["data"][0]["results"],
        }
    ]
    assert [r["requests"] for r in doc["data"][0]["results"]] == [2]  # yesterday's is not in the window
    assert not doc["has_more"] and doc["next_page"] is None
    two = parse_report_query({"starting_at": ["2025-12-01T00:00:00Z"]}, cost=False, now_ms=MIDDAY)
    doc = answer(two, row(NOW + 5, 1), row(NOW - 1, 2))
    assert two.buckets == 2 and [b["ending_at"] for b in doc["data"]] == [
        "2025-12-02T00:00:00Z",
        "2025-12-03T00:00:00Z",
    ]
    assert [[r["requests"] for r in b["results"]] for b in doc["data"]] == [[1], [1]]
    hourly = parse_report_query(
        {"starting_at": ["2025-12-02T13:00:00Z"], "bucket_width": ["1h"]}, cost=False, now_ms=MIDDAY
    )
    assert hourly.buckets == 1 and hourly.query.end_ms == MIDDAY  # the current hour, one second of it
    exact = parse_report_query({"starting_at": ["2025-12-01"], "ending_at": ["2025-12-02"]}, cost=False, now_ms=MIDDAY)
    assert exact.buckets == 1 and exact.query.end_ms == NOW  # an end on a bucket's edge adds no empty bucket


def test_rows_after_an_explicit_ending_at_are_not_counted() -> None:
    params = {"starting_at": ["2025-12-02T00:00:00Z"], "ending_at": ["2025-12-02T06:30:00Z"], "bucket_width": ["1h"]}
    report = parse_report_query(params, cost=False, now_ms=MIDDAY)
    assert report.buckets == 7 and report.query.end_ms == NOW + 6 * HOUR + HOUR // 2
    rows = [row(NOW + 6 * HOUR + 1, 1), row(NOW + 6 * HOUR + HOUR // 2 - 1, 2), row(NOW + 6 * HOUR + HOUR // 2, 3)]
    doc = answer(report, *rows, row(NOW + 7 * HOUR, 4))
    assert doc["data"][-1]["ending_at"] == "2025-12-02T07:00:00Z"  # aligned to the width
    assert [r["requests"] for r in doc["data"][-1]["results"]] == [2]  # 06:30:00 and after are not
    assert sum(len(b["results"]) for b in doc["data"]) == 1


def test_pages_end_with_the_partial_bucket() -> None:
    """Three whole days and today so far, two buckets a page: two pages, the cursor at the third day."""
    params: dict[str, list[str]] = {"starting_at": ["2025-11-29"], "limit": ["2"]}
    first = parse_report_query(params, cost=False, now_ms=MIDDAY)
    assert first.buckets == 4 and first.query.end_ms - first.query.start_ms == 2 * DAY
    rows = [row(NOW - 3 * DAY + i, i) for i in range(2)] + [row(NOW - DAY, 2), row(MIDDAY - 1, 3), row(MIDDAY, 4)]
    doc = answer(first, *rows)
    assert len(doc["data"]) == 2 and doc["has_more"] and doc["next_page"].startswith("page_")
    assert [r["requests"] for b in doc["data"] for r in b["results"]] == [2]
    second = parse_report_query({**params, "page": [doc["next_page"]]}, cost=False, now_ms=MIDDAY)
    assert second.first_bucket == 2 and (second.query.start_ms, second.query.end_ms) == (NOW - DAY, MIDDAY)
    more = answer(second, *rows)
    assert [b["starting_at"] for b in more["data"]] == ["2025-12-01T00:00:00Z", "2025-12-02T00:00:00Z"]
    assert more["data"][-1]["ending_at"] == "2025-12-03T00:00:00Z"
    assert [[r["requests"] for r in b["results"]] for b in more["data"]] == [[1], [1]]  # not the one at now
    assert not more["has_more"] and more["next_page"] is None
    past = _cursor(NOW + DAY)  # the bucket after the partial one is not in the window
    with pytest.raises(InvalidRequest):
        parse_report_query({**params, "page": [past]}, cost=False, now_ms=MIDDAY)


def test_the_cost_report_and_csv_show_today_so_far() -> None:
    report = parse_report_query({"starting_at": ["2025-12-02"]}, cost=True, now_ms=MIDDAY)
    doc = answer(report, row(NOW + 1, 1, cost=0.5), row(NOW + 2, 2, cost=0.25), row(MIDDAY, 3, cost=9.0), cost=True)
    (bucket,) = doc["data"]
    assert bucket["ending_at"] == "2025-12-03T00:00:00Z" and [r["amount"] for r in bucket["results"]] == ["75"]
    usage = parse_report_query({"starting_at": ["2025-12-02"], "format": ["csv"]}, cost=False, now_ms=MIDDAY)
    lines = _csv(answer(usage, row(NOW + 1, 1), row(MIDDAY, 2))).decode().splitlines()
    assert len(lines) == 2 and lines[1].startswith("2025-12-02T00:00:00Z,2025-12-03T00:00:00Z,10,")


def test_csv_cells_that_a_spreadsheet_would_run_are_quoted_and_hold_no_line_break() -> None:
    """Issue 31: a session id ``=HYPERLINK(…)`` or a JWT email with a raw newline reached the CSV as it came."""
    assert csv_cell('=HYPERLINK("http://evil","x")') == '\'=HYPERLINK("http://evil","x")'
    for text in ("+1", "-2", "@SUM(A1)", "\tx"):
        assert csv_cell(text) == "'" + text
    assert csv_cell("\rx") == "'\\rx" and csv_cell("a\nb") == "a\\nb" and csv_cell("c\r\nd") == "c\\r\\nd"
    assert csv_cell("alice@example.com") == "alice@example.com" and csv_cell(-3) == -3 and csv_cell(0.5) == 0.5
    report = parse_report_query(
        {"starting_at": ["2025-12-02"], "format": ["csv"], "group_by[]": ["session_id", "account_id"]},
        cost=False,
        now_ms=MIDDAY,
    )
    rows = [
        LedgerRow(started_ms=NOW + 1, request_id="a", session_id="=1+1", user="eve\n@evil"),
        LedgerRow(started_ms=NOW + 2, request_id="b", session_id="fine", user="bob"),
    ]
    store = MemoryStore()
    asyncio.run(store.write(rows))
    text = _csv(_document(report, asyncio.run(store.totals(report.query)), cost=False)).decode()
    assert "\r" not in text and text.count("\n") == 3  # the header and one line each
    cells = sorted((r["session_id"], r["account_id"]) for r in stdlib_csv.DictReader(io.StringIO(text)))
    assert cells == [("'=1+1", "eve\\n@evil"), ("fine", "bob")]


def by_hour(hours: int, groups: int, max_results: int, page: str | None = None) -> dict[str, Any]:
    """A page of an hourly report over ``hours`` hours with ``groups`` sessions an hour."""
    params = {"starting_at": ["2025-12-02T00:00:00Z"], "bucket_width": ["1h"], "group_by[]": ["session_id"]}
    if page is not None:
        params["page"] = [page]
    report = parse_report_query(params, cost=False, now_ms=NOW + hours * HOUR, max_results=max_results)
    rows = [
        LedgerRow(started_ms=NOW + h * HOUR + g, request_id=f"r{h}_{g}", session_id=f"s{g}")
        for h in range(hours)
        for g in range(groups)
    ]
    return answer(report, *rows)


def test_a_page_holds_at_most_max_results_and_ends_on_a_whole_bucket() -> None:
    first = by_hour(5, 3, max_results=7)  # 3 a bucket: two whole buckets fit, a third would make 9
    assert [len(b["results"]) for b in first["data"]] == [3, 3] and first["has_more"]
    second = by_hour(5, 3, max_results=7, page=first["next_page"])
    assert second["data"][0]["starting_at"] == "2025-12-02T02:00:00Z" == first["data"][-1]["ending_at"]
    assert [len(b["results"]) for b in second["data"]] == [3, 3]
    last = by_hour(5, 3, max_results=7, page=second["next_page"])
    assert [len(b["results"]) for b in last["data"]] == [3] and not last["has_more"]
    exact = by_hour(2, 3, max_results=6)  # exactly the cap: one page
    assert [len(b["results"]) for b in exact["data"]] == [3, 3] and not exact["has_more"]
    with pytest.raises(InvalidRequest, match=r"^group_by\[\]: .*max_results"):
        by_hour(2, 3, max_results=2)  # one bucket alone holds more


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_reports_beyond_a_principals_rate_are_429s_with_retry_after_and_refusals_are_not_counted() -> None:
    clock = Clock()
    gate = ReportGate(ReportSettings(per_minute=2, concurrency=4), clock=clock)

    async def ask(principal: str, through: ReportGate = gate) -> str:
        try:
            async with through.admit(principal, principal):
                return "ok"
        except RateLimited as exc:
            return f"429 {exc.headers['retry-after']}"

    async def go() -> list[str]:
        seen = [await ask("key:a")]
        clock.now += 20
        seen += [await ask("key:a"), await ask("key:a"), await ask("key:b")]
        clock.now += 39.5  # the first is 59.5 s old: still counted
        seen.append(await ask("key:a"))
        clock.now += 0.5
        seen.append(await ask("key:a"))  # now 60 s old: forgotten
        return seen

    assert asyncio.run(go()) == ["ok", "ok", "429 40", "ok", "429 1", "ok"]
    assert gate.reconfigured(gate.settings) is gate
    wider = gate.reconfigured(ReportSettings(per_minute=3))
    assert wider is not gate and asyncio.run(ask("key:a", wider)) == "ok"  # the third of three
    assert asyncio.run(ask("key:a", wider)) == "429 20"  # the log goes with a reload: 1020, 1060, 1060


def test_reports_beyond_the_concurrency_wait_up_to_queue_s_then_are_429s() -> None:
    async def go(queue_s: float) -> list[str]:
        gate = ReportGate(ReportSettings(concurrency=1, queue_s=queue_s, per_minute=100))
        release = asyncio.Event()
        seen: list[str] = []

        async def report(name: str, hold: bool) -> None:
            try:
                async with gate.admit(name, name):
                    seen.append(f"{name} in")
                    if hold:
                        await release.wait()
            except RateLimited as exc:
                assert "reports.concurrency" in exc.message
                seen.append(f"{name} 429 {exc.headers['retry-after']}")

        first = asyncio.create_task(report("a", True))
        await asyncio.sleep(0)
        second = asyncio.create_task(report("b", False))
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(first, second)
        return seen

    assert asyncio.run(go(0)) == ["a in", "b 429 1"]
    assert asyncio.run(go(0.02)) == ["a in", "b 429 1"]  # waited 20 ms for the slot, then refused
    assert asyncio.run(go(5)) == ["a in", "b in"]  # waited for the slot and had it

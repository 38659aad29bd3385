"""The report query parser: the Admin API's parameters, strictly (found by schemathesis: a non-ASCII cursor and a
date before 1970 were 500s, an empty format was taken for json)."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRequest
from gateway.reports import parse_report_query

NOW = 1_764_633_600_000  # 2025-12-02T00:00:00Z
DAY = 86_400_000


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

"""Usage is a fold: message_start sets it, message_delta overwrites what it reports (never adds)."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from gateway.observability.metrics import Metrics
from gateway.observability.usage import UsageTally, fold_usage
from gateway.wire.events import EventView, Usage


def view(data: dict[str, object]) -> EventView:
    return msgspec.json.decode(msgspec.json.encode(data), type=EventView)


START = view(
    {
        "type": "message_start",
        "message": {
            "id": "m",
            "usage": {
                "input_tokens": 2679,
                "output_tokens": 3,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 1200,
            },
        },
    }
)


def test_message_start_sets_usage() -> None:
    assert fold_usage(Usage(), START) == Usage(
        input_tokens=2679, output_tokens=3, cache_creation_input_tokens=0, cache_read_input_tokens=1200
    )


def test_message_delta_overwrites_present_fields_only() -> None:
    usage = fold_usage(Usage(), START)
    usage = fold_usage(usage, view({"type": "message_delta", "usage": {"output_tokens": 10}}))
    usage = fold_usage(usage, view({"type": "message_delta", "usage": {"output_tokens": 25, "input_tokens": 10682}}))
    assert usage == Usage(
        input_tokens=10682, output_tokens=25, cache_creation_input_tokens=0, cache_read_input_tokens=1200
    )


def test_not_reported_is_distinct_from_zero() -> None:
    start = view({"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}})
    usage = fold_usage(Usage(), start)
    assert usage.cache_read_input_tokens is None
    usage = fold_usage(
        usage, view({"type": "message_delta", "usage": {"output_tokens": 0, "cache_read_input_tokens": 0}})
    )
    assert usage.output_tokens == 0 and usage.cache_read_input_tokens == 0


def test_other_events_leave_usage_alone() -> None:
    usage = fold_usage(Usage(), START)
    for etype in ("content_block_start", "content_block_delta", "ping", "message_stop", "future_event"):
        assert fold_usage(usage, view({"type": etype, "usage": {"output_tokens": 99}})) == usage


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=20))
def test_cumulative_counts_end_at_the_last_value(counts: list[int]) -> None:
    usage = fold_usage(Usage(), START)
    for n in counts:
        usage = fold_usage(usage, view({"type": "message_delta", "usage": {"output_tokens": n}}))
    assert usage.output_tokens == counts[-1]


def test_tally_records_exactly_once_with_injected_clock() -> None:
    metrics = Metrics()
    times = iter([10.0, 10.5, 12.0, 99.0])
    tally = UsageTally(metrics, alias="a", provider="p", model="m", clock=lambda: next(times))
    tally.observe(START)
    tally.observe(view({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}))
    tally.observe(view({"type": "message_delta", "usage": {"output_tokens": 7}}))
    assert tally.record("completed") is True
    assert tally.record("client_cancelled") is False
    get = metrics.registry.get_sample_value
    assert get("gateway_requests_total", {"alias": "a", "provider": "p", "model": "m", "outcome": "completed"}) == 1
    assert (
        get("gateway_requests_total", {"alias": "a", "provider": "p", "model": "m", "outcome": "client_cancelled"})
        is None
    )
    assert get("gateway_tokens_total", {"alias": "a", "provider": "p", "model": "m", "type": "output"}) == 7
    assert get("gateway_tokens_total", {"alias": "a", "provider": "p", "model": "m", "type": "cache_read"}) == 1200
    assert get("gateway_time_to_first_token_seconds_sum", {"alias": "a", "provider": "p"}) == 0.5
    assert get("gateway_request_duration_seconds_sum", {"alias": "a", "provider": "p"}) == 2.0

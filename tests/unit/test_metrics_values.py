"""The metrics' lock-free values (``PlainValue``) expose the same bytes as prometheus-client's own ``MutexValue``
for the same updates, and are not used in multiprocess mode."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import values

from gateway.observability import metrics as metrics_module
from gateway.observability.metrics import Metrics, PlainValue, bump
from gateway.wire.events import Usage


def exercise(m: Metrics) -> bytes:
    for n in range(50):
        m.record_request(
            alias="sonnet",
            provider="claude" if n % 3 else "bedrock",
            model="claude-sonnet-4-6",
            outcome="completed" if n % 7 else "upstream_error",
            usage=Usage(
                input_tokens=n, output_tokens=2 * n, cache_read_input_tokens=n % 5, cache_creation_input_tokens=0
            ),
            duration=0.001 * n,
            time_to_first_token=0.0005 * n if n % 2 else None,
            cost=0.01 * n if n % 4 else None,
        )
        m.inflight.inc()
        bump(m.inflight, 1)  # the request path's own (a PlainValue's add, or the wrapper's inc)
        m.added_latency.labels("sonnet", "claude").observe(0.0003 * n)
        m.upstream_errors.labels("claude", "overloaded_error").inc()
        m.inflight.dec()
        bump(m.inflight, -1 if n % 5 else 0)
        key = ("https", "api.anthropic.com", 443)
        m.pools.idle(key, 1 if n % 2 else -1)
        if n % 3:
            m.pools.reused(key)
    m.ledger_queue(7)
    lines = m.render().decode().splitlines()
    return "\n".join(line for line in lines if "_created" not in line).encode()  # creation times differ


def test_the_same_exposition_as_prometheus_clients_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = Metrics()
    assert isinstance(plain.inflight._value, PlainValue)
    monkeypatch.setattr(values, "ValueClass", values.MutexValue)
    monkeypatch.setattr(metrics_module, "use_plain_values", lambda: None)
    mutex = Metrics()
    assert type(mutex.inflight._value) is values.MutexValue
    assert exercise(plain) == exercise(mutex)


def test_not_in_multiprocess_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setattr(values, "ValueClass", values.MutexValue)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    metrics_module.use_plain_values()
    assert values.ValueClass is values.MutexValue


_BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]
_SECONDS = st.one_of(
    st.sampled_from(_BOUNDS),  # exactly on a bound: that bucket (prometheus-client's `<=`)
    st.floats(min_value=-1.0, max_value=1000.0),
    st.sampled_from([0.0, -0.0, float("inf"), float("nan"), 1e-9, 600.0000001]),
)
_REQUEST = st.tuples(
    st.sampled_from(["claude", "bedrock", ""]),  # "" : no provider, never timed
    st.sampled_from(["completed", "upstream_error"]),
    st.lists(st.one_of(st.none(), st.integers(0, 10**12)), min_size=4, max_size=4),
    _SECONDS,
    st.one_of(st.none(), _SECONDS),
    st.booleans(),
)


def _with_mutex_values(monkeypatch: pytest.MonkeyPatch) -> Metrics:
    """Metrics whose values are prometheus-client's own: while ``monkeypatch`` lasts (the children are made
    lazily, each with the value class of the moment)."""
    monkeypatch.setattr(values, "ValueClass", values.MutexValue)
    monkeypatch.setattr(metrics_module, "use_plain_values", lambda: None)
    return Metrics()


def _render(m: Metrics) -> bytes:
    return b"\n".join(line for line in m.render().splitlines() if b"_created" not in line)


@settings(max_examples=150, deadline=None)
@given(st.lists(_REQUEST, max_size=12))
def test_the_plain_path_is_prometheus_clients_updates(requests: list[tuple[Any, ...]]) -> None:
    # record_request's own path over PlainValues against prometheus-client's counters and histograms, any values
    plain = Metrics()
    with pytest.MonkeyPatch.context() as monkeypatch:
        mutex = _with_mutex_values(monkeypatch)
    for provider, outcome, tokens, duration, ttft, timed in requests:
        usage = Usage(
            input_tokens=tokens[0],
            output_tokens=tokens[1],
            cache_read_input_tokens=tokens[2],
            cache_creation_input_tokens=tokens[3],
        )
        for m, value_class in ((plain, PlainValue), (mutex, values.MutexValue)):
            with pytest.MonkeyPatch.context() as monkeypatch:
                monkeypatch.setattr(values, "ValueClass", value_class)
                m.record_request(
                    alias="a",
                    provider=provider,
                    model="m",
                    outcome=outcome,
                    usage=usage,
                    duration=duration,
                    time_to_first_token=ttft,
                    timed=timed,
                )
    assert all(c.plain is not None for c in plain._children.values())
    assert all(c.plain is None for c in mutex._children.values())
    assert _render(plain) == _render(mutex)


def test_a_negative_count_is_refused_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = Metrics()
    plain.record_request(
        alias="a", provider="p", model="m", outcome="completed", usage=Usage(), duration=0.1, time_to_first_token=None
    )  # (its children made with PlainValues)
    for m in (plain, _with_mutex_values(monkeypatch)):
        with pytest.raises(ValueError, match="non-negative"):
            m.record_request(
                alias="a",
                provider="p",
                model="m",
                outcome="completed",
                usage=Usage(input_tokens=-1),
                duration=0.1,
                time_to_first_token=None,
            )

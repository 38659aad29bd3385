"""The compiled GenAI histogram series (``_otlp_c.Histogram``) against ``genai_metrics.Series``, its reference:
the same buckets, sum, min and max for any bounds and values Hypothesis draws (ints past 2**53 included), the
same errors; and the GenAI metrics collected alike whichever of the two holds the series."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.observability import genai_metrics
from gateway.observability._otlp_c import Histogram
from gateway.observability.genai_metrics import (
    CLIENT_DURATION,
    INSTRUMENTS,
    TOKEN_USAGE,
    GenAiMetrics,
    Series,
)
from gateway.observability.otlp_proto import encode_metrics

EXACT = 2**53  # a bound lies strictly within (-2**53, 2**53): a double exactly (the convention's are far below)
bound = st.one_of(st.integers(-EXACT + 1, EXACT - 1), st.floats(-1e15, 1e15, allow_nan=False))
value = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 4, 16, 1024, 67108864, 0.01, 0.32, 81.92, 2**53 + 1, -(2**53) - 1]),
)


def _bounds(drawn: list[float]) -> tuple[float, ...]:
    ordered: list[float] = []
    for b in sorted(set(drawn)):
        if not ordered or ordered[-1] < b:  # strictly increasing (1 and 1.0 are one bound)
            ordered.append(b)
    return tuple(ordered)


def _same(python: Series, compiled: Histogram) -> None:
    assert compiled.counts == python.counts
    assert compiled.sum == python.sum or (math.isnan(compiled.sum) and math.isnan(python.sum))
    assert compiled.min == float(python.min) and compiled.max == float(python.max)


@settings(max_examples=1500, deadline=None)
@given(st.lists(bound, max_size=20), st.lists(value, max_size=60), st.integers(0, 2**62))
def test_the_compiled_series_records_what_the_reference_records(
    drawn: list[float], values: list[float], start: int
) -> None:
    bounds = _bounds(drawn)
    python, compiled = Series(bounds, start), Histogram(bounds, start)
    assert compiled.bounds is bounds and compiled.start_ns == start
    for v in values:
        try:
            python.add(v)
        except OverflowError:  # an int too large for a double: its sum fails alike (the bucket was counted first)
            with pytest.raises(OverflowError):
                compiled.add(v)
            return
        compiled.add(v)
        _same(python, compiled)


def test_what_is_not_a_number_is_refused_alike() -> None:
    python, compiled = Series((1, 2), 0), Histogram((1, 2), 0)
    for wrong in ("3", None, b"1", [1]):
        with pytest.raises(TypeError):
            python.add(wrong)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            compiled.add(wrong)  # type: ignore[arg-type]
    _same(python, compiled)
    with pytest.raises(ValueError, match="increase"):
        Histogram((2, 1), 0)
    for outside in (2**53, -(2**53), float("inf"), float("nan")):  # where a double is no longer every int
        with pytest.raises(ValueError, match="2\\*\\*53"):
            Histogram((0, outside), 0)
    with pytest.raises(TypeError):
        Histogram([1, 2], 0)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([TOKEN_USAGE, CLIENT_DURATION]),
            st.sampled_from(["m1", "m2", "m3"]),
            st.one_of(st.integers(0, 2**40), st.floats(0, 1e6, allow_nan=False)),
        ),
        max_size=80,
    )
)
def test_the_metrics_collected_are_the_same_bytes_either_way(records: list[tuple[int, str, float]]) -> None:
    assert GenAiMetrics()._make is Histogram and genai_metrics.COMPILED is Histogram  # the default, when built
    # each series' start: the same on both sides
    python = GenAiMetrics(max_series=4, make=lambda bounds, _: Series(bounds, 5))
    compiled = GenAiMetrics(max_series=4, make=lambda bounds, _: Histogram(bounds, 5))
    for instrument, model, v in records:
        for metrics in (python, compiled):
            metrics.series(instrument, (("gen_ai.request.model", model),)).add(v)
    assert python.overflow == compiled.overflow

    def encoded(metrics: GenAiMetrics) -> bytes:
        return encode_metrics({"service.name": "t"}, "s", "1", metrics.collect(now_ns=7))

    assert encoded(compiled) == encoded(python)
    assert {h.name for h in compiled.collect(now_ns=7)} <= {i.name for i in INSTRUMENTS}

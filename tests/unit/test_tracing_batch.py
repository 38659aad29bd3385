"""A batch of finished requests recorded in C (``_otlp_c.record``) and in Python (``tracing._record_batch_py``, the
reference and the fallback): for any batch Hypothesis draws — records and traces as tests/unit/test_tracing_spans.py
draws them, sampled or not, capturing content or not, token counts or messages, routed or not, with and without
traces and metrics — the same spans, the same GenAI metrics (as OTLP bytes) and the same error at the same place.

Skipped when the extension was not built, unless MESSAGES_GATEWAY_REQUIRE_EXTENSION is set: then they fail."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.observability import tracing
from gateway.observability.genai_metrics import GenAiMetrics, Series
from gateway.observability.otlp_proto import encode_metrics
from gateway.observability.recording import Finished
from gateway.observability.tracing import GEN_AI_PROVIDERS, RequestTrace, _record_batch_py, _request_spans_py, _server
from gateway.wire.events import Usage
from tests.unit.test_tracing import finished
from tests.unit.test_tracing_spans import REQUIRE_EXTENSION, C, ns, seconds, traced

pytestmark = pytest.mark.skipif(
    C is None and not REQUIRE_EXTENSION, reason="gateway.observability._otlp_c is not built: nothing to compare"
)


@st.composite
def items(draw: st.DrawFn) -> tuple[Finished, RequestTrace, int]:
    f, trace = draw(traced())
    trace.capture = draw(st.booleans())
    f = msgspec.structs.replace(
        f,
        timed=draw(st.booleans()),
        routed=draw(st.booleans()),
        duration=draw(st.one_of(st.floats(0, 600, allow_nan=False), st.integers(0, 600))),
    )
    return f, trace, draw(ns)


class Side:
    """One side of the comparison: its GenAI metrics (Python series or compiled ones, each started at 5), its
    series caches and what fills them (as ``Tracer._client_for`` and ``_server_for`` do), and its spans."""

    def __init__(self, make: Any, metrics: bool) -> None:
        self.genai = GenAiMetrics(make=lambda bounds, _: make(bounds, 5))
        self.client: dict[Any, Any] = {}
        self.server: dict[Any, Any] = {}
        self.spans: list[bytes] = []
        self.hooks = (self.client, self.server, self._client_for, self._server_for) if metrics else None

    def _client_for(self, facts: Any) -> Any:
        series = self.client[facts] = tracing._client_series(self.genai, facts)
        return series

    def _server_for(self, facts: Any) -> Any:
        series = self.server[facts] = tracing._server_series(self.genai, facts)
        return series

    def run(self, record: Any, pending: list[Any], traces: bool) -> str:
        """The error's type when the batch fails ("" when it does not)."""
        try:
            record(pending, traces, GEN_AI_PROVIDERS, _server, self.spans, _request_spans_py, self.hooks)
        except (TypeError, ValueError, OverflowError, AttributeError) as exc:
            return type(exc).__name__
        return ""

    def metrics(self) -> bytes:
        return encode_metrics({"service.name": "t"}, "s", "1", self.genai.collect(now_ns=7))


def compare(pending: list[Any], traces: bool, metrics: bool) -> tuple[Side, Side]:
    python, compiled = Side(Series, metrics), Side(C.Histogram, metrics)
    assert python.run(_record_batch_py, pending, traces) == compiled.run(C.record, pending, traces)
    assert compiled.spans == python.spans
    assert compiled.metrics() == python.metrics()
    assert compiled.client.keys() == python.client.keys() and compiled.server.keys() == python.server.keys()
    return python, compiled


@settings(max_examples=800, deadline=None)
@given(st.lists(items(), max_size=6), st.booleans(), st.booleans())
def test_the_compiled_batch_records_what_the_reference_records(
    pending: list[tuple[Finished, RequestTrace, int]], traces: bool, metrics: bool
) -> None:
    compare(pending, traces, metrics)


def test_the_tracer_records_its_batches_in_c() -> None:
    assert tracing._record_batch is C.record


@settings(max_examples=100, deadline=None)
@given(st.lists(items(), min_size=1, max_size=4), seconds)
def test_a_batch_that_fails_fails_alike_where_it_fails(pending: list[Any], ttft: float | None) -> None:
    """A token sum past int64 (the spans' ValueError, after that request's metrics were recorded), a duration that
    is not a number (the histogram's TypeError): the requests before it recorded, the rest not, on both sides."""
    f, trace, end_ns = pending[-1]
    trace.flags |= 1
    trace.attempts = trace.attempts or [tracing.AttemptSpan(b"a" * 8, "up", "anthropic", "m")]
    trace.attempts[-1].error_type = ""
    huge = Usage(input_tokens=2**63 - 1, output_tokens=1, cache_read_input_tokens=1)
    outcome = "completed"
    pending[-1] = (msgspec.structs.replace(f, usage=huge, outcome=outcome, ttft=ttft, timed=True), trace, end_ns)
    python, _ = compare(pending, True, True)
    assert python.run(_record_batch_py, pending, True) == "ValueError"
    pending[-1] = (msgspec.structs.replace(f, duration="1", routed=True, timed=True), trace, end_ns)
    python, _ = compare(pending, False, True)
    assert python.run(_record_batch_py, pending, False) == "TypeError"


def test_a_trace_that_captures_content_is_written_by_the_python_builder() -> None:
    seen: list[Any] = []
    trace = RequestTrace(b"t" * 16, b"", 1, "", b"s" * 8, capture=True)
    trace.attempts = [tracing.AttemptSpan(b"a" * 8, "up", "anthropic", "m")]
    f = finished(trace)

    def build(*args: Any) -> None:
        seen.append(args)
        _request_spans_py(*args)

    spans: list[bytes] = []
    C.record([(f, trace, 9)], True, GEN_AI_PROVIDERS, _server, spans, build, None)
    assert len(seen) == 1 and seen[0][:3] == (f, trace, 9) and len(spans) == 2
    assert seen[0][3:7] == ("chat", "anthropic", "", True)

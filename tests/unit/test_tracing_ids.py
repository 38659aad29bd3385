"""A request's path when traced, in C and in Python (the references): a new trace and an attempt
(``_otlp_c.new_trace``, ``_otlp_c.attempt``; ``tracing._new_trace_py``, ``RequestTrace.attempt``) from the same
draws of ``random`` (seeded alike) — the same ids, flags, sampling, capture and ``traceparent`` for any bound
Hypothesis draws, a span id of zeros made 1 on both, a forked child's ids not its parent's; the request's model and
parameters noted (``_otlp_c.request``, ``tracing._note_request_py``) for any head; and a finished request set aside
(``_otlp_c.set_aside``, ``tracing._set_aside_py``).

Skipped when the extension was not built, unless MESSAGES_GATEWAY_REQUIRE_EXTENSION is set: then they fail."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.observability import tracing
from gateway.observability.tracing import (
    AttemptSpan,
    RequestTrace,
    _new_trace_py,
    _note_request_py,
    _set_aside_py,
    parse_traceparent,
)
from gateway.wire.request import MessagesHead
from tests.unit.test_tracing import finished
from tests.unit.test_tracing_spans import REQUIRE_EXTENSION, C

pytestmark = pytest.mark.skipif(
    C is None and not REQUIRE_EXTENSION, reason="gateway.observability._otlp_c is not built: nothing to compare"
)

bounds = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1, 2**64, 2**64 + 1, -1]),
)


def _fields(trace: RequestTrace) -> tuple[object, ...]:
    return (trace.trace_id, trace.parent_id, trace.flags, trace.trace_state, trace.span_id, trace.capture)


@settings(max_examples=1000, deadline=None)
@given(bounds, st.booleans(), st.integers(0, 2**32), st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8))))
def test_the_compiled_trace_and_attempts_are_the_reference_ones(
    bound: int, capture: bool, seed: int, attempts: list[tuple[str, str]]
) -> None:
    random.seed(seed)
    python = _new_trace_py(bound, capture)
    made = [RequestTrace.attempt(python, provider, "anthropic", model) for provider, model in attempts]
    random.seed(seed)
    compiled = C.new_trace(bound, capture)
    same = [C.attempt(compiled, provider, "anthropic", model) for provider, model in attempts]
    assert type(compiled) is RequestTrace and _fields(compiled) == _fields(python)
    assert compiled.sampled == (bound >= 2**64 or int.from_bytes(python.trace_id[8:], "big") < bound)
    assert compiled.attempts == same and len(same) == len(made)
    for a, b in zip(made, same, strict=True):
        assert type(b) is AttemptSpan
        assert (a.span_id, a.provider, a.provider_kind, a.model, a.traceparent) == (
            b.span_id,
            b.provider,
            b.provider_kind,
            b.model,
            b.traceparent,
        )
        assert b.traceparent == compiled.traceparent(b)
        assert parse_traceparent(b.traceparent) == (compiled.trace_id, b.span_id, compiled.flags)


class _Zeros:
    """``getrandbits`` whose next draw is all zeros."""

    def __call__(self, bits: int) -> int:
        return 0


def test_a_span_id_of_zeros_is_made_one_alike() -> None:
    zeros = _Zeros()
    old = tracing._getrandbits
    try:
        tracing._getrandbits = zeros
        python = _new_trace_py(2**64, False)
        C.bind(RequestTrace, AttemptSpan, zeros)
        compiled = C.new_trace(2**64, False)
        assert python.span_id == compiled.span_id == bytes(7) + b"\x01"
        assert C.attempt(compiled, "p", "anthropic", "m").span_id == bytes(7) + b"\x01"
        assert RequestTrace.attempt(python, "p", "anthropic", "m").span_id == bytes(7) + b"\x01"
    finally:
        tracing._getrandbits = old
        C.bind(RequestTrace, AttemptSpan, old)


class _Draws:
    """``getrandbits`` that answers the given ints, one a call, whatever it is asked."""

    def __init__(self, values: list[int]) -> None:
        self.values = list(values)

    def __call__(self, bits: int) -> int:
        return self.values.pop(0)


def _made(new_trace: Any, attempt: Any, draws: _Draws) -> tuple[object, ...] | str:
    try:
        trace = new_trace(2**64, False)
        return (*_fields(trace), attempt(trace, "p", "anthropic", "m").span_id)
    except OverflowError as exc:
        return f"OverflowError: {exc}"


draw = st.one_of(
    st.integers(0, 2**192 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**32),
    st.sampled_from([0, 1, 2**30 - 1, 2**30, 2**60, 2**64 - 1, 2**64, 2**192 - 1, 2**192, -1, -(2**70)]),
    st.integers(-(2**200), 2**200),
)


@settings(max_examples=2000, deadline=None)
@given(draw, draw)
def test_the_ids_are_the_draws_bytes_alike(trace_bits: int, attempt_bits: int) -> None:
    """Whatever ``getrandbits`` answers — any size of int, too large, negative — the compiled trace and attempt
    take its bytes as ``int.to_bytes(n, "big")`` does, or refuse it with the same OverflowError."""
    old = tracing._getrandbits
    try:
        tracing._getrandbits = _Draws([trace_bits, attempt_bits])
        python = _made(_new_trace_py, RequestTrace.attempt, tracing._getrandbits)
        compiled_draws = _Draws([trace_bits, attempt_bits])
        C.bind(RequestTrace, AttemptSpan, compiled_draws)
        compiled = _made(C.new_trace, C.attempt, compiled_draws)
    finally:
        tracing._getrandbits = old
        C.bind(RequestTrace, AttemptSpan, old)
    assert compiled == python
    if 0 <= trace_bits < 2**192 and 0 <= attempt_bits < 2**64:
        assert isinstance(compiled, tuple)
        drawn = trace_bits.to_bytes(24, "big")
        assert compiled[0] == drawn[:16] and compiled[4] == (drawn[16:] if any(drawn[16:]) else bytes(7) + b"\x01")
        assert compiled[-1] == (attempt_bits or 1).to_bytes(8, "big")


def test_what_cannot_be_made_is_refused() -> None:
    with pytest.raises(TypeError):
        C.new_trace(1.0, False)
    trace = C.new_trace(2**64, False)
    trace.trace_id = b"short"
    with pytest.raises(ValueError, match="16 bytes"):
        C.attempt(trace, "p", "anthropic", "m")
    assert trace.attempts == []


def test_the_tracer_makes_traces_and_attempts_in_c_and_a_forked_child_draws_its_own() -> None:
    assert tracing._new_trace is C.new_trace and tracing.new_attempt is C.attempt
    assert tracing.note_request is C.request and tracing.set_aside is C.set_aside
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first trace id, to the parent
        os.write(write, C.new_trace(2**64, False).trace_id)
        os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.waitpid(pid, 0)
    os.close(read)
    assert len(child) == 16 and child != C.new_trace(2**64, False).trace_id


numbers = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**1100), 2**1100),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)
stops = st.one_of(
    st.none(),
    st.lists(st.text(max_size=4), max_size=3),
    st.lists(st.one_of(st.text(max_size=2), st.integers()), max_size=3),
    st.tuples(st.text(max_size=2)),
    st.text(max_size=3),
)


@settings(max_examples=1000, deadline=None)
@given(
    st.one_of(st.none(), st.integers(1, 2**70)),
    numbers,
    numbers,
    numbers,
    stops,
    st.text(max_size=10),
    st.booleans(),
)
def test_the_compiled_request_notes_what_the_reference_notes(
    max_tokens: int | None, temperature: object, top_p: object, top_k: object, stop: object, model: str, capture: bool
) -> None:
    head = (
        None
        if max_tokens is None
        else MessagesHead(
            model="m",
            max_tokens=max_tokens,
            messages=[],
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_sequences=stop,
        )
    )
    python = RequestTrace(b"t" * 16, b"", 1, "", b"s" * 8, capture=capture)
    compiled = RequestTrace(b"t" * 16, b"", 1, "", b"s" * 8, capture=capture)

    def note(build: object, trace: RequestTrace) -> object:
        try:
            return build(trace, model, head)  # type: ignore[operator]
        except OverflowError:  # an int too large for a double: refused alike
            return OverflowError

    assert note(_note_request_py, python) == note(C.request, compiled)
    assert (compiled.request_model, compiled.params) == (python.request_model, python.params)
    assert [type(v) for v in compiled.params] == [type(v) for v in python.params]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.integers(0, 255)), st.booleans(), st.booleans(), st.integers(0, 3))
def test_the_compiled_set_aside_is_the_reference_one(
    flags: int | None, metrics: bool, traces: bool, already: int
) -> None:
    trace = None if flags is None else RequestTrace(b"t" * 16, b"", flags, "", b"s" * 8)
    f = finished(trace)  # type: ignore[arg-type]
    python: list[Any] = [None] * already
    compiled: list[Any] = [None] * already
    before = time.time_ns()
    assert _set_aside_py(python, f, metrics, traces) == C.set_aside(compiled, f, metrics, traces)
    after = time.time_ns()
    assert len(compiled) == len(python)
    if len(compiled) > already:
        (f1, t1, end1), (f2, t2, end2) = python[-1], compiled[-1]
        assert f1 is f2 is f and t1 is t2 is trace and before <= end1 <= after and before <= end2 <= after

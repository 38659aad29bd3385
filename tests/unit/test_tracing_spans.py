"""A traced request's spans, compiled (``_otlp_c.request_spans``) and in Python (``tracing._request_spans_py``, the
reference, and the path of a trace that captures content): the same bytes for any record, trace and attempts
Hypothesis draws — every optional attribute present or not, failovers, failed and cancelled attempts, a caller's
parent — and the same errors for what OTLP cannot carry. The bytes themselves are checked against the
``opentelemetry-proto`` messages by tests/unit/test_otlp_collector.py (through the compiled path, when built).

Skipped when the extension was not built, unless MESSAGES_GATEWAY_REQUIRE_EXTENSION is set: then they fail."""

from __future__ import annotations

import importlib
import os
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gateway.observability import tracing
from gateway.observability.recording import Finished
from gateway.observability.tracing import GEN_AI_PROVIDERS, AttemptSpan, RequestTrace, _request_spans_py, _server
from gateway.wire.events import Usage
from tests.unit.test_tracing import finished


def _compiled() -> Any:
    try:
        return importlib.import_module("gateway.observability._otlp_c")
    except ImportError:
        return None


C = _compiled()
REQUIRE_EXTENSION = bool(os.environ.get("MESSAGES_GATEWAY_REQUIRE_EXTENSION"))
pytestmark = pytest.mark.skipif(
    C is None and not REQUIRE_EXTENSION, reason="gateway.observability._otlp_c is not built: nothing to compare"
)

text = st.text(max_size=12)
maybe_text = st.one_of(st.just(""), text)
tokens = st.one_of(st.none(), st.integers(0, 2**40))
seconds = st.one_of(st.none(), st.floats(0, 600, allow_nan=False), st.integers(0, 600))
ns = st.integers(1, 2**63 - 1)
params = st.tuples(
    st.one_of(st.none(), st.integers(1, 2**31)),
    st.one_of(st.none(), st.floats(0, 1)),
    st.one_of(st.none(), st.floats(0, 1)),
    st.one_of(st.none(), st.floats(0, 500)),
    st.one_of(st.none(), st.just(()), st.lists(text, max_size=3).map(tuple)),
)
kinds = st.sampled_from([*GEN_AI_PROVIDERS, "unknown"])
urls = st.sampled_from(["", "https://api.anthropic.com/v1/messages", "http://127.0.0.1:9000/v1/messages", "http://h"])


@st.composite
def attempts(draw: st.DrawFn) -> AttemptSpan:
    span = AttemptSpan(draw(st.binary(min_size=8, max_size=8)), draw(text), draw(kinds), draw(text))
    span.start_ns = draw(ns)
    span.url = draw(urls)
    if draw(st.booleans()):
        span.end_ns = draw(ns)
        span.error_type = draw(st.sampled_from(["overloaded_error", "api_error", "timeout", "x"]))
        span.status = draw(st.sampled_from([0, 429, 500, 529]))
    return span


@st.composite
def traced(draw: st.DrawFn) -> tuple[Finished, RequestTrace]:
    parent = draw(st.one_of(st.just(b""), st.binary(min_size=8, max_size=8)))
    trace = RequestTrace(
        draw(st.binary(min_size=16, max_size=16)),
        parent,
        draw(st.integers(0, 255)),
        draw(maybe_text),
        draw(st.binary(min_size=8, max_size=8)),
    )
    trace.start_ns = draw(ns)
    trace.route = draw(st.sampled_from(["", "/v1/messages", "/model/{modelId}/invoke-with-response-stream"]))
    trace.request_model = draw(maybe_text)
    trace.params = draw(params)
    trace.attempts = draw(st.lists(attempts(), max_size=3))
    trace.error_type = draw(maybe_text)
    usage = Usage(
        input_tokens=draw(tokens),
        output_tokens=draw(tokens),
        cache_read_input_tokens=draw(tokens),
        cache_creation_input_tokens=draw(tokens),
    )
    f = Finished(
        started_at=0.0,
        request_id=draw(text),
        upstream_request_id=draw(maybe_text),
        method=draw(st.sampled_from(["POST", "GET"])),
        path=draw(st.sampled_from(["/v1/messages", "/v1/messages/count_tokens", "/x"])),
        key_name=draw(maybe_text),
        team=draw(maybe_text),
        user=draw(maybe_text),
        session_id=draw(maybe_text),
        agent_id=draw(maybe_text),
        alias=draw(maybe_text),
        provider=draw(maybe_text),
        model=draw(maybe_text),
        model_label="",
        stream=draw(st.booleans()),
        routed=True,
        outcome=draw(st.sampled_from(["completed", "upstream_error", "client_cancelled", "stream_error"])),
        status=draw(st.sampled_from([0, 200, 400, 529])),
        usage=usage,
        cost_usd=draw(st.one_of(st.none(), st.floats(0, 100))),
        ttft=draw(seconds),
        duration=1.0,
        attempts=draw(st.integers(0, 4)),
        timed=True,
        dropped=draw(st.lists(text, max_size=2).map(tuple)),
        limit=draw(maybe_text),
        response_id=draw(maybe_text),
        response_model=draw(maybe_text),
        finish_reason=draw(maybe_text),
        upstream_wait=draw(seconds),
        panic=draw(st.booleans()),
        trace=trace,
    )
    return f, trace


def both(f: Finished, trace: RequestTrace, *args: Any) -> tuple[list[bytes], list[bytes]]:
    python: list[bytes] = []
    compiled: list[bytes] = []
    _request_spans_py(f, trace, *args, GEN_AI_PROVIDERS, _server, python)
    C.request_spans(f, trace, *args, GEN_AI_PROVIDERS, _server, compiled)
    return python, compiled


@settings(max_examples=1500, deadline=None)
@given(
    traced(),
    ns,
    st.sampled_from(["chat", "count_tokens"]),
    st.sampled_from(["", "anthropic", "aws.bedrock"]),
    maybe_text,
    st.booleans(),
)
def test_the_compiled_spans_are_the_reference_spans(
    request: tuple[Finished, RequestTrace], end_ns: int, operation: str, provider: str, error_type: str, answer: bool
) -> None:
    f, trace = request
    python, compiled = both(f, trace, end_ns, operation, provider, error_type, answer)
    assert compiled == python
    assert len(compiled) == 1 + len(trace.attempts)
    for encoded in compiled:  # each a ScopeSpans.spans field: its tag, its length, a Span that decodes
        assert encoded[0] == 0x12
        Span.FromString(encoded[1 + (1 if encoded[1] < 0x80 else 2 if encoded[2] < 0x80 else 3) :])


def test_the_tracer_uses_the_compiled_spans_unless_content_is_captured() -> None:
    assert tracing._request_spans is C.request_spans


def test_what_otlp_cannot_carry_fails_alike() -> None:
    """A token count past int64 (a ValueError either way), a field of the wrong type (a TypeError)."""
    trace = RequestTrace(b"t" * 16, b"", 1, "", b"s" * 8)
    trace.attempts = [AttemptSpan(b"a" * 8, "up", "anthropic", "m")]
    base = finished(trace)
    huge = msgspec.structs.replace(base, usage=Usage(input_tokens=2**63 - 1, cache_read_input_tokens=1))
    for build in (_request_spans_py, C.request_spans):
        with pytest.raises(ValueError, match="int64"):
            build(huge, trace, 1, "chat", "anthropic", "", True, GEN_AI_PROVIDERS, _server, [])
    wrong = msgspec.structs.replace(base, request_id=object())
    for build in (_request_spans_py, C.request_spans):
        with pytest.raises(TypeError):
            build(wrong, trace, 1, "chat", "anthropic", "", True, GEN_AI_PROVIDERS, _server, [])


class _DictTrace:
    """A trace whose attributes live in an instance dict, one of them a property: the compiled path reads what is
    not a slot through getattr."""

    def __init__(self, trace: RequestTrace) -> None:
        for name in RequestTrace.__slots__:
            if name != "route":
                setattr(self, name, getattr(trace, name))
        self._route = trace.route

    @property
    def route(self) -> str:
        return self._route


@settings(max_examples=200, deadline=None)
@given(traced(), ns)
def test_attributes_that_are_not_slots_are_read_through_getattr(
    request: tuple[Finished, RequestTrace], end: int
) -> None:
    f, trace = request
    python, compiled = both(f, _DictTrace(trace), end, "chat", "anthropic", "", True)  # type: ignore[arg-type]
    assert compiled == python
    reference, _ = both(f, trace, end, "chat", "anthropic", "", True)
    assert compiled == reference


def test_an_unset_slot_is_an_attribute_error_alike() -> None:
    trace = RequestTrace(b"t" * 16, b"", 1, "", b"s" * 8)
    span = AttemptSpan(b"a" * 8, "up", "anthropic", "m")
    del span.url
    trace.attempts = [span]
    f = finished(trace)
    for build in (_request_spans_py, C.request_spans):
        with pytest.raises(AttributeError, match="url"):
            build(f, trace, 1, "chat", "anthropic", "", True, GEN_AI_PROVIDERS, _server, [])


def test_the_server_of_a_url_is_asked_again_for_another_url_or_another_server() -> None:
    """The compiled spans remember the last ``server(url)`` (a request's attempts go to a few targets' URLs): a
    different URL, an equal URL in another string, or another ``server`` function gets its own answer; a bad
    answer is refused each time, never remembered."""
    trace = RequestTrace(b"t" * 16, b"", 1, "", b"s" * 8)
    span = AttemptSpan(b"a" * 8, "up", "anthropic", "m")
    trace.attempts = [span]
    f = finished(trace)
    asked: list[str] = []

    def server_of(name: str) -> Any:
        def server(url: str) -> tuple[str, int]:
            asked.append(name)
            return (f"{name}-{url}", len(url))

        return server

    def address(server: Any, url: str) -> tuple[str, int]:
        span.url = url
        spans: list[bytes] = []
        C.request_spans(f, trace, 1, "chat", "anthropic", "", True, GEN_AI_PROVIDERS, server, spans)
        reference: list[bytes] = []
        _request_spans_py(f, trace, 1, "chat", "anthropic", "", True, GEN_AI_PROVIDERS, server, reference)
        assert spans == reference
        client = Span.FromString(spans[1][2:] if spans[1][1] < 0x80 else spans[1][3:])
        values = {a.key: a.value for a in client.attributes}
        return values["server.address"].string_value, values["server.port"].int_value

    one, two = server_of("one"), server_of("two")
    url = "http://127.0.0.1:9000/v1/messages"
    assert address(one, url) == (f"one-{url}", len(url))
    asked.clear()
    assert address(one, url) == (f"one-{url}", len(url))  # remembered: the compiled side did not ask
    assert asked == ["one"]  # (the reference's call)
    assert address(one, "http://h/v1/messages") == ("one-http://h/v1/messages", 20)
    assert address(one, "".join(["http://h", "/v1/messages"])) == ("one-http://h/v1/messages", 20)
    assert address(two, "http://h/v1/messages") == ("two-http://h/v1/messages", 20)
    assert address(two, "http://i/v1/messages") == ("two-http://i/v1/messages", 20)  # as long, not the same
    assert address(one, url) == (f"one-{url}", len(url))

    def bad(url: str) -> Any:
        return [url, 1]

    span.url = url
    for _ in range(2):
        with pytest.raises(TypeError, match="address, port"):
            C.request_spans(f, trace, 1, "chat", "anthropic", "", True, GEN_AI_PROVIDERS, bad, [])


class _Nanoseconds(int):
    """An int subclass: read as an int (not through the exact-int fast path)."""


@pytest.mark.parametrize(
    "time",
    [1, 2**30, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70, -1, -(2**63), -(2**64), _Nanoseconds(2**61), True],
)
@pytest.mark.parametrize("where", ["end", "start", "attempt_start", "attempt_end"])
def test_times_at_the_edges_of_int64_and_uint64_alike(time: int, where: str) -> None:
    """A span's times as uint64: the same spans on both sides, or both refusing a time out of range (the reference
    with struct's error, the compiled spans with OverflowError), at and past the edges, negative ones, int
    subclasses."""
    trace = RequestTrace(b"t" * 16, b"", 1, "", b"s" * 8)
    span = AttemptSpan(b"a" * 8, "up", "anthropic", "m")
    span.start_ns, span.end_ns = 5, 9
    trace.attempts = [span]
    end = 10
    if where == "end":
        end = time
    elif where == "start":
        trace.start_ns = time
    elif where == "attempt_start":
        span.start_ns = time
    else:
        span.end_ns = time
    f = finished(trace)
    outcomes = []
    for build in (_request_spans_py, C.request_spans):
        spans: list[bytes] = []
        try:
            build(f, trace, end, "chat", "anthropic", "", True, GEN_AI_PROVIDERS, _server, spans)
            outcomes.append(spans)
        except struct.error:  # the reference packs times with struct: its out-of-range error
            outcomes.append("OverflowError")
        except (OverflowError, ValueError, TypeError) as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1]

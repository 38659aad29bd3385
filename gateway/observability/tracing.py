"""OpenTelemetry traces in the GenAI semantic conventions, and the GenAI metrics beside them.

A traced request has one ``RequestTrace``: its trace id (the caller's, from ``traceparent``, or a new one), the
SERVER span's id and start, the request's parameters, and one ``AttemptSpan`` per upstream attempt — the CLIENT
spans, whose ``traceparent`` goes upstream with the attempt (``ProxyRequest.traceparent``). Nothing is built while
the request runs but ids and clock readings: when the request is recorded (``SpanSink``, the one recording seam),
the ``Finished`` record and the trace are set aside (``set_aside``); ``Tracer.flush`` turns a batch of them into
encoded spans and histogram points (once 32 wait, after the request that completed the batch, or before an export)
and hands them to the exporter's bounded queue (``gateway.observability.otlp_export``), off the request path. The
attribute names and their sources are listed in ``docs/design.md`` (§ Traces). Each of these steps is one call of
``_otlp_c`` when it was built (``_new_trace``, ``new_attempt``, ``note_request``, ``set_aside``, ``_record_batch``),
the Python functions beside them its references (tests/unit/test_tracing_ids.py, test_tracing_batch.py).

Why not the OpenTelemetry SDK: measured on this machine, its ``start_span`` + ``end`` costs ~26 µs a span and its
histograms ~10 µs a record, ~100 µs a traced request — three times the budget of 30 µs. The spans are written as
OTLP protobuf by ``gateway.observability.otlp_proto`` instead, which the tests check against the SDK's own encoder.
Never prompt text (unless ``telemetry.otlp.capture_content``), never keys.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from gateway.observability.genai_content import OutputCollector, input_attributes
from gateway.observability.genai_metrics import (
    CLIENT_DURATION,
    SERVER_DURATION,
    TIME_TO_FIRST_TOKEN,
    TOKEN_USAGE,
    GenAiMetrics,
)
from gateway.observability.otlp_proto import (
    SPAN_KIND_CLIENT,
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    encode_span_fields,
)
from gateway.observability.otlp_proto import encode_attributes as _encode

if TYPE_CHECKING:
    from gateway.observability.otlp_export import OtlpExporter
    from gateway.observability.recording import Finished
    from gateway.wire.request import MessagesHead

__all__ = [
    "GEN_AI_PROVIDERS",
    "AttemptSpan",
    "RequestTrace",
    "SpanSink",
    "Tracer",
    "parse_traceparent",
]

# gen_ai.provider.name by provider kind (the convention's well-known values: docs/gen-ai/gen-ai-spans.md of
# open-telemetry/semantic-conventions): the first-party API and Claude Platform on AWS (Anthropic's own API) are
# `anthropic`; Bedrock's three APIs `aws.bedrock`; Vertex AI `gcp.vertex_ai`; Foundry `azure.ai.inference`.
GEN_AI_PROVIDERS: dict[str, str] = {
    "anthropic": "anthropic",
    "claude_aws": "anthropic",
    "bedrock": "aws.bedrock",
    "bedrock_converse": "aws.bedrock",
    "bedrock_mantle": "aws.bedrock",
    "vertex": "gcp.vertex_ai",
    "foundry": "azure.ai.inference",
    "mock": "messages_gateway.mock",  # the gateway's built-in fake: a custom value, never mistaken for a provider
}

_HEX = frozenset("0123456789abcdef")
_ALWAYS = 1 << 64  # sample_ratio 1.0's bound
_TRACE_FLAG_SAMPLED = 0x01
_FLAGS_HEX = tuple(f"{flags:02x}" for flags in range(256))
_MAX_TRACESTATE = 512  # W3C: 32 members of at most 256 characters; a longer header is not kept


def parse_traceparent(value: str | None) -> tuple[bytes, bytes, int] | None:
    """``(trace id, parent span id, flags)`` of a W3C ``traceparent`` (version 00, or a later version read as 00
    as the spec says), or None when it is absent or not one (then the gateway starts a trace of its own)."""
    if not value:
        return None
    value = value.strip().lower()
    if len(value) < 55 or not _HEX.issuperset(value[:2]) or value[:2] == "ff":
        return None
    if value[:2] == "00" and len(value) != 55:
        return None
    if value[2] != "-" or value[35] != "-" or value[52] != "-" or (len(value) > 55 and value[55] != "-"):
        return None
    trace_hex, span_hex, flags_hex = value[3:35], value[36:52], value[53:55]
    if not _HEX.issuperset(trace_hex + span_hex + flags_hex):
        return None
    if trace_hex == "0" * 32 or span_hex == "0" * 16:
        return None
    return bytes.fromhex(trace_hex), bytes.fromhex(span_hex), int(flags_hex, 16)


Params = tuple[int | None, float | None, float | None, float | None, tuple[str, ...] | None]
"""max_tokens, temperature, top_p, top_k (the convention's type: double), stop_sequences: what the spans carry of a
request's parameters (gen_ai.request.*), None where absent or not of its type."""
_NO_PARAMS: Params = (None, None, None, None, None)
_M64 = (1 << 64) - 1


class AttemptSpan(msgspec.Struct, gc=False):
    """One upstream attempt: the CLIENT span's id and times, where it went, and how it failed ("" when it did
    not). A Struct (made in C, never tracked by the cyclic collector: it holds no container): the request's path
    runs no Python ``__init__`` for it."""

    span_id: bytes
    provider: str  # the configured provider's name
    provider_kind: str  # its kind (GEN_AI_PROVIDERS)
    model: str  # the upstream model id asked for
    traceparent: str = ""  # the W3C traceparent its upstream request carries (RequestTrace.attempt sets it)
    start_ns: int = msgspec.field(default_factory=time.time_ns)
    end_ns: int = 0  # 0: it served the request, and ends when the request does
    error_type: str = ""
    status: int = 0  # the provider's HTTP status when it answered with an error
    url: str = ""  # where the request went (set by the adapter that sent it)

    def fail(self, error_type: str, status: int) -> None:
        self.end_ns = time.time_ns()
        self.error_type = error_type
        self.status = status


class RequestTrace(msgspec.Struct, gc=False):
    """One traced request: its ids, its start, its parameters, its attempts. A Struct, like ``AttemptSpan`` (its
    containers are tracked themselves, and nothing it holds refers back to it)."""

    trace_id: bytes
    parent_id: bytes  # the caller's span (b"": the trace starts here)
    flags: int
    trace_state: str
    span_id: bytes  # the SERVER span's
    start_ns: int = msgspec.field(default_factory=time.time_ns)
    route: str = ""  # the route's template (http.route): "/v1/messages", a surface's
    request_model: str = ""  # the model as the client named it
    params: Params = _NO_PARAMS
    attempts: list[AttemptSpan] = msgspec.field(default_factory=list)
    error_type: str = ""  # the error the client was answered with, when one was
    capture: bool = False  # telemetry.otlp.capture_content: the prompt and the answer go into the spans
    inputs: dict[str, str] | None = None  # (capture) gen_ai.system_instructions and gen_ai.input.messages
    output: OutputCollector | None = None  # (capture) the answer, as it streams or arrives

    @property
    def sampled(self) -> bool:
        return bool(self.flags & _TRACE_FLAG_SAMPLED)

    def capture_input(self, body: bytes) -> None:
        """(telemetry.otlp.capture_content) What the client sent, for the spans; the answer collected as it comes."""
        self.inputs, self.output = input_attributes(body), OutputCollector()

    def attempt(self, provider: str, provider_kind: str, model: str) -> AttemptSpan:
        """A new attempt's CLIENT span, its ``traceparent`` (this trace, its span) made with it."""
        bits = _getrandbits(64) or 1
        span = AttemptSpan(
            bits.to_bytes(8, "big"),
            provider,
            provider_kind,
            model,
            f"00-{self.trace_id.hex()}-{bits:016x}-{_FLAGS_HEX[self.flags]}",
        )
        self.attempts.append(span)
        return span

    def traceparent(self, span: AttemptSpan) -> str:
        """The ``traceparent`` an attempt's upstream request carries: this trace, the attempt's span."""
        return f"00-{self.trace_id.hex()}-{span.span_id.hex()}-{_FLAGS_HEX[self.flags]}"


_getrandbits = random.getrandbits


def _new_trace_py(bound: int, capture: bool) -> RequestTrace:
    """A new trace (no caller's ``traceparent``): its trace and SERVER span ids from one draw of 192 random bits,
    sampled when the trace id's low 64 bits are below ``bound`` (OpenTelemetry's TraceIdRatioBased), capturing
    content when asked and sampled. The reference of ``_otlp_c.new_trace`` (tests/unit/test_tracing_ids.py)."""
    bits = _getrandbits(192)
    if not bits & _M64:  # a span id of zeros is invalid (W3C): one in 2**64
        bits |= 1
    ids = bits.to_bytes(24, "big")
    sampled = bound >= _ALWAYS or (bits >> 64) & _M64 < bound
    trace = RequestTrace(ids[:16], b"", _TRACE_FLAG_SAMPLED if sampled else 0, "", ids[16:])
    if capture and sampled:
        trace.capture = True
    return trace


def _note_request_py(trace: RequestTrace, model: str, head: MessagesHead | None) -> bool:
    """The request as the client sent it, on its trace: its model and the parameters the spans carry (as the edge's
    own parse read them: ``head``, None for a token count). Whether the trace captures content. The reference of
    ``_otlp_c.request`` (tests/unit/test_tracing_ids.py)."""
    trace.request_model = model
    if head is not None:
        stop = head.stop_sequences
        if stop is not None:
            stop = tuple(stop) if type(stop) is list and all(type(s) is str for s in stop) else None
        t, p, k = head.temperature, head.top_p, head.top_k
        trace.params = (
            head.max_tokens,
            float(t) if type(t) is float or type(t) is int else None,
            float(p) if type(p) is float or type(p) is int else None,
            float(k) if type(k) is float or type(k) is int else None,
            stop,
        )
    return trace.capture


def _set_aside_py(pending: list[tuple[Finished, RequestTrace, int]], f: Finished, metrics: bool, traces: bool) -> int:
    """A traced request set aside with its end time, when there is anything to build of it (its metrics, or its
    spans when sampled): the number now pending (0: nothing set aside). The reference of ``_otlp_c.set_aside``."""
    trace = f.trace
    if trace is None or not (metrics or (traces and trace.flags & _TRACE_FLAG_SAMPLED)):
        return 0
    pending.append((f, trace, time.time_ns()))
    return len(pending)


_new_trace: Callable[[int, bool], RequestTrace]
note_request: Callable[[RequestTrace, str, MessagesHead | None], bool]
"""The request as the client sent it, on its trace (``_note_request_py``; compiled when built)."""
set_aside: Callable[[list[tuple[Finished, RequestTrace, int]], Finished, bool, bool], int]
"""A finished request set aside for its batch (``_set_aside_py``; compiled when built)."""
new_attempt: Callable[[RequestTrace, str, str, str], AttemptSpan]
"""A traced request's new attempt (``RequestTrace.attempt``: compiled when built)."""
try:  # compiled (setup.py builds it when there is a C compiler): the same objects from the same draws
    from gateway.observability import _otlp_c

    _otlp_c.bind(RequestTrace, AttemptSpan, _getrandbits)
    _new_trace, new_attempt = _otlp_c.new_trace, _otlp_c.attempt
    note_request, set_aside = _otlp_c.request, _otlp_c.set_aside
except ImportError:  # pragma: no cover - no compiler where it was installed
    _new_trace, new_attempt = _new_trace_py, RequestTrace.attempt
    note_request, set_aside = _note_request_py, _set_aside_py


FLUSH_AT = 32
"""Finished requests set aside before their spans and metrics are built together: ~10 µs each, so a batch holds the
event loop ~0.3 ms — once per 32 requests, after the one that completed it."""

_SERVERS: dict[str, tuple[str, int]] = {}


def _server(url: str) -> tuple[str, int]:
    """``(server.address, server.port)`` of an upstream URL (remembered per scheme and host)."""
    end = url.find("/", url.find("//") + 2)
    origin = url if end < 0 else url[:end]
    found = _SERVERS.get(origin)
    if found is None:
        parts = urlsplit(origin)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = (parts.hostname or "", port)
        if len(_SERVERS) < 1024:
            _SERVERS[origin] = found
    return found


class Tracer:
    """The process's tracing: new traces (sampled by ``sample_ratio`` unless the caller's ``traceparent`` decides),
    and each finished request's spans and GenAI metrics, handed to the exporter."""

    def __init__(
        self,
        exporter: OtlpExporter,
        *,
        sample_ratio: float = 1.0,
        traces: bool = True,
        metrics: bool = True,
        capture_content: bool = False,
    ) -> None:
        self.exporter = exporter
        self.traces = traces
        self.capture = capture_content and traces
        self.genai = GenAiMetrics() if metrics else None
        if metrics:
            exporter.metrics_source = self.genai
        exporter.before_export = self.flush
        self.pending: list[tuple[Finished, RequestTrace, int]] = []  # set aside (set_aside), built by flush
        self._bound = round(sample_ratio * (1 << 64))  # OpenTelemetry's TraceIdRatioBased: the id's low 64 bits
        self._client_series: dict[tuple[str, ...], tuple[Any, Any, Any]] = {}
        self._server_series: dict[tuple[str, ...], tuple[Any, Any]] = {}

    def start(self, headers: Mapping[str, str]) -> RequestTrace:
        """The trace of a request that just arrived: the caller's (``traceparent``/``tracestate``) or a new one
        (``_new_trace``)."""
        value = headers.get("traceparent")
        parent = parse_traceparent(value) if value else None
        if parent is None:
            return _new_trace(self._bound, self.capture)
        trace_id, parent_id, flags = parent
        state = headers.get("tracestate", "")
        state = state if len(state) <= _MAX_TRACESTATE else ""
        bits = _getrandbits(64) or 1
        trace = RequestTrace(trace_id, parent_id, flags & 0xFF, state, bits.to_bytes(8, "big"))
        if self.capture and trace.flags & _TRACE_FLAG_SAMPLED:
            trace.capture = True
        return trace

    def record(self, f: Finished) -> None:
        """A finished request, set aside with its end time (``set_aside``): its spans and metrics are built with
        the others' (a batch of ``FLUSH_AT``, once the request that completed it is done, or before an export) —
        built one after the other they cost half what they cost built between requests, their code and caches
        still warm (docs/benchmarks.md, "Tracing on vs off"). ``SpanSink`` does the same without this call."""
        if set_aside(self.pending, f, self.genai is not None, self.traces) == FLUSH_AT:
            self.batch_full()

    def sink(self) -> SpanSink:
        """The recorder's sink of this tracer's requests (the one recording seam)."""
        return SpanSink(self)

    def batch_full(self) -> None:
        """``FLUSH_AT`` wait: built after the current callback (now, without an event loop)."""
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no event loop (a script's, a test's): now
            self.flush()

    def flush(self) -> None:
        """Build the spans and metrics of the requests set aside (the exporter calls this before it exports)."""
        pending = self.pending[:]
        self.pending.clear()  # the same list: SpanSink holds it
        spans: list[bytes] = []
        _record_batch(pending, self.traces, GEN_AI_PROVIDERS, _server, spans, _request_spans_py, self._hooks)
        if spans:
            self.exporter.submit(spans)  # the batch's spans in one hand-over

    @property
    def _hooks(self) -> MetricHooks | None:
        """Where the GenAI metrics of a batch go: the series caches and what fills them (None: no metrics)."""
        if self.genai is None:
            return None
        return (self._client_series, self._server_series, self._client_for, self._server_for)

    def _client_for(self, facts: tuple[str, ...]) -> tuple[Any, Any, Any]:
        """The series of an attempt's client metrics with these facts, kept for the next request's."""
        assert self.genai is not None
        series = self._client_series[facts] = _client_series(self.genai, facts)  # type: ignore[arg-type]
        if len(self._client_series) > _MAX_CACHED:
            self._client_series.clear()
        return series

    def _server_for(self, facts: tuple[str, ...]) -> tuple[Any, Any]:
        """The series of a request's server metrics with these facts, kept for the next request's."""
        assert self.genai is not None
        series = self._server_series[facts] = _server_series(self.genai, facts)  # type: ignore[arg-type]
        if len(self._server_series) > _MAX_CACHED:
            self._server_series.clear()
        return series


class SpanSink:
    """A traced request's spans and GenAI metrics: the request set aside (``set_aside``, compiled) for its tracer's
    next batch, which is built once ``FLUSH_AT`` wait."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._pending = tracer.pending  # the one list (Tracer.flush empties it in place)
        self._metrics, self._traces = tracer.genai is not None, tracer.traces

    def record(self, finished: Finished) -> None:
        if set_aside(self._pending, finished, self._metrics, self._traces) == FLUSH_AT:
            self._tracer.batch_full()


MetricHooks = tuple[
    dict[tuple[str, ...], tuple[Any, Any, Any]],
    dict[tuple[str, ...], tuple[Any, Any]],
    Callable[[tuple[str, ...]], tuple[Any, Any, Any]],
    Callable[[tuple[str, ...]], tuple[Any, Any]],
]
"""The client series cache, the server series cache, and what makes (and caches) a missing one of each."""


def _record_batch_py(
    pending: list[tuple[Finished, RequestTrace, int]],
    traces: bool,
    providers: Mapping[str, str],
    server: Callable[[str], tuple[str, int]],
    spans: list[bytes],
    capture_build: Callable[..., None],
    hooks: MetricHooks | None,
) -> None:
    """Each finished request's GenAI metrics (``hooks``), and its spans (when sampled) added to ``spans``: the
    reference of ``_otlp_c.record``, which does the same in C (tests/unit/test_tracing_batch.py compares them)."""
    for f, trace, end_ns in pending:
        completed = f.outcome == "completed"
        error_type = "" if completed else (trace.error_type or f.outcome)
        attempts = trace.attempts
        provider = providers.get(attempts[-1].provider_kind, "") if attempts else ""
        operation = "chat" if f.timed else "count_tokens"
        if hooks is not None and attempts and f.routed:
            _metrics_py(hooks, f, trace, operation, provider, error_type, end_ns)
        if not (traces and trace.flags & _TRACE_FLAG_SAMPLED):
            continue
        answer = completed or bool(f.attempts)  # the answer's attributes: the SERVER span's and the serving CLIENT's
        build = capture_build if trace.capture else _request_spans
        build(f, trace, end_ns, operation, provider, error_type, answer, providers, server, spans)


def _metrics_py(
    hooks: MetricHooks,
    f: Finished,
    trace: RequestTrace,
    operation: str,
    provider: str,
    error_type: str,
    end_ns: int,
) -> None:
    """``gen_ai.client.*`` per upstream attempt (the gateway is the provider's client), ``gen_ai.server.*`` per
    request (it is its clients' server), with the attributes the convention lists for each. The attribute sets
    of a request's series are looked up once, by the facts they are made of."""
    client_cache, server_cache, make_client, make_server = hooks
    last = len(trace.attempts) - 1
    for n, attempt in enumerate(trace.attempts):
        serving = n == last
        failed = attempt.error_type or (error_type if serving else "")
        response_model = f.response_model if serving else ""
        facts = (operation, attempt.provider_kind, attempt.model, response_model, attempt.url, failed)
        series = client_cache.get(facts)
        if series is None:
            series = make_client(facts)
        duration, tokens_in, tokens_out = series
        duration.add(((attempt.end_ns or end_ns) - attempt.start_ns) / 1e9)
        if serving and operation == "chat" and not attempt.error_type:
            usage = f.usage
            if usage.input_tokens is not None or usage.output_tokens is not None:
                read, created = usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0
                tokens_in.add((usage.input_tokens or 0) + read + created)
                tokens_out.add(usage.output_tokens or 0)
    if operation != "chat":
        return
    request_facts = (provider, trace.request_model, f.response_model, error_type)
    found = server_cache.get(request_facts)
    if found is None:
        found = make_server(request_facts)
    duration, first_token = found
    duration.add(f.duration)
    if f.ttft is not None and not error_type:
        first_token.add(f.ttft)


def _request_spans_py(
    f: Finished,
    trace: RequestTrace,
    end_ns: int,
    operation: str,
    provider: str,
    error_type: str,
    answer: bool,
    providers: Mapping[str, str],
    server: Callable[[str], tuple[str, int]],
    spans: list[bytes],
) -> None:
    """A sampled request's SERVER span, then a CLIENT span per attempt, encoded and added to ``spans``: the
    reference (and the path of a trace that captures content) of ``_otlp_c.request_spans``, which writes the same
    bytes straight from the record's and the trace's fields (tests/unit/test_tracing_spans.py compares the two)."""
    answered = _answer(f) if answer else b""  # shared by the SERVER and the serving CLIENT span
    spans.append(_server_span(f, trace, end_ns, operation, provider, error_type, answered))
    last = len(trace.attempts) - 1
    for n, attempt in enumerate(trace.attempts):
        spans.append(
            _client_span(f, trace, attempt, n, n == last, end_ns, operation, error_type, answered, providers, server)
        )


def _server_span(
    f: Finished,
    trace: RequestTrace,
    end_ns: int,
    operation: str,
    provider: str,
    error_type: str,
    answer: bytes,
) -> bytes:
    """The SERVER span, encoded (``encode_span_fields``: no ``SpanRecord`` made)."""
    route = trace.route or f.path
    facts: tuple[Any, ...] = (f.method, route, f.path, f.status, f.outcome, f.attempts, f.alias, f.provider)
    facts += (f.model, f.key_name, f.team, f.user, f.panic, f.limit, f.dropped, error_type)
    server = _cached(_SERVER_FACTS, facts, _server_facts)
    variable: dict[str, Any] = {"messages_gateway.request_id": f.request_id}
    if f.ttft is not None:
        variable["gen_ai.response.time_to_first_chunk"] = f.ttft
    if f.cost_usd is not None:
        variable["messages_gateway.cost_usd"] = f.cost_usd
    if f.upstream_request_id:
        variable["messages_gateway.upstream_request_id"] = f.upstream_request_id
    if f.agent_id:
        variable["messages_gateway.agent_id"] = f.agent_id
    attributes = b"".join(
        (_request_attributes(f, trace, operation, trace.request_model, provider), answer, server, _encode(variable))
    )
    return encode_span_fields(
        trace.trace_id,
        trace.span_id,
        trace.parent_id,
        trace.trace_state,
        f"{f.method} {route}",
        SPAN_KIND_SERVER,
        trace.start_ns,
        end_ns,
        attributes,
        STATUS_ERROR if error_type else 0,
        f.outcome if error_type else "",
        trace.flags,
        bool(trace.parent_id),
    )


def _client_span(
    f: Finished,
    trace: RequestTrace,
    attempt: AttemptSpan,
    n: int,
    serving: bool,
    end_ns: int,
    operation: str,
    request_error: str,
    answer: bytes,
    providers: Mapping[str, str],
    server: Callable[[str], tuple[str, int]],
) -> bytes:
    """An attempt's CLIENT span, encoded."""
    error_type = attempt.error_type
    answered = not error_type and serving  # the attempt that answered: the answer is its
    if answered:
        error_type = request_error  # a stream that broke, or a client that went away, ends it too
    facts = (attempt.provider, n, attempt.status, error_type, server(attempt.url) if attempt.url else None)
    client = _cached(_CLIENT_FACTS, facts, _client_facts)
    provider = providers.get(attempt.provider_kind, "")
    parts = [_request_attributes(f, trace, operation, attempt.model, provider), client]
    if answered:
        variable: dict[str, Any] = {}
        if f.upstream_wait is not None:
            variable["gen_ai.response.time_to_first_chunk"] = f.upstream_wait
        if f.upstream_request_id:
            variable["messages_gateway.upstream_request_id"] = f.upstream_request_id
        if trace.output is not None:  # (capture_content) the answer
            variable["gen_ai.output.messages"] = trace.output.attribute()
        parts += (answer, _encode(variable))
    if trace.inputs:  # (capture_content) what every attempt was sent
        parts.append(_encode(trace.inputs))
    return encode_span_fields(
        trace.trace_id,
        attempt.span_id,
        trace.span_id,
        trace.trace_state,
        f"{operation} {attempt.model}",
        SPAN_KIND_CLIENT,
        attempt.start_ns,
        attempt.end_ns or end_ns,
        b"".join(parts),
        STATUS_ERROR if error_type else 0,
        error_type,
        trace.flags,
        False,
    )


_request_spans: Callable[..., None]
_record_batch: Callable[..., None]
try:  # the same, compiled (setup.py builds it when there is a C compiler)
    from gateway.observability._otlp_c import record as _record_batch
    from gateway.observability._otlp_c import request_spans as _request_spans
except ImportError:  # pragma: no cover - no compiler where it was installed
    _request_spans = _request_spans_py
    _record_batch = _record_batch_py


_MAX_CACHED = 4096  # attribute groups remembered (then forgotten all at once: they are rebuilt as needed)
_REQUEST: dict[tuple[Any, ...], bytes] = {}
_SERVER_FACTS: dict[tuple[Any, ...], bytes] = {}
_CLIENT_FACTS: dict[tuple[Any, ...], bytes] = {}


def _cached(cache: dict[tuple[Any, ...], bytes], facts: tuple[Any, ...], build: Any) -> bytes:
    """The encoded attributes of ``facts``: most requests repeat the last ones' (a model, a provider, an outcome),
    so each group is encoded once and looked up after (one tuple hash instead of an attribute's encoding each)."""
    found = cache.get(facts)
    if found is None:
        if len(cache) >= _MAX_CACHED:
            cache.clear()
        found = cache[facts] = _encode(build(*facts))
    return found


def _request_attributes(f: Finished, trace: RequestTrace, operation: str, model: str, provider: str) -> bytes:
    """What the client asked (gen_ai.request.*), the operation, the provider and the conversation."""
    return _cached(_REQUEST, (operation, model, provider, f.stream, trace.params, f.session_id), _request_facts)


def _request_facts(
    operation: str, model: str, provider: str, stream: bool, params: Params, session_id: str
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model,
        "gen_ai.request.stream": stream,
    }
    if provider:
        attributes["gen_ai.provider.name"] = provider
    max_tokens, temperature, top_p, top_k, stop_sequences = params
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if temperature is not None:
        attributes["gen_ai.request.temperature"] = temperature
    if top_p is not None:
        attributes["gen_ai.request.top_p"] = top_p
    if top_k is not None:
        attributes["gen_ai.request.top_k"] = top_k
    if stop_sequences:
        attributes["gen_ai.request.stop_sequences"] = stop_sequences
    if session_id:
        attributes["gen_ai.conversation.id"] = session_id
    return attributes


def _answer(f: Finished) -> bytes:
    """What the provider's answer said: its id, model, stop reason and usage (Anthropic's arithmetic:
    gen_ai.usage.input_tokens counts the cache reads and writes, which Anthropic reports apart)."""
    attributes: dict[str, Any] = {}
    if f.response_id:
        attributes["gen_ai.response.id"] = f.response_id
    if f.response_model:
        attributes["gen_ai.response.model"] = f.response_model
    if f.finish_reason:
        attributes["gen_ai.response.finish_reasons"] = (f.finish_reason,)
    usage = f.usage
    if usage.input_tokens is not None or usage.output_tokens is not None:
        read = usage.cache_read_input_tokens or 0
        created = usage.cache_creation_input_tokens or 0
        attributes["gen_ai.usage.input_tokens"] = (usage.input_tokens or 0) + read + created
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens or 0
        attributes["gen_ai.usage.cache_read.input_tokens"] = read
        attributes["gen_ai.usage.cache_creation.input_tokens"] = created
    return _encode(attributes)


def _server_facts(
    method: str,
    route: str,
    path: str,
    status: int,
    outcome: str,
    attempts: int,
    alias: str,
    provider: str,
    model: str,
    key: str,
    team: str,
    user: str,
    panic: bool,
    limit: str,
    dropped: tuple[str, ...],
    error_type: str,
) -> dict[str, Any]:
    """The SERVER span's HTTP facts and the gateway's own, under ``messages_gateway.*`` (and ``enduser.id``)."""
    attributes: dict[str, Any] = {"http.request.method": method, "http.route": route, "url.path": path}
    if status:
        attributes["http.response.status_code"] = status
    if error_type:
        attributes["error.type"] = error_type
    attributes["messages_gateway.outcome"] = outcome
    attributes["messages_gateway.attempts"] = attempts
    for name, value in (("alias", alias), ("provider", provider), ("upstream_model", model), ("key", key)):
        if value:
            attributes[f"messages_gateway.{name}"] = value
    if team:
        attributes["messages_gateway.team"] = team
    if user:
        attributes["enduser.id"] = user
    if panic:
        attributes["messages_gateway.panic"] = True
    if limit:
        attributes["messages_gateway.limit"] = limit
    if dropped:
        attributes["messages_gateway.dropped"] = dropped
    return attributes


def _client_facts(
    provider: str, n: int, status: int, error_type: str, server: tuple[str, int] | None
) -> dict[str, Any]:
    """A CLIENT span's own facts: where it went, which attempt it was, how it failed."""
    attributes: dict[str, Any] = {}
    if server is not None:
        attributes["server.address"], attributes["server.port"] = server
    attributes["messages_gateway.provider"] = provider
    attributes["messages_gateway.attempt"] = n + 1
    if status:
        attributes["http.response.status_code"] = status
    if error_type:
        attributes["error.type"] = error_type
    return attributes


def _client_series(genai: GenAiMetrics, facts: tuple[str, str, str, str, str, str]) -> tuple[Any, Any, Any]:
    """The series an attempt's client metrics go to: its duration, its input and its output tokens."""
    operation, provider_kind, model, response_model, url, failed = facts
    attributes: tuple[tuple[str, Any], ...] = (
        ("gen_ai.operation.name", operation),
        ("gen_ai.provider.name", GEN_AI_PROVIDERS.get(provider_kind, "")),
        ("gen_ai.request.model", model),
    )
    if response_model:
        attributes += (("gen_ai.response.model", response_model),)
    if url:
        address, port = _server(url)
        attributes += (("server.address", address), ("server.port", port))
    duration = genai.series(CLIENT_DURATION, (*attributes, ("error.type", failed)) if failed else attributes)
    tokens_in = genai.series(TOKEN_USAGE, (*attributes, ("gen_ai.token.type", "input")))
    tokens_out = genai.series(TOKEN_USAGE, (*attributes, ("gen_ai.token.type", "output")))
    return duration, tokens_in, tokens_out


def _server_series(genai: GenAiMetrics, facts: tuple[str, str, str, str]) -> tuple[Any, Any]:
    """The series a request's server metrics go to: its duration and its time to first token (successful only)."""
    provider, request_model, response_model, error_type = facts
    attributes: tuple[tuple[str, Any], ...] = (
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", provider),
        ("gen_ai.request.model", request_model),
    )
    if response_model:
        attributes += (("gen_ai.response.model", response_model),)
    duration = genai.series(SERVER_DURATION, (*attributes, ("error.type", error_type)) if error_type else attributes)
    return duration, genai.series(TIME_TO_FIRST_TOKEN, attributes)

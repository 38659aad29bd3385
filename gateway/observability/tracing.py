"""OpenTelemetry traces in the GenAI semantic conventions, and the GenAI metrics beside them.

A traced request has one ``RequestTrace``: its trace id (the caller's, from ``traceparent``, or a new one), the
SERVER span's id and start, the request's parameters, and one ``AttemptSpan`` per upstream attempt — the CLIENT
spans, whose ``traceparent`` goes upstream with the attempt (``ProxyRequest.traceparent``). Nothing is built while
the request runs but ids and clock readings: when the request is recorded (``SpanSink``, the one recording seam),
``Tracer.record`` turns the ``Finished`` record and the trace into ``SpanRecord`` s and histogram points, once per
request, and hands them to the exporter's bounded queue (``gateway.observability.otlp_export``), off the request
path. The attribute names and their sources are listed in ``docs/design.md`` (§ Traces).

Why not the OpenTelemetry SDK: measured on this machine, its ``start_span`` + ``end`` costs ~26 µs a span and its
histograms ~10 µs a record, ~100 µs a traced request — three times the budget of 30 µs. The spans are written as
OTLP protobuf by ``gateway.observability.otlp_proto`` instead, which the tests check against the SDK's own encoder.
Never prompt text (unless ``telemetry.otlp.capture_content``), never keys.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
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
    SpanRecord,
)

if TYPE_CHECKING:
    from gateway.observability.otlp_export import OtlpExporter
    from gateway.observability.recording import Finished

__all__ = [
    "GEN_AI_PROVIDERS",
    "AttemptSpan",
    "RequestTrace",
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
_TRACE_FLAG_SAMPLED = 0x01
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


class _Params(msgspec.Struct):
    """The request's parameters the spans carry (gen_ai.request.*); the rest of the body is skipped."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None


_decode_params = msgspec.json.Decoder(_Params).decode
_NO_PARAMS = _Params()


class AttemptSpan:
    """One upstream attempt: the CLIENT span's id and times, where it went, and how it failed ("" when it did
    not)."""

    __slots__ = ("end_ns", "error_type", "model", "provider", "provider_kind", "span_id", "start_ns", "status", "url")

    def __init__(self, span_id: bytes, provider: str, provider_kind: str, model: str) -> None:
        self.span_id = span_id
        self.provider = provider  # the configured provider's name
        self.provider_kind = provider_kind  # its kind (GEN_AI_PROVIDERS)
        self.model = model  # the upstream model id asked for
        self.start_ns = time.time_ns()
        self.end_ns = 0  # 0: it served the request, and ends when the request does
        self.error_type = ""
        self.status = 0  # the provider's HTTP status when it answered with an error
        self.url = ""  # where the request went (set by the adapter that sent it)

    def fail(self, error_type: str, status: int) -> None:
        self.end_ns = time.time_ns()
        self.error_type = error_type
        self.status = status


class RequestTrace:
    """One traced request: its ids, its start, its parameters, its attempts."""

    __slots__ = (
        "attempts",
        "capture",
        "error_type",
        "flags",
        "inputs",
        "output",
        "params",
        "parent_id",
        "request_model",
        "route",
        "span_id",
        "start_ns",
        "trace_id",
        "trace_state",
    )

    def __init__(self, trace_id: bytes, parent_id: bytes, flags: int, trace_state: str, span_id: bytes) -> None:
        self.trace_id = trace_id
        self.parent_id = parent_id  # the caller's span (b"": the trace starts here)
        self.flags = flags
        self.trace_state = trace_state
        self.span_id = span_id  # the SERVER span's
        self.start_ns = time.time_ns()
        self.route = ""  # the route's template (http.route): "/v1/messages", a surface's
        self.request_model = ""  # the model as the client named it
        self.params = _NO_PARAMS
        self.attempts: list[AttemptSpan] = []
        self.error_type = ""  # the error the client was answered with, when one was
        self.capture = False  # telemetry.otlp.capture_content: the prompt and the answer go into the spans
        self.inputs: dict[str, str] = {}  # (capture) gen_ai.system_instructions and gen_ai.input.messages
        self.output: OutputCollector | None = None  # (capture) the answer, as it streams or arrives

    @property
    def sampled(self) -> bool:
        return bool(self.flags & _TRACE_FLAG_SAMPLED)

    def request(self, model: str, body: bytes) -> None:
        """The request as the client sent it: its model and the parameters the spans carry (one decode that
        skips everything else; a body whose parameters are mistyped has none: the provider refuses it anyway)."""
        self.request_model = model
        if self.capture:
            self.inputs, self.output = input_attributes(body), OutputCollector()
        try:
            self.params = _decode_params(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.params = _NO_PARAMS

    def attempt(self, provider: str, provider_kind: str, model: str) -> AttemptSpan:
        span = AttemptSpan(_span_id(), provider, provider_kind, model)
        self.attempts.append(span)
        return span

    def traceparent(self, span: AttemptSpan) -> str:
        """The ``traceparent`` an attempt's upstream request carries: this trace, the attempt's span."""
        return f"00-{self.trace_id.hex()}-{span.span_id.hex()}-{self.flags:02x}"


def _span_id() -> bytes:
    return random.getrandbits(64).to_bytes(8, "big") or b"\x00" * 7 + b"\x01"


def _trace_id() -> bytes:
    return random.getrandbits(128).to_bytes(16, "big")


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
        self._bound = round(sample_ratio * (1 << 64))  # OpenTelemetry's TraceIdRatioBased: the id's low 64 bits

    def start(self, headers: Mapping[str, str]) -> RequestTrace:
        """The trace of a request that just arrived: the caller's (``traceparent``/``tracestate``) or a new one."""
        trace = self._start(headers)
        trace.capture = self.capture and trace.sampled
        return trace

    def _start(self, headers: Mapping[str, str]) -> RequestTrace:
        parent = parse_traceparent(headers.get("traceparent"))
        if parent is not None:
            trace_id, parent_id, flags = parent
            state = headers.get("tracestate", "")
            state = state if len(state) <= _MAX_TRACESTATE else ""
            return RequestTrace(trace_id, parent_id, flags & 0xFF, state, _span_id())
        trace_id = _trace_id()
        sampled = self._bound >= (1 << 64) or int.from_bytes(trace_id[8:], "big") < self._bound
        return RequestTrace(trace_id, b"", _TRACE_FLAG_SAMPLED if sampled else 0, "", _span_id())

    def record(self, f: Finished, trace: RequestTrace) -> None:
        """The request's spans (when sampled) and GenAI metrics, built once, handed to the exporter."""
        end_ns = time.time_ns()
        completed = f.outcome == "completed"
        error_type = "" if completed else (trace.error_type or f.outcome)
        gen_ai_provider = GEN_AI_PROVIDERS.get(trace.attempts[-1].provider_kind, "") if trace.attempts else ""
        operation = "count_tokens" if not f.timed else "chat"
        genai = self.genai
        if genai is not None and f.routed and trace.attempts:
            self._metrics(genai, f, trace, operation, gen_ai_provider, error_type)
        if not (self.traces and trace.sampled):
            return
        spans = [self._server_span(f, trace, end_ns, operation, gen_ai_provider, error_type)]
        last = len(trace.attempts) - 1
        for n, attempt in enumerate(trace.attempts):
            spans.append(self._client_span(f, trace, attempt, n, n == last, end_ns, operation, error_type))
        self.exporter.submit(spans)

    def _common(self, f: Finished, trace: RequestTrace, operation: str, model: str, provider: str) -> dict[str, Any]:
        params = trace.params
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model,
            "gen_ai.request.stream": f.stream,
        }
        if provider:
            attributes["gen_ai.provider.name"] = provider
        if params.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = params.max_tokens
        if params.temperature is not None:
            attributes["gen_ai.request.temperature"] = float(params.temperature)
        if params.top_p is not None:
            attributes["gen_ai.request.top_p"] = float(params.top_p)
        if params.top_k is not None:
            attributes["gen_ai.request.top_k"] = float(params.top_k)  # the convention's type: double
        if params.stop_sequences:
            attributes["gen_ai.request.stop_sequences"] = params.stop_sequences
        if f.session_id:
            attributes["gen_ai.conversation.id"] = f.session_id
        return attributes

    def _answer(self, attributes: dict[str, Any], f: Finished) -> None:
        """What the provider's answer said: its id, model, stop reason and usage (Anthropic's arithmetic:
        gen_ai.usage.input_tokens counts the cache reads and writes, which Anthropic reports apart)."""
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

    def _server_span(
        self, f: Finished, trace: RequestTrace, end_ns: int, operation: str, provider: str, error_type: str
    ) -> SpanRecord:
        route = trace.route or f.path
        attributes = self._common(f, trace, operation, trace.request_model, provider)
        attributes["http.request.method"] = f.method
        attributes["http.route"] = route
        attributes["url.path"] = f.path
        if f.status:
            attributes["http.response.status_code"] = f.status
        if f.outcome == "completed" or f.attempts:
            self._answer(attributes, f)
        if f.ttft is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = f.ttft
        if error_type:
            attributes["error.type"] = error_type
        _gateway_attributes(attributes, f)
        return SpanRecord(
            trace_id=trace.trace_id,
            span_id=trace.span_id,
            parent_span_id=trace.parent_id,
            trace_state=trace.trace_state,
            name=f"{f.method} {route}",
            kind=SPAN_KIND_SERVER,
            start_ns=trace.start_ns,
            end_ns=end_ns,
            attributes=attributes,
            status_code=STATUS_ERROR if error_type else 0,
            status_message=f.outcome if error_type else "",
            flags=trace.flags,
            parent_is_remote=bool(trace.parent_id),
        )

    def _client_span(
        self,
        f: Finished,
        trace: RequestTrace,
        attempt: AttemptSpan,
        n: int,
        serving: bool,
        end_ns: int,
        operation: str,
        request_error: str,
    ) -> SpanRecord:
        provider = GEN_AI_PROVIDERS.get(attempt.provider_kind, "")
        attributes = self._common(f, trace, operation, attempt.model, provider)
        error_type = attempt.error_type
        if attempt.url:
            address, port = _server(attempt.url)
            attributes["server.address"] = address
            attributes["server.port"] = port
        attributes["messages_gateway.provider"] = attempt.provider
        attributes["messages_gateway.attempt"] = n + 1
        if attempt.status:
            attributes["http.response.status_code"] = attempt.status
        if trace.inputs:  # (capture_content) what every attempt was sent
            attributes.update(trace.inputs)
        if not error_type and serving and trace.output is not None:
            attributes["gen_ai.output.messages"] = trace.output.attribute()
        if not error_type and serving:  # the attempt that answered: the answer is its
            self._answer(attributes, f)
            if f.upstream_wait is not None:
                attributes["gen_ai.response.time_to_first_chunk"] = f.upstream_wait
            if f.upstream_request_id:
                attributes["messages_gateway.upstream_request_id"] = f.upstream_request_id
            error_type = request_error  # a stream that broke, or a client that went away, ends it too
        if error_type:
            attributes["error.type"] = error_type
        return SpanRecord(
            trace_id=trace.trace_id,
            span_id=attempt.span_id,
            parent_span_id=trace.span_id,
            trace_state=trace.trace_state,
            name=f"{operation} {attempt.model}",
            kind=SPAN_KIND_CLIENT,
            start_ns=attempt.start_ns,
            end_ns=attempt.end_ns or end_ns,
            attributes=attributes,
            status_code=STATUS_ERROR if error_type else 0,
            status_message=error_type,
            flags=trace.flags,
        )

    def _metrics(
        self, genai: GenAiMetrics, f: Finished, trace: RequestTrace, operation: str, provider: str, error_type: str
    ) -> None:
        """``gen_ai.client.*`` per upstream attempt (the gateway is the provider's client), ``gen_ai.server.*`` per
        request (it is its clients' server), with the attributes the convention lists for each."""
        end_ns = time.time_ns()
        last = len(trace.attempts) - 1
        for n, attempt in enumerate(trace.attempts):
            failed = attempt.error_type or (error_type if n == last else "")
            attributes: list[tuple[str, Any]] = [
                ("gen_ai.operation.name", operation),
                ("gen_ai.provider.name", GEN_AI_PROVIDERS.get(attempt.provider_kind, "")),
                ("gen_ai.request.model", attempt.model),
            ]
            if n == last and f.response_model:
                attributes.append(("gen_ai.response.model", f.response_model))
            if attempt.url:
                address, port = _server(attempt.url)
                attributes += (("server.address", address), ("server.port", port))
            if failed:
                attributes.append(("error.type", failed))
            genai.record(CLIENT_DURATION, tuple(attributes), ((attempt.end_ns or end_ns) - attempt.start_ns) / 1e9)
            if n == last and operation == "chat" and not attempt.error_type:
                usage = f.usage
                if usage.input_tokens is not None or usage.output_tokens is not None:
                    base = tuple(a for a in attributes if a[0] != "error.type")
                    read, created = usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0
                    inputs = (usage.input_tokens or 0) + read + created
                    genai.record(TOKEN_USAGE, (*base, ("gen_ai.token.type", "input")), inputs)
                    genai.record(TOKEN_USAGE, (*base, ("gen_ai.token.type", "output")), usage.output_tokens or 0)
        if operation != "chat":
            return
        server: list[tuple[str, Any]] = [
            ("gen_ai.operation.name", operation),
            ("gen_ai.provider.name", provider),
            ("gen_ai.request.model", trace.request_model),
        ]
        if f.response_model:
            server.append(("gen_ai.response.model", f.response_model))
        if error_type:
            genai.record(SERVER_DURATION, (*server, ("error.type", error_type)), f.duration)
            return
        attributes_ok = tuple(server)
        genai.record(SERVER_DURATION, attributes_ok, f.duration)
        if f.ttft is not None:
            genai.record(TIME_TO_FIRST_TOKEN, attributes_ok, f.ttft)


def _gateway_attributes(attributes: dict[str, Any], f: Finished) -> None:
    """The gateway's own facts of a request, under ``messages_gateway.*`` (and ``enduser.id``)."""
    attributes["messages_gateway.request_id"] = f.request_id
    attributes["messages_gateway.outcome"] = f.outcome
    attributes["messages_gateway.attempts"] = f.attempts
    if f.alias:
        attributes["messages_gateway.alias"] = f.alias
    if f.provider:
        attributes["messages_gateway.provider"] = f.provider
    if f.model:
        attributes["messages_gateway.upstream_model"] = f.model
    if f.key_name:
        attributes["messages_gateway.key"] = f.key_name
    if f.team:
        attributes["messages_gateway.team"] = f.team
    if f.user:
        attributes["enduser.id"] = f.user
    if f.agent_id:
        attributes["messages_gateway.agent_id"] = f.agent_id
    if f.panic:
        attributes["messages_gateway.panic"] = True
    if f.limit:
        attributes["messages_gateway.limit"] = f.limit
    if f.cost_usd is not None:
        attributes["messages_gateway.cost_usd"] = f.cost_usd
    if f.upstream_request_id:
        attributes["messages_gateway.upstream_request_id"] = f.upstream_request_id
    if f.dropped:
        attributes["messages_gateway.dropped"] = f.dropped

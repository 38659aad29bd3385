"""The hand-written OTLP encoder (``gateway.observability.otlp_proto``) against the library it replaced: its bytes
decoded with the ``opentelemetry-proto`` messages, field by field, and compared (protobuf message equality) with
what the OpenTelemetry SDK's own encoder (``opentelemetry-exporter-otlp-proto-common``) makes of the same spans and
histograms, over Hypothesis-drawn attributes, ids, times, kinds, parents and statuses.

The one deliberate difference: ``Span.flags`` carries the span's W3C trace flags in its low 8 bits, as the OTLP
definition of the field says (and the Java and Go exporters do); the Python SDK 1.45 writes only the is-remote bits
(opentelemetry-python issue #4666). The comparisons add the trace flags to the SDK's message, and
``test_span_flags_are_the_sdks_when_no_trace_flags`` shows that without trace flags the two are the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics as sdk_encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricsData
from opentelemetry.sdk.metrics.export import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import HistogramDataPoint as SdkHistogramDataPoint
from opentelemetry.sdk.metrics.export import Metric as SdkMetric
from opentelemetry.sdk.metrics.export import ResourceMetrics as SdkResourceMetrics
from opentelemetry.sdk.metrics.export import ScopeMetrics as SdkScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from gateway.observability.otlp_proto import (
    SPAN_KIND_CLIENT,
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    TEMPORALITY_CUMULATIVE,
    TEMPORALITY_DELTA,
    Attributes,
    AttrValue,
    Histogram,
    HistogramPoint,
    SpanRecord,
    encode_metrics,
    encode_traces,
)

TRACE_ID = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
ROOT_ID = bytes.fromhex("00f067aa0ba902b7")
CHILD_ID = bytes.fromhex("b7ad6b7169203331")
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
SCHEMA_URL = "https://opentelemetry.io/schemas/1.26.0"


def decode_traces(body: bytes) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    message.ParseFromString(body)
    return message


def decode_metrics(body: bytes) -> ExportMetricsServiceRequest:
    message = ExportMetricsServiceRequest()
    message.ParseFromString(body)
    return message


def plain(value: AnyValue) -> Any:
    """An AnyValue as the Python value it holds (a list for an array), checking which member of the oneof is set."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return [plain(item) for item in value.array_value.values]
    assert which in ("string_value", "bool_value", "int_value", "double_value"), which
    return getattr(value, which)


def attributes_of(key_values: Sequence[Any]) -> list[tuple[str, Any, str | None]]:
    return [(kv.key, plain(kv.value), kv.value.WhichOneof("value")) for kv in key_values]


# --- decoded, field by field ----------------------------------------------------------------------------------------

ALL_KINDS: dict[str, Any] = {
    "http.request.method": "POST",
    "gateway.alias": "claude-sonnet-ünïcødé-模型",
    "empty": "",
    "long": "é" * 200,  # 400 bytes: the lengths are two-byte varints
    "cached": True,
    "streamed": False,
    "zero": 0,
    "tokens": 127,
    "more.tokens": 128,
    "big": INT64_MAX,
    "negative": -1,
    "smallest": INT64_MIN,
    "ratio": 0.25,
    "zero.ratio": 0.0,
    "tags": ["a", "ß", ""],
    "tuple.tags": ("x",),
    "no.tags": [],
}


def test_a_root_and_a_child_decode_field_by_field() -> None:
    root = SpanRecord(
        TRACE_ID,
        ROOT_ID,
        b"",
        "",
        "messages sonnet",
        SPAN_KIND_SERVER,
        1_700_000_000_000_000_000,
        1_700_000_000_250_000_000,
        ALL_KINDS,
        STATUS_OK,
    )
    child = SpanRecord(
        TRACE_ID,
        CHILD_ID,
        ROOT_ID,
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
        "upstream",
        SPAN_KIND_CLIENT,
        1_700_000_000_010_000_000,
        1_700_000_000_240_000_000,
        {"attempt": 2},
        STATUS_ERROR,
        "upstream timed out ⏱",
        flags=0,
    )
    remote_child = root._replace(span_id=CHILD_ID, parent_span_id=ROOT_ID, parent_is_remote=True, attributes={})
    body = encode_traces(
        {"service.name": "messages-gateway", "service.instance.id": "pod-1"},
        "messages-gateway",
        "0.1.0",
        [root, child, remote_child],
        schema_url=SCHEMA_URL,
    )
    message = decode_traces(body)

    assert len(message.resource_spans) == 1
    resource_spans = message.resource_spans[0]
    assert resource_spans.HasField("resource")
    assert attributes_of(resource_spans.resource.attributes) == [
        ("service.name", "messages-gateway", "string_value"),
        ("service.instance.id", "pod-1", "string_value"),
    ]
    assert resource_spans.resource.dropped_attributes_count == 0
    assert resource_spans.schema_url == SCHEMA_URL
    assert len(resource_spans.scope_spans) == 1
    scope_spans = resource_spans.scope_spans[0]
    assert scope_spans.scope.name == "messages-gateway"
    assert scope_spans.scope.version == "0.1.0"
    assert list(scope_spans.scope.attributes) == []
    assert scope_spans.schema_url == SCHEMA_URL
    assert len(scope_spans.spans) == 3
    first, second, third = scope_spans.spans

    assert first.trace_id == TRACE_ID
    assert first.span_id == ROOT_ID
    assert first.parent_span_id == b""
    assert first.trace_state == ""
    assert first.name == "messages sonnet"
    assert first.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert first.start_time_unix_nano == 1_700_000_000_000_000_000
    assert first.end_time_unix_nano == 1_700_000_000_250_000_000
    assert attributes_of(first.attributes) == [
        ("http.request.method", "POST", "string_value"),
        ("gateway.alias", "claude-sonnet-ünïcødé-模型", "string_value"),
        ("empty", "", "string_value"),
        ("long", "é" * 200, "string_value"),
        ("cached", True, "bool_value"),
        ("streamed", False, "bool_value"),
        ("zero", 0, "int_value"),
        ("tokens", 127, "int_value"),
        ("more.tokens", 128, "int_value"),
        ("big", INT64_MAX, "int_value"),
        ("negative", -1, "int_value"),
        ("smallest", INT64_MIN, "int_value"),
        ("ratio", 0.25, "double_value"),
        ("zero.ratio", 0.0, "double_value"),
        ("tags", ["a", "ß", ""], "array_value"),
        ("tuple.tags", ["x"], "array_value"),
        ("no.tags", [], "array_value"),
    ]
    assert all(item.WhichOneof("value") == "string_value" for item in first.attributes[14].value.array_value.values)
    assert first.HasField("status")
    assert first.status.code == trace_pb2.Status.STATUS_CODE_OK
    assert first.status.message == ""
    assert first.flags == trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | 1  # sampled, root: not remote
    assert (first.dropped_attributes_count, list(first.events), list(first.links)) == (0, [], [])

    assert second.span_id == CHILD_ID
    assert second.parent_span_id == ROOT_ID
    assert second.trace_state == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert second.name == "upstream"
    assert second.kind == trace_pb2.Span.SPAN_KIND_CLIENT
    assert attributes_of(second.attributes) == [("attempt", 2, "int_value")]
    assert second.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert second.status.message == "upstream timed out ⏱"
    assert second.flags == trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK  # not sampled, local parent

    assert third.parent_span_id == ROOT_ID
    assert list(third.attributes) == []
    assert third.flags == (
        trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | trace_pb2.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK | 1
    )


def test_defaults_are_left_out_and_presence_is_kept() -> None:
    span = SpanRecord(TRACE_ID, ROOT_ID, b"", "", "", 0, 0, 0, {}, flags=0, parent_is_remote=True)
    message = decode_traces(encode_traces({}, "", "", [span]))
    resource_spans = message.resource_spans[0]
    assert resource_spans.HasField("resource")  # as the SDK writes them: present, empty
    assert resource_spans.scope_spans[0].HasField("scope")
    assert resource_spans.schema_url == resource_spans.scope_spans[0].schema_url == ""
    decoded = resource_spans.scope_spans[0].spans[0]
    assert decoded.HasField("status")
    assert decoded.status.code == trace_pb2.Status.STATUS_CODE_UNSET
    # a root span's parent is never remote, whatever the record says
    assert decoded.flags == trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
    # the bytes: trace_id, span_id, the empty Status, the flags and nothing else
    assert message.resource_spans[0].scope_spans[0].spans[0].ByteSize() == 18 + 10 + 2 + 6


def test_nothing_to_export_is_an_empty_request() -> None:
    assert encode_traces({"service.name": "x"}, "s", "1", []) == b""
    assert encode_metrics({"service.name": "x"}, "s", "1", iter([])) == b""
    assert decode_traces(b"") == ExportTraceServiceRequest()


def test_values_outside_the_types_are_refused() -> None:
    span = SpanRecord(TRACE_ID, ROOT_ID, b"", "", "n", 1, 1, 2, {"too.big": 2**63})
    with pytest.raises(ValueError, match="outside int64"):
        encode_traces({}, "s", "", [span])
    with pytest.raises(ValueError, match="outside int64"):
        encode_traces({}, "s", "", [span._replace(attributes={"too.small": INT64_MIN - 1})])
    with pytest.raises(TypeError, match="NoneType"):
        encode_traces({}, "s", "", [span._replace(attributes={"none": None})])  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="bytes"):
        encode_traces({}, "s", "", [span._replace(attributes={"raw": b"x"})])  # type: ignore[dict-item]


def test_a_large_span_has_multi_byte_lengths() -> None:
    attributes: dict[str, Any] = {f"key.{i}": "v" * i for i in range(300)}  # a span of ~45 kB: 3-byte lengths
    span = SpanRecord(TRACE_ID, ROOT_ID, b"", "", "big", SPAN_KIND_SERVER, 1, 2, attributes)
    decoded = decode_traces(encode_traces({}, "s", "", [span, span])).resource_spans[0].scope_spans[0].spans
    assert len(decoded) == 2
    assert attributes_of(decoded[1].attributes) == [(k, v, "string_value") for k, v in attributes.items()]


def test_histogram_decodes_field_by_field() -> None:
    point = HistogramPoint(
        {"gateway.alias": "sonnet", "stream": True},
        1_700_000_000_000_000_000,
        1_700_000_060_000_000_000,
        7,
        12.5,
        [1, 0, 4, 2],
        [0.5, 1.0, 2.5],
        0.01,
        9.75,
    )
    empty = HistogramPoint({}, 0, 5, 0, 0.0, [0], [])  # sum 0.0 is still there, min and max are not
    metrics = [
        Histogram("gateway.request.duration", "Time of a request", "s", [point, empty], TEMPORALITY_DELTA),
        Histogram("gateway.idle", "", "", []),  # no points: no histogram field, as the SDK
    ]
    message = decode_metrics(encode_metrics({"service.name": "gw"}, "gw", "0.1.0", metrics, SCHEMA_URL))

    resource_metrics = message.resource_metrics[0]
    assert attributes_of(resource_metrics.resource.attributes) == [("service.name", "gw", "string_value")]
    assert resource_metrics.schema_url == SCHEMA_URL
    scope_metrics = resource_metrics.scope_metrics[0]
    assert (scope_metrics.scope.name, scope_metrics.scope.version, scope_metrics.schema_url) == (
        "gw",
        "0.1.0",
        SCHEMA_URL,
    )
    duration, idle = scope_metrics.metrics
    assert (duration.name, duration.description, duration.unit) == (
        "gateway.request.duration",
        "Time of a request",
        "s",
    )
    assert duration.WhichOneof("data") == "histogram"
    assert duration.histogram.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    first, second = duration.histogram.data_points
    assert attributes_of(first.attributes) == [
        ("gateway.alias", "sonnet", "string_value"),
        ("stream", True, "bool_value"),
    ]
    assert first.start_time_unix_nano == 1_700_000_000_000_000_000
    assert first.time_unix_nano == 1_700_000_060_000_000_000
    assert first.count == 7
    assert first.HasField("sum")
    assert first.sum == 12.5
    assert list(first.bucket_counts) == [1, 0, 4, 2]
    assert list(first.explicit_bounds) == [0.5, 1.0, 2.5]
    assert (first.HasField("min"), first.min, first.HasField("max"), first.max) == (True, 0.01, True, 9.75)
    assert (first.flags, list(first.exemplars)) == (0, [])
    assert (second.start_time_unix_nano, second.time_unix_nano, second.count) == (0, 5, 0)
    assert second.HasField("sum")
    assert second.sum == 0.0
    assert list(second.bucket_counts) == [0]
    assert list(second.explicit_bounds) == []
    assert not second.HasField("min")
    assert not second.HasField("max")
    assert idle.name == "gateway.idle"
    assert idle.WhichOneof("data") is None


# --- against the SDK's encoder ----------------------------------------------------------------------------------

SDK_KINDS = {1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT, 4: SpanKind.PRODUCER, 5: SpanKind.CONSUMER}
TRACE_STATES = ["", "congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"]

keys = st.text(max_size=12) | st.sampled_from(["http.request.method", "gen_ai.request.model", "service.name"])
values = (
    st.text()
    | st.text(alphabet="é模x", min_size=60, max_size=150)  # past one-byte lengths
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.sampled_from([0, 1, -1, 127, 128, 16383, 16384, INT64_MAX, INT64_MIN])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.lists(st.text(max_size=8), max_size=4)
    | st.lists(st.text(max_size=8), max_size=3).map(tuple)
)
attribute_dicts = st.dictionaries(keys, values, max_size=25)
resource_dicts = st.dictionaries(keys.filter(bool), values, max_size=6)  # the SDK's Resource drops an empty key


@st.composite
def span_records(draw: st.DrawFn, trace_id: bytes, parent: bytes) -> SpanRecord:
    status_code = draw(st.sampled_from([STATUS_UNSET, STATUS_OK, STATUS_ERROR]))
    return SpanRecord(
        trace_id=trace_id,
        span_id=draw(st.binary(min_size=8, max_size=8)),
        parent_span_id=parent,
        trace_state=draw(st.sampled_from(TRACE_STATES)),
        name=draw(st.text(max_size=40)),
        kind=draw(st.sampled_from(sorted(SDK_KINDS))),
        start_ns=draw(st.integers(0, 2**64 - 1)),
        end_ns=draw(st.integers(0, 2**64 - 1)),
        attributes=draw(attribute_dicts),
        status_code=status_code,
        # the SDK's Status keeps a description only with ERROR
        status_message=draw(st.text(max_size=30)) if status_code == STATUS_ERROR else "",
        flags=draw(st.integers(0, 255)),
        parent_is_remote=bool(parent) and draw(st.booleans()),
    )


@st.composite
def traces(draw: st.DrawFn) -> list[SpanRecord]:
    """A root span, a child of it, and more spans of the same or other traces with and without parents."""
    trace_id = draw(st.binary(min_size=16, max_size=16))
    root = draw(span_records(trace_id, b""))
    spans = [root, draw(span_records(trace_id, root.span_id))]
    for _ in range(draw(st.integers(0, 3))):
        parent = draw(st.sampled_from([b"", root.span_id]) | st.binary(min_size=8, max_size=8))
        spans.append(draw(span_records(draw(st.binary(min_size=16, max_size=16)), parent)))
    return spans


def sdk_span(record: SpanRecord, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """The same span as the SDK's ReadableSpan."""
    trace_id = int.from_bytes(record.trace_id, "big")
    context = SpanContext(
        trace_id,
        int.from_bytes(record.span_id, "big"),
        is_remote=False,
        trace_flags=TraceFlags(record.flags),
        trace_state=TraceState.from_header([record.trace_state]) if record.trace_state else TraceState(),
    )
    parent = None
    if record.parent_span_id:
        parent = SpanContext(trace_id, int.from_bytes(record.parent_span_id, "big"), is_remote=record.parent_is_remote)
    return ReadableSpan(
        name=record.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=record.attributes,
        kind=SDK_KINDS[record.kind],
        status=Status(StatusCode(record.status_code), record.status_message or None),
        start_time=record.start_ns,
        end_time=record.end_ns,
        instrumentation_scope=scope,
    )


def sdk_traces(
    resource: Attributes, scope_name: str, scope_version: str, spans: list[SpanRecord], schema_url: str
) -> ExportTraceServiceRequest:
    """What the SDK's encoder makes of the spans, with the spans' W3C trace flags added to Span.flags (the module's
    docstring)."""
    sdk_resource = Resource(resource, schema_url)  # not Resource.create: no default attributes
    scope = InstrumentationScope(scope_name, scope_version, schema_url)
    expected = sdk_encode_spans([sdk_span(record, sdk_resource, scope) for record in spans])
    for encoded, record in zip(expected.resource_spans[0].scope_spans[0].spans, spans, strict=True):
        encoded.flags |= record.flags
    return expected


@settings(max_examples=300, deadline=None)
@given(
    resource=resource_dicts,
    scope_name=st.text(max_size=20),
    scope_version=st.text(max_size=10),
    spans=traces(),
    schema_url=st.sampled_from(["", SCHEMA_URL]),
)
def test_traces_are_the_sdks(
    resource: dict[str, Any], scope_name: str, scope_version: str, spans: list[SpanRecord], schema_url: str
) -> None:
    body = encode_traces(resource, scope_name, scope_version, spans, schema_url)
    expected = sdk_traces(resource, scope_name, scope_version, spans, schema_url)
    assert decode_traces(body) == expected
    assert body == expected.SerializeToString()  # and the same bytes: the fields in field-number order, no extras


def test_the_deterministic_spans_are_the_sdks_byte_for_byte() -> None:
    """Beyond message equality: the fields in field-number order, as protobuf writes them."""
    root = SpanRecord(
        TRACE_ID, ROOT_ID, b"", "congo=t61rcWkgMzE", "messages sonnet", SPAN_KIND_SERVER, 10, 20, ALL_KINDS
    )
    child = SpanRecord(
        TRACE_ID, CHILD_ID, ROOT_ID, "", "upstream", SPAN_KIND_CLIENT, 11, 19, {"a": 1}, STATUS_ERROR, "boom", 1, True
    )
    resource: dict[str, AttrValue] = {"service.name": "messages-gateway", "tags": ("a", "b")}
    body = encode_traces(resource, "gw", "1", [root, child], SCHEMA_URL)
    assert body == sdk_traces(resource, "gw", "1", [root, child], SCHEMA_URL).SerializeToString(deterministic=True)


def test_span_flags_are_the_sdks_when_no_trace_flags() -> None:
    """With trace flags 0 the SDK's message is ours as it is: only the is-remote bits, computed as the SDK does."""
    root = SpanRecord(TRACE_ID, ROOT_ID, b"", "", "root", SPAN_KIND_SERVER, 1, 2, {}, flags=0)
    local = root._replace(span_id=CHILD_ID, parent_span_id=ROOT_ID)
    remote = local._replace(parent_is_remote=True)
    spans = [root, local, remote]
    scope = InstrumentationScope("gw", "1")
    expected = sdk_encode_spans([sdk_span(record, Resource({}), scope) for record in spans])
    ours = decode_traces(encode_traces({}, "gw", "1", spans))
    assert ours == expected
    assert [span.flags for span in ours.resource_spans[0].scope_spans[0].spans] == [0x100, 0x100, 0x300]


bounds_lists = st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=5, unique=True).map(sorted)
maybe_floats = st.none() | st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def histogram_points(draw: st.DrawFn) -> HistogramPoint:
    bounds = draw(bounds_lists)
    return HistogramPoint(
        attributes=draw(attribute_dicts),
        start_ns=draw(st.integers(0, 2**64 - 1)),
        time_ns=draw(st.integers(0, 2**64 - 1)),
        count=draw(st.integers(0, 2**64 - 1)),
        sum=draw(st.floats(allow_nan=False, allow_infinity=False)),
        bucket_counts=draw(st.lists(st.integers(0, 2**64 - 1), min_size=len(bounds) + 1, max_size=len(bounds) + 1)),
        bounds=bounds,
        min=draw(maybe_floats),
        max=draw(maybe_floats),
    )


histograms = st.builds(
    Histogram,
    name=st.text(max_size=30),
    description=st.text(max_size=30),
    unit=st.sampled_from(["", "s", "ms", "{token}"]),
    points=st.lists(histogram_points(), max_size=3),
    temporality=st.sampled_from([TEMPORALITY_DELTA, TEMPORALITY_CUMULATIVE]),
)


def sdk_metrics(
    resource: Attributes, scope_name: str, scope_version: str, metrics: list[Histogram], schema_url: str
) -> ExportMetricsServiceRequest:
    scope = InstrumentationScope(scope_name, scope_version, schema_url)
    sdk_histograms = [
        SdkMetric(
            name=metric.name,
            description=metric.description,
            unit=metric.unit,
            data=SdkHistogram(
                data_points=[
                    SdkHistogramDataPoint(
                        attributes=point.attributes,
                        start_time_unix_nano=point.start_ns,
                        time_unix_nano=point.time_ns,
                        count=point.count,
                        sum=point.sum,
                        bucket_counts=point.bucket_counts,
                        explicit_bounds=point.bounds,
                        min=point.min,  # type: ignore[arg-type]  # None: not set, as in ours
                        max=point.max,  # type: ignore[arg-type]
                    )
                    for point in metric.points
                ],
                aggregation_temporality=AggregationTemporality(metric.temporality),
            ),
        )
        for metric in metrics
    ]
    data = MetricsData(
        [
            SdkResourceMetrics(
                Resource(resource, schema_url), [SdkScopeMetrics(scope, sdk_histograms, schema_url)], schema_url
            )
        ]
    )
    return sdk_encode_metrics(data)


@settings(max_examples=200, deadline=None)
@given(
    resource=resource_dicts,
    scope_name=st.text(max_size=20),
    scope_version=st.text(max_size=10),
    metrics=st.lists(histograms, min_size=1, max_size=3),
    schema_url=st.sampled_from(["", SCHEMA_URL]),
)
def test_metrics_are_the_sdks(
    resource: dict[str, Any], scope_name: str, scope_version: str, metrics: list[Histogram], schema_url: str
) -> None:
    body = encode_metrics(resource, scope_name, scope_version, metrics, schema_url)
    expected = sdk_metrics(resource, scope_name, scope_version, metrics, schema_url)
    assert decode_metrics(body) == expected
    assert body == expected.SerializeToString()

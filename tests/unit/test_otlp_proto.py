"""The hand-written OTLP encoder (``gateway.observability.otlp_proto``) against the library it replaced: its bytes
decoded with the ``opentelemetry-proto`` messages, field by field, and compared (protobuf message equality) with
what the OpenTelemetry SDK's own encoder (``opentelemetry-exporter-otlp-proto-common``) makes of the same spans and
histograms, over Hypothesis-drawn attributes, ids, times, kinds, parents and statuses.

The one deliberate difference: ``Span.flags`` carries the span's W3C trace flags in its low 8 bits, as the OTLP
definition of the field says (and the Java and Go exporters do); the Python SDK 1.45 writes only the is-remote bits
(opentelemetry-python issue #4666). The comparisons add the trace flags to the SDK's message, and
``test_span_flags_are_the_sdks_when_no_trace_flags`` shows that without trace flags the two are the same.

The encoder's compiled hot spots (``gateway.observability._otlp_c``, in use when built: ``IMPLEMENTATION``) are
compared with the pure-Python functions they replace, byte for byte, over Hypothesis-drawn attributes and spans,
errors included; the tests above run with whichever is in use, and ``test_the_fallback_writes_the_same_requests``
runs whole requests through both. The compiled module's tests are skipped when it is not built, unless
MESSAGES_GATEWAY_REQUIRE_EXTENSION is set: then they fail."""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import struct
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from enum import IntEnum
from types import MappingProxyType, ModuleType
from typing import Any, NamedTuple
from unittest import mock

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

from gateway.observability import otlp_proto
from gateway.observability.otlp_proto import (
    IMPLEMENTATION,
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
    _attributes,
    _span,
    encode_attributes,
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


# --- the compiled twins ---------------------------------------------------------------------------------------------


def _compiled() -> ModuleType | None:
    try:
        return importlib.import_module("gateway.observability._otlp_c")
    except ImportError:
        return None


C = _compiled()
REQUIRE_EXTENSION = bool(os.environ.get("MESSAGES_GATEWAY_REQUIRE_EXTENSION"))
needs_c = pytest.mark.skipif(
    C is None and not REQUIRE_EXTENSION, reason="gateway.observability._otlp_c is not built: nothing to compare"
)


def test_the_compiled_encoder_is_in_use() -> None:
    """When the extension was built (its file is there), it must import and be the encoder's."""
    built = importlib.util.find_spec("gateway.observability._otlp_c") is not None
    if REQUIRE_EXTENSION:
        assert built, "gateway.observability._otlp_c was not built"
    if built:
        assert C is not None
        assert IMPLEMENTATION == "c"
        assert otlp_proto._encode_attributes is C.attributes
        assert otlp_proto._c_span is C.span
    else:
        assert IMPLEMENTATION == "python"
        assert otlp_proto._encode_attributes is otlp_proto._attributes_by_tag
        assert otlp_proto._c_span is None


def c_attributes(attributes: Mapping[str, Any], tag: bytes) -> bytes:
    assert C is not None, "gateway.observability._otlp_c was not built"
    out: bytes = C.attributes(attributes, tag[0])
    return out


def c_span(span: SpanRecord) -> bytes:
    assert C is not None, "gateway.observability._otlp_c was not built"
    out: bytes = C.span(*span)
    return out


def outcome(function: Any, *args: Any) -> tuple[str, Any]:
    """What a call returns, or the type and message of what it raises: for comparing two functions' errors."""
    try:
        return "returned", function(*args)
    except Exception as exc:  # every exception: whichever it is, the other function must raise the same
        return type(exc).__name__, str(exc)


def same_attributes(attributes: Mapping[str, Any]) -> None:
    for tag in (b"\x0a", b"\x4a"):
        assert outcome(c_attributes, attributes, tag) == outcome(_attributes, attributes, tag)


def same_span(span: SpanRecord) -> None:
    assert outcome(c_span, span) == outcome(_span, span)


INT64_EDGES = [0, 1, -1, 127, 128, 16383, 16384, 2**21, 2**31, -(2**31), INT64_MAX, INT64_MAX - 1, INT64_MIN]
FLOAT_EDGES = [0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf, 5e-324, -1.5, 2.0**63, 1e308]

scalars = (
    st.text()
    | st.text(alphabet="é模x\U0001f600\x00", min_size=60, max_size=150)  # past one-byte lengths
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.sampled_from(INT64_EDGES)
    | st.floats()  # NaN, the infinities, -0.0 and subnormals among them
    | st.sampled_from(FLOAT_EDGES)
    | st.binary(min_size=8, max_size=8).map(lambda b: struct.unpack("<d", b)[0])  # any double, NaN payloads too
)
any_values: st.SearchStrategy[Any] = (
    scalars
    | st.integers(16_384, 17_000).map(lambda n: "é" * (n // 2 + 1))  # > 16 KiB: three-byte lengths
    | st.lists(st.text(max_size=8), max_size=4)
    | st.lists(st.text(max_size=8), max_size=3).map(tuple)
    | st.just([])
    | st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple), max_leaves=10
    )
)
any_keys = keys | st.text(alphabet="ké", min_size=100, max_size=140) | st.just("")
any_attribute_dicts = st.dictionaries(any_keys, any_values, max_size=40)  # past the 32 kept on the C stack


@needs_c
@settings(max_examples=500, deadline=None)
@given(attributes=any_attribute_dicts)
def test_compiled_attributes_are_the_pythons(attributes: dict[str, Any]) -> None:
    for tag in (b"\x0a", b"\x4a"):
        assert c_attributes(attributes, tag) == _attributes(attributes, tag)


ids = st.binary(max_size=20) | st.binary(min_size=16, max_size=16) | st.binary(min_size=8, max_size=8)
texts = st.text(max_size=40) | st.just("") | st.text(alphabet="ü⏱\U0001f600", min_size=1, max_size=80)
times = st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1])
enums = st.sampled_from([0, 1, 2, 3, 5]) | st.integers(INT64_MIN, INT64_MAX) | st.sampled_from(INT64_EDGES)


@st.composite
def any_spans(draw: st.DrawFn) -> SpanRecord:
    attributes: Attributes | bytes = draw(
        any_attribute_dicts
        | any_attribute_dicts.map(lambda a: _attributes(a, b"\x4a"))  # as encode_attributes makes them
        | st.binary(max_size=300)  # any bytes: written as they are
    )
    return SpanRecord(
        trace_id=draw(ids),
        span_id=draw(ids),
        parent_span_id=draw(st.just(b"") | ids),
        trace_state=draw(texts),
        name=draw(texts | st.integers(16_384, 16_500).map(lambda n: "n" * n)),
        kind=draw(enums),
        start_ns=draw(times),
        end_ns=draw(times),
        attributes=attributes,
        status_code=draw(enums),
        status_message=draw(texts),
        flags=draw(st.integers(0, 255) | st.integers(-(2**70), 2**70)),
        parent_is_remote=draw(st.booleans()),
    )


@needs_c
@settings(max_examples=1000, deadline=None)
@given(span=any_spans())
def test_compiled_spans_are_the_pythons(span: SpanRecord) -> None:
    assert c_span(span) == _span(span)


@needs_c
@pytest.mark.parametrize("parent", [b"", ROOT_ID, b"\x01\x02\x03"], ids=["root", "parent", "odd-parent"])
@pytest.mark.parametrize("remote", [False, True])
@pytest.mark.parametrize(
    "status",
    [
        (STATUS_UNSET, ""),
        (STATUS_OK, ""),
        (STATUS_ERROR, ""),
        (STATUS_ERROR, "boom"),
        (STATUS_UNSET, "message only"),
        (7, "x" * 200),
        (-1, ""),
        (INT64_MIN, "é"),
    ],
)
@pytest.mark.parametrize("attributes", [{}, b"", ALL_KINDS, b"as they are"], ids=["none", "no-bytes", "dict", "bytes"])
def test_every_kind_of_span_is_the_pythons(
    parent: bytes, remote: bool, status: tuple[int, str], attributes: Attributes | bytes
) -> None:
    code, message = status
    for trace_id, span_id in ((TRACE_ID, CHILD_ID), (b"", b""), (b"\x01", b"abc"), (b"t" * 300, b"s" * 17)):
        span = SpanRecord(trace_id, span_id, parent, "", "", 0, 0, 0, attributes, code, message, 0, remote)
        same_span(span)
        same_span(span._replace(trace_state="congo=t61rcWkgMzE", name="ünïcødé", kind=SPAN_KIND_CLIENT))
        same_span(span._replace(start_ns=1, end_ns=2**64 - 1, flags=0x1FF, kind=-5))


@needs_c
def test_large_messages_are_the_pythons() -> None:
    huge = "ü" * 1_100_000  # 2.2 MB: four-byte lengths
    attributes: dict[str, Any] = {"huge": huge, "list": [huge, "x"], f"k{'e' * 20_000}": 1}
    attributes |= {f"key.{i}": i if i % 2 else f"v{i}" for i in range(1000)}  # many more than the C stack holds
    same_attributes(attributes)
    same_span(SpanRecord(TRACE_ID, ROOT_ID, b"", huge, huge, 2, 1, 2, attributes, STATUS_ERROR, huge))
    assert len(c_attributes({"huge": huge}, b"\x4a")) == 1 + 4 + 1 + 5 + 1 + 4 + 1 + 4 + 2_200_000


class Kind(IntEnum):
    SERVER = 2
    BIG = INT64_MAX


class Pair(NamedTuple):
    first: str
    second: int


class Text(str):
    pass


class Number(float):
    pass


class Items(list[Any]):
    pass


class Attrs(Mapping[str, Any]):
    """A mapping that is not a dict: read through items()."""

    def __init__(self, items: dict[str, Any]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@needs_c
def test_subclasses_and_other_mappings_are_the_pythons() -> None:
    values: dict[str, Any] = {
        "enum": Kind.SERVER,
        "big.enum": Kind.BIG,
        "pair": Pair("a", 1),
        "text": Text("té"),
        "number": Number(0.5),
        "items": Items(["a", Text("b"), Kind.SERVER, [True, -0.0]]),
        "": "no key",
        "empty.list": [],
        "empty.tuple": (),
        "nested.empty": [[], ()],
    }
    same_attributes(values)
    ordered = OrderedDict(values)
    ordered.move_to_end("enum")  # items() in the OrderedDict's order, not its dict's
    mappings: list[Mapping[str, Any]] = [ordered, MappingProxyType(values), Attrs(values), {}, OrderedDict(), Attrs({})]
    for mapping in mappings:
        same_attributes(mapping)
        same_span(SpanRecord(TRACE_ID, ROOT_ID, b"", "", "n", Kind.SERVER, 1, 2, mapping))
    assert c_attributes(ordered, b"\x4a").endswith(_attributes({"enum": Kind.SERVER}, b"\x4a"))


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    attributes=st.dictionaries(keys, scalars, max_size=10),
    bad=st.sampled_from([2**63, INT64_MIN - 1, 2**200, None, b"raw", object(), {"a": 1}, {1, 2}, "\ud800", Number, 1j]),
    where=st.sampled_from(["value", "list", "nested", "tuple"]),
    position=st.integers(0, 10),
)
def test_compiled_errors_are_the_pythons(attributes: dict[str, Any], bad: Any, where: str, position: int) -> None:
    """ValueError outside int64, TypeError for another type (the same messages), UnicodeEncodeError for a lone
    surrogate: wherever the bad value is, at the top or inside an array."""
    value = {"value": bad, "list": ["ok", bad], "nested": [1, [2.5, [bad]]], "tuple": (bad,)}[where]
    items = list(attributes.items())
    items.insert(min(position, len(items)), ("bad", value))
    bad_attributes = dict(items)
    c, python = outcome(c_attributes, bad_attributes, b"\x4a"), outcome(_attributes, bad_attributes, b"\x4a")
    assert c == python
    assert c[0] in ("ValueError", "TypeError", "UnicodeEncodeError")
    span = SpanRecord(TRACE_ID, ROOT_ID, b"", "", "n", 2, 1, 2, bad_attributes)
    assert outcome(c_span, span) == outcome(_span, span) == c


@needs_c
def test_compiled_span_field_errors_are_the_pythons() -> None:
    span = SpanRecord(TRACE_ID, ROOT_ID, ROOT_ID, "", "n", SPAN_KIND_SERVER, 1, 2, {"a": 1}, STATUS_ERROR, "m")
    bad_spans = [
        span._replace(kind=2**63),
        span._replace(kind=INT64_MIN - 1),
        span._replace(status_code=2**64),
        span._replace(status_message="\udfff"),
        span._replace(name="\ud800"),
        span._replace(trace_state="\ud800"),
        span._replace(start_ns=-1),
        span._replace(end_ns=2**64),
        span._replace(end_ns=1.5),  # type: ignore[arg-type]
    ]
    for bad in bad_spans:
        c, python = outcome(c_span, bad), outcome(_span, bad)
        assert c == python, bad
        assert c[0] in ("ValueError", "UnicodeEncodeError", "error"), c  # error: struct.error
    # what Python reads as false is left out, as ``if x:`` does
    same_span(span._replace(parent_span_id=None, status_message=None, trace_state=None, kind=None))  # type: ignore[arg-type]
    same_span(span._replace(start_ns=False, end_ns=True, flags=True, status_code=False, parent_is_remote=1))  # type: ignore[arg-type]


@needs_c
def test_compiled_refusals() -> None:
    """What the compiled functions refuse where the Python ones raise something else, or nothing."""
    assert C is not None
    with pytest.raises(ValueError, match="tag must be"):
        C.attributes({}, 0x12)
    with pytest.raises(TypeError, match="keys must be str"):
        C.attributes({1: "x"}, 0x4A)
    with pytest.raises(TypeError, match="13 arguments"):
        C.span(*SpanRecord(TRACE_ID, ROOT_ID, b"", "", "n", 2, 1, 2, {})[:12])
    with pytest.raises(TypeError, match="trace_id must be bytes"):
        C.span(*SpanRecord(bytearray(TRACE_ID), ROOT_ID, b"", "", "n", 2, 1, 2, {}))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="flags must be int"):
        C.span(*SpanRecord(TRACE_ID, ROOT_ID, b"", "", "n", 2, 1, 2, {}, flags=1.0))  # type: ignore[arg-type]
    recursive: list[Any] = ["a"]
    recursive.append(recursive)
    for attributes in ({"loop": recursive}, Attrs({"loop": recursive})):
        with pytest.raises(RecursionError):
            C.attributes(attributes, 0x4A)
        with pytest.raises(RecursionError):
            _attributes(attributes, b"\x4a")


@contextmanager
def pure_python() -> Iterator[None]:
    """otlp_proto as it is without the extension: the pure-Python functions."""
    with (
        mock.patch.object(otlp_proto, "_c_span", None),
        mock.patch.object(otlp_proto, "_encode_attributes", otlp_proto._attributes_by_tag),
    ):
        yield


@settings(max_examples=100, deadline=None)
@given(
    resource=resource_dicts,
    spans=traces(),
    metrics=st.lists(histograms, min_size=1, max_size=2),
    schema_url=st.sampled_from(["", SCHEMA_URL]),
)
def test_the_fallback_writes_the_same_requests(
    resource: dict[str, Any], spans: list[SpanRecord], metrics: list[Histogram], schema_url: str
) -> None:
    """The public functions, with and without the extension, write the same bytes."""
    dicts: list[Attributes] = [span.attributes for span in spans if not isinstance(span.attributes, bytes)]
    encoded = [encode_attributes(attributes) for attributes in dicts]
    pre_encoded = [span._replace(attributes=attributes) for span, attributes in zip(spans, encoded, strict=True)]
    traces_body = encode_traces(resource, "gw", "1", spans + pre_encoded, schema_url)
    metrics_body = encode_metrics(resource, "gw", "1", metrics, schema_url)
    with pure_python():
        assert [encode_attributes(attributes) for attributes in dicts] == encoded
        assert encode_traces(resource, "gw", "1", spans + pre_encoded, schema_url) == traces_body
        assert encode_metrics(resource, "gw", "1", metrics, schema_url) == metrics_body


@settings(max_examples=100, deadline=None)
@given(spans=traces(), python=st.booleans())
def test_a_span_encoded_from_its_fields_is_the_records_span(spans: list[SpanRecord], python: bool) -> None:
    """``encode_span_fields`` (the tracer's path: no ``SpanRecord`` made) gives ``encode_span``'s bytes, compiled
    and pure-Python alike, for attributes given as a mapping or already encoded."""
    from gateway.observability.otlp_proto import encode_span, encode_span_fields

    with pure_python() if python else nullcontext():
        for record in spans:
            expected = encode_span(record)
            assert encode_span_fields(*record) == expected  # type: ignore[arg-type]
            encoded = record._replace(attributes=encode_attributes(record.attributes))  # type: ignore[arg-type]
            assert encode_span_fields(*encoded) == expected  # type: ignore[arg-type]

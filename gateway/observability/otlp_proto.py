"""OTLP protobuf request bodies, encoded by hand: ``ExportTraceServiceRequest`` and ``ExportMetricsServiceRequest``.

Why by hand: the background exporter encodes every traced request, and the OpenTelemetry SDK's encoder
(``opentelemetry-exporter-otlp-proto-common``, which builds ``google.protobuf`` message objects first) was measured
at ~26 µs per span. This module writes the protobuf wire format directly from plain tuples: stdlib only (no
``google.protobuf``, no ``opentelemetry``), sans-IO (bytes in memory, nothing sent), for the subset of OTLP the
gateway emits — spans without events or links, explicit-bucket histograms, attributes whose values are str, bool,
int, float or a sequence of str. ``tests/unit/test_otlp_proto.py`` decodes its output with the ``opentelemetry-proto``
messages and compares it with what the SDK's own encoder makes of the same spans and histograms (equal messages,
and the same bytes). For a span of 25 attributes it takes about a sixth of the SDK encoder's time (timeit, by hand).

Its two hot spots, the attributes (``_attributes``) and the Span message (``_span``), are also compiled:
``gateway/observability/_otlp_c.c``, which setup.py builds when there is a C compiler, writes the same bytes (the
tests compare the two, errors included, over Hypothesis-drawn attributes and spans): ~21 ns an attribute instead
of ~0.28 µs, a span of 25 attributes ~0.7 µs instead of ~8 µs, one whose attributes are already bytes ~0.2 µs instead
of ~1.1 µs (timeit, by hand). ``IMPLEMENTATION`` says which is in use: ``"c"``, or ``"python"`` when the extension
is missing; the pure-Python functions stay the fallback and the reference.

What it mirrors of the SDK's encoder (so the two decode to equal messages):

- proto3 defaults are left out (an empty string or bytes, a zero number), except where the field has presence: an
  attribute's value is always written (``False``, ``0``, ``""`` and ``[]`` included, so its ``oneof`` is set), as are
  ``Span.status``, ``Resource`` and ``InstrumentationScope`` (possibly empty messages) and ``HistogramDataPoint.sum``;
- ``Span.flags`` has ``SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`` (0x100) always and ``SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK``
  (0x200) when the span has a parent and that parent is remote. Unlike the Python SDK (1.45, opentelemetry-python
  issue #4666) but as the OTLP definition of the field says, and as the Java and Go exporters do, its low 8 bits are
  the span's W3C trace flags (``SpanRecord.flags``);
- a ``Histogram`` metric without data points carries no ``histogram`` field (the SDK only sets it per point).

And where it cannot: no spans (or no metrics) is an empty request (``b""``); ``schema_url`` is written on both the
resource and the scope level (``ResourceSpans``/``ScopeSpans``, ``ResourceMetrics``/``ScopeMetrics``). An int
attribute outside int64 raises ``ValueError``, a value of another type ``TypeError``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, NamedTuple, TypeAlias

__all__ = [
    "IMPLEMENTATION",
    "SPAN_KIND_CLIENT",
    "SPAN_KIND_SERVER",
    "STATUS_ERROR",
    "STATUS_OK",
    "STATUS_UNSET",
    "TEMPORALITY_CUMULATIVE",
    "TEMPORALITY_DELTA",
    "AttrValue",
    "Attributes",
    "Histogram",
    "HistogramPoint",
    "SpanRecord",
    "encode_attributes",
    "encode_metrics",
    "encode_span",
    "encode_span_fields",
    "encode_traces",
]

AttrValue: TypeAlias = str | bool | int | float | tuple[str, ...] | list[str]  # a str sequence: an ArrayValue
Attributes: TypeAlias = Mapping[str, AttrValue]

SPAN_KIND_SERVER: Final = 2
SPAN_KIND_CLIENT: Final = 3
STATUS_UNSET: Final = 0
STATUS_OK: Final = 1
STATUS_ERROR: Final = 2
TEMPORALITY_DELTA: Final = 1
TEMPORALITY_CUMULATIVE: Final = 2


class SpanRecord(NamedTuple):
    """One finished span. Ids are raw bytes (16 and 8); times are Unix nanoseconds."""

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes  # b"" for a root span
    trace_state: str  # the W3C tracestate header's value, "" for none
    name: str
    kind: int  # SPAN_KIND_*
    start_ns: int
    end_ns: int
    attributes: Attributes | bytes  # bytes: made by encode_attributes
    status_code: int = STATUS_UNSET
    status_message: str = ""
    flags: int = 1  # W3C trace flags (1: sampled), the low 8 bits of Span.flags
    parent_is_remote: bool = False  # the parent span context came from another process (traceparent)


class HistogramPoint(NamedTuple):
    """One explicit-bucket histogram data point: ``len(bucket_counts) == len(bounds) + 1``."""

    attributes: Attributes
    start_ns: int
    time_ns: int
    count: int  # type: ignore[assignment]  # the OTLP name; it hides tuple.count, which nothing here uses
    sum: float
    bucket_counts: Sequence[int]
    bounds: Sequence[float]
    min: float | None = None
    max: float | None = None


class Histogram(NamedTuple):
    """A histogram metric and its data points."""

    name: str
    description: str
    unit: str
    points: Sequence[HistogramPoint]
    temporality: int = TEMPORALITY_CUMULATIVE  # TEMPORALITY_*


# --- the wire format ------------------------------------------------------------------------------------------------

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_TWO64: Final = 1 << 64

_pack_u64 = struct.Struct("<Q").pack
_pack_u32 = struct.Struct("<I").pack
_pack_f64 = struct.Struct("<d").pack

_V1: Final = tuple(bytes((i,)) for i in range(128))  # the varints of one byte


def _varint(n: int) -> bytes:
    """The base-128 varint of a non-negative int (callers add 2**64 to a negative int64 first)."""
    if n < 0x80:
        return _V1[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int64(n: int) -> bytes:
    """The varint of an int64 (a negative one is 10 bytes, two's complement), or ValueError outside int64."""
    if 0 <= n < 0x80:
        return _V1[n]
    if not _INT64_MIN <= n <= _INT64_MAX:
        raise ValueError(f"{n} is outside int64")
    return _varint(n + _TWO64 if n < 0 else n)


def _field(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: its tag, the body's length, the body."""
    n = len(body)
    return tag + (_V1[n] if n < 0x80 else _varint(n)) + body


def _bytes(tag: bytes, data: bytes) -> bytes:
    """A bytes field, or nothing for the default b""."""
    return _field(tag, data) if data else b""


def _string(tag: bytes, text: str) -> bytes:
    """A string field, or nothing for the default ""."""
    return _field(tag, text.encode()) if text else b""


# KeyValue.key (field 1) of each attribute key, encoded once. Bounded: keys are a small fixed set in practice, and a
# process that makes up keys as it goes must not grow this forever (past the bound, keys are encoded each time).
_KEYS: dict[str, bytes] = {}
_KEYS_MAX: Final = 4096

# KeyValue.value (field 2, tag 0x12) of the values that are always the same bytes, and the start of the others'
_TRUE: Final = b"\x12\x02\x10\x01"  # AnyValue{bool_value (2): 1}
_FALSE: Final = b"\x12\x02\x10\x00"
_DOUBLE: Final = b"\x12\x09\x21"  # AnyValue{double_value (4): fixed64}, 9 bytes
_SMALL_INTS: Final = tuple(b"\x12\x02\x18" + bytes((i,)) for i in range(128))  # AnyValue{int_value (3): 0..127}
# an AnyValue{string_value (1)} of n < 126 bytes (its header) under KeyValue.value, and under ArrayValue.values (1)
_SHORT_STRINGS: Final = tuple(b"\x12" + bytes((n + 2,)) + b"\x0a" + bytes((n,)) for n in range(126))
_SHORT_ELEMENTS: Final = tuple(b"\x0a" + bytes((n + 2,)) + b"\x0a" + bytes((n,)) for n in range(126))
# The tag of the repeated KeyValue field and a one-byte length: Resource.attributes (1), Span.attributes and
# HistogramDataPoint.attributes (9)
_HEADERS: Final = {tag: tuple(tag + bytes((n,)) for n in range(128)) for tag in (b"\x0a", b"\x4a")}


def _key(key: str) -> bytes:
    encoded = _string(b"\x0a", key)  # "" is left out, as proto3 does
    if len(_KEYS) < _KEYS_MAX:
        _KEYS[key] = encoded
    return encoded


def _any_value(value: object) -> bytes:
    """An AnyValue message (without its field's tag and length) for a scalar or a sequence of scalars."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())  # string_value (1)
    if isinstance(value, bool):  # before int: bool is an int
        return b"\x10\x01" if value else b"\x10\x00"  # bool_value (2)
    if isinstance(value, int):
        return b"\x18" + _int64(value)  # int_value (3)
    if isinstance(value, float):
        return b"\x21" + _pack_f64(value)  # double_value (4)
    if isinstance(value, list | tuple):
        return _array(value)
    raise TypeError(f"unsupported attribute value {value!r} ({type(value).__name__})")


def _array(values: Sequence[object]) -> bytes:
    """AnyValue{array_value (5): ArrayValue{values (1): AnyValue...}}, a short str element's header from a table."""
    short_elements = _SHORT_ELEMENTS
    parts: list[bytes] = []
    for item in values:
        if type(item) is str:
            encoded = item.encode()
            n = len(encoded)
            if n < 0x7E:
                parts += (short_elements[n], encoded)
                continue
        parts.append(_field(b"\x0a", _any_value(item)))
    return _field(b"\x2a", b"".join(parts))


def _attributes(attributes: Attributes, tag: bytes) -> bytes:
    """Repeated KeyValue fields under ``tag`` (b"\\x0a" or b"\\x4a"). This runs for every attribute of every span:
    the common values (a str, bool, int or float whose KeyValue is under 128 bytes) are written from tables, their
    lengths added up rather than measured, as pieces of one join."""
    keys = _KEYS
    headers = _HEADERS[tag]
    short_strings = _SHORT_STRINGS
    parts: list[bytes] = []
    for key, value in attributes.items():
        encoded_key = keys.get(key)
        if encoded_key is None:
            encoded_key = _key(key)
        if isinstance(value, str):
            encoded = value.encode()
            n = len(encoded)
            size = len(encoded_key) + 4 + n
            if size < 0x80:
                parts += (headers[size], encoded_key, short_strings[n], encoded)
                continue
            value_field = _field(b"\x12", _field(b"\x0a", encoded))
        elif value is True:
            value_field = _TRUE
        elif value is False:
            value_field = _FALSE
        elif type(value) is int:
            if 0 <= value < 0x80:
                value_field = _SMALL_INTS[value]
            elif 0 < value < 0x4000:  # token counts and the like: a two-byte varint
                value_field = b"\x12\x03\x18" + bytes(((value & 0x7F) | 0x80, value >> 7))
            else:
                any_value = b"\x18" + _int64(value)
                value_field = b"\x12" + _V1[len(any_value)] + any_value  # at most 11 bytes
        elif type(value) is float:
            size = len(encoded_key) + 11
            if size < 0x80:
                parts += (headers[size], encoded_key, _DOUBLE, _pack_f64(value))
                continue
            value_field = _DOUBLE + _pack_f64(value)
        elif type(value) is tuple or type(value) is list:
            value_field = _field(b"\x12", _array(value))
        else:  # subclasses of str, bool, int, float, tuple and list
            value_field = _field(b"\x12", _any_value(value))
        size = len(encoded_key) + len(value_field)
        if size < 0x80:
            parts += (headers[size], encoded_key, value_field)
        else:
            parts += (tag, _varint(size), encoded_key, value_field)
    return b"".join(parts)


def _scope(name: str, version: str) -> bytes:
    """InstrumentationScope{name (1), version (2)} as field 1 of ScopeSpans/ScopeMetrics (always written)."""
    return _field(b"\x0a", _string(b"\x0a", name) + _string(b"\x12", version))


def _request(resource: Attributes, scope: bytes, items: list[bytes], schema_url: str) -> bytes:
    """The request around one resource and one scope: ``items`` (joined) are the ScopeSpans.spans or
    ScopeMetrics.metrics fields (both field 2). The trace and the metrics messages have the same shape and field
    numbers here. One join: each item is copied once (a batch is 100s of kB, and each copy of it a fresh buffer)."""
    url = _string(b"\x1a", schema_url)  # schema_url (3) of both levels
    resource_field = _field(b"\x0a", _encode_attributes(resource, _RESOURCE_ATTRIBUTES))  # resource (1)
    scoped_size = len(scope) + sum(map(len, items)) + len(url)
    # ResourceSpans.scope_spans / ResourceMetrics.scope_metrics (2)
    scoped_header = b"\x12" + _varint(scoped_size)
    # ExportTraceServiceRequest.resource_spans / ...resource_metrics (1): the resource, the scoped items, the url
    resourced_size = len(resource_field) + len(scoped_header) + scoped_size + len(url)
    parts = [b"\x0a", _varint(resourced_size), resource_field, scoped_header, scope]
    parts += items
    parts += (url, url)
    return b"".join(parts)


# --- traces ---------------------------------------------------------------------------------------------------------

_STATUS_CODE_ONLY: Final = {code: b"\x7a\x02\x18" + bytes((code,)) for code in (STATUS_OK, STATUS_ERROR)}
_FLAGS_TAG: Final = b"\x85\x01"  # Span.flags: field 16, fixed32
_HAS_IS_REMOTE: Final = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE: Final = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


def _span(span: SpanRecord) -> bytes:
    """A Span message (without its field's tag and length), its fields in field-number order."""
    (
        trace_id,
        span_id,
        parent_span_id,
        trace_state,
        name,
        kind,
        start_ns,
        end_ns,
        attributes,
        status_code,
        status_message,
        flags,
        parent_is_remote,
    ) = span
    parts = [
        (b"\x0a\x10" + trace_id) if len(trace_id) == 16 else _bytes(b"\x0a", trace_id),  # trace_id (1)
        (b"\x12\x08" + span_id) if len(span_id) == 8 else _bytes(b"\x12", span_id),  # span_id (2)
    ]
    if trace_state:
        parts.append(_field(b"\x1a", trace_state.encode()))  # trace_state (3)
    if parent_span_id:
        parts.append(_field(b"\x22", parent_span_id))  # parent_span_id (4)
    if name:
        parts.append(_field(b"\x2a", name.encode()))  # name (5)
    if kind:
        parts.append(b"\x30" + _int64(kind))  # kind (6), enum
    if start_ns:
        parts.append(b"\x39" + _pack_u64(start_ns))  # start_time_unix_nano (7), fixed64
    if end_ns:
        parts.append(b"\x41" + _pack_u64(end_ns))  # end_time_unix_nano (8), fixed64
    if attributes:
        # attributes (9), or the bytes encode_attributes made of them
        parts.append(attributes if isinstance(attributes, bytes) else _attributes(attributes, b"\x4a"))
    # status (15), always (the SDK sets it): Status{message (2), code (3)}
    if status_message:
        status = _field(b"\x12", status_message.encode())
        if status_code:
            status += b"\x18" + _int64(status_code)
        parts.append(_field(b"\x7a", status))
    elif status_code:
        parts.append(_STATUS_CODE_ONLY.get(status_code) or _field(b"\x7a", b"\x18" + _int64(status_code)))
    else:
        parts.append(b"\x7a\x00")
    # flags (16), fixed32: the W3C trace flags, and whether the parent is remote
    flags = (flags & 0xFF) | _HAS_IS_REMOTE
    if parent_is_remote and parent_span_id:
        flags |= _IS_REMOTE
    parts.append(_FLAGS_TAG + _pack_u32(flags))
    return b"".join(parts)


# --- the compiled twins ---------------------------------------------------------------------------------------------

_SPAN_ATTRIBUTES: Final = 0x4A  # the tag of Span.attributes and HistogramDataPoint.attributes (9)
_RESOURCE_ATTRIBUTES: Final = 0x0A  # the tag of Resource.attributes (1)


def _attributes_by_tag(attributes: Attributes, tag: int) -> bytes:
    """``_attributes`` with the tag as an int, as the compiled ``attributes`` takes it."""
    return _attributes(attributes, _V1[tag])


# What the encoder calls: the compiled twins when built, else the pure-Python functions above.
# _encode_attributes(attributes, tag) is _attributes(attributes, bytes([tag])); _c_span(*span), when not None, is
# _span(span).
_encode_attributes: Callable[[Attributes, int], bytes]
_c_span: Callable[..., bytes] | None
try:  # the same functions compiled (setup.py builds them when there is a C compiler)
    from gateway.observability._otlp_c import attributes as _encode_attributes
    from gateway.observability._otlp_c import span as _c_span

    IMPLEMENTATION = "c"
except ImportError:  # pragma: no cover - no compiler where it was installed
    _encode_attributes = _attributes_by_tag
    _c_span = None
    IMPLEMENTATION = "python"


def encode_attributes(attributes: Attributes) -> bytes:
    """``Span.attributes`` (field 9) as bytes, for a ``SpanRecord`` whose ``attributes`` are given so: groups of
    attributes encoded once and joined (``b"".join`` of two groups is the two groups' attributes, in order)."""
    return _encode_attributes(attributes, _SPAN_ATTRIBUTES)


def encode_traces(
    resource: Attributes,
    scope_name: str,
    scope_version: str,
    spans: Iterable[SpanRecord | bytes],
    schema_url: str = "",
) -> bytes:
    """A serialized ExportTraceServiceRequest: one ResourceSpans (``resource``'s attributes), one ScopeSpans
    (``scope_name``, ``scope_version``) with ``spans`` in order (a ``bytes`` one: ``encode_span``'s, as it is). No
    spans: ``b""`` (an empty request)."""
    parts = [span if type(span) is bytes else encode_span(span) for span in spans]  # type: ignore[arg-type]
    if not parts:
        return b""
    return _request(resource, _scope(scope_name, scope_version), parts, schema_url)


def encode_span_fields(
    trace_id: bytes,
    span_id: bytes,
    parent_span_id: bytes,
    trace_state: str,
    name: str,
    kind: int,
    start_ns: int,
    end_ns: int,
    attributes: bytes,
    status_code: int,
    status_message: str,
    flags: int,
    parent_is_remote: bool,
) -> bytes:
    """``encode_span`` of the ``SpanRecord`` these fields would make, without making it (the tracer's path)."""
    fields = (trace_id, span_id, parent_span_id, trace_state, name, kind, start_ns, end_ns, attributes, status_code)
    more = (status_message, flags, parent_is_remote)
    return _spans_field(_c_span(*fields, *more) if _c_span is not None else _span(SpanRecord(*fields, *more)))


def encode_span(span: SpanRecord) -> bytes:
    """One span as the ``ScopeSpans.spans`` field it becomes in ``encode_traces`` (which takes it as it is): a queue
    of these holds no Python object per attribute, and a span is encoded once, when it is made."""
    return _spans_field(_c_span(*span) if _c_span is not None else _span(span))


def _spans_field(body: bytes) -> bytes:
    """A Span message as field 2 of ``ScopeSpans``: its tag and length, then the message."""
    n = len(body)
    return b"\x12" + (_V1[n] if n < 0x80 else _varint(n)) + body


# --- metrics --------------------------------------------------------------------------------------------------------


def _point(point: HistogramPoint) -> bytes:
    """A HistogramDataPoint message (without its field's tag and length), its fields in field-number order."""
    attributes, start_ns, time_ns, count, total, bucket_counts, bounds, minimum, maximum = point
    parts: list[bytes] = []
    if start_ns:
        parts.append(b"\x11" + _pack_u64(start_ns))  # start_time_unix_nano (2), fixed64
    if time_ns:
        parts.append(b"\x19" + _pack_u64(time_ns))  # time_unix_nano (3), fixed64
    if count:
        parts.append(b"\x21" + _pack_u64(count))  # count (4), fixed64
    parts.append(b"\x29" + _pack_f64(total))  # sum (5), optional double: always (the SDK sets it)
    if bucket_counts:
        parts.append(_field(b"\x32", struct.pack(f"<{len(bucket_counts)}Q", *bucket_counts)))  # (6) packed fixed64
    if bounds:
        parts.append(_field(b"\x3a", struct.pack(f"<{len(bounds)}d", *bounds)))  # explicit_bounds (7), packed double
    if attributes:
        parts.append(_encode_attributes(attributes, _SPAN_ATTRIBUTES))  # attributes (9)
    if minimum is not None:
        parts.append(b"\x59" + _pack_f64(minimum))  # min (11), optional double
    if maximum is not None:
        parts.append(b"\x61" + _pack_f64(maximum))  # max (12), optional double
    return b"".join(parts)


def _metric(metric: Histogram) -> bytes:
    """A Metric message with its ``histogram`` (field 9), without its field's tag and length."""
    name, description, unit, points, temporality = metric
    body = _string(b"\x0a", name) + _string(b"\x12", description) + _string(b"\x1a", unit)
    if points:  # as the SDK: a metric without points has no data field
        histogram = b"".join([_field(b"\x0a", _point(point)) for point in points])  # Histogram.data_points (1)
        if temporality:
            histogram += b"\x10" + _int64(temporality)  # aggregation_temporality (2), enum
        body += _field(b"\x4a", histogram)
    return body


def encode_metrics(
    resource: Attributes,
    scope_name: str,
    scope_version: str,
    metrics: Iterable[Histogram],
    schema_url: str = "",
) -> bytes:
    """A serialized ExportMetricsServiceRequest: one ResourceMetrics (``resource``'s attributes), one ScopeMetrics
    (``scope_name``, ``scope_version``) with ``metrics`` in order. No metrics: ``b""`` (an empty request)."""
    items = [_field(b"\x12", _metric(metric)) for metric in metrics]  # ScopeMetrics.metrics (2)
    if not items:
        return b""
    return _request(resource, _scope(scope_name, scope_version), items, schema_url)

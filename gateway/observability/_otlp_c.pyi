"""The OTLP encoder's attributes and spans, compiled (gateway/observability/_otlp_c.c): the same bytes as
``otlp_proto._attributes`` and ``otlp_proto._span``."""

from collections.abc import Mapping

def attributes(attributes: Mapping[str, object], tag: int, /) -> bytes: ...
def span(
    trace_id: bytes,
    span_id: bytes,
    parent_span_id: bytes,
    trace_state: str,
    name: str,
    kind: int,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, object] | bytes,
    status_code: int,
    status_message: str,
    flags: int,
    parent_is_remote: bool,
    /,
) -> bytes: ...

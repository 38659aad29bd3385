"""The OTLP encoder's attributes and spans, compiled (gateway/observability/_otlp_c.c): the same bytes as
``otlp_proto._attributes`` and ``otlp_proto._span``, and a request's spans as ``tracing._request_spans_py``
makes them; ``record``, a batch of finished requests' metrics and spans as ``tracing._record_batch_py`` records
them; and ``Histogram``, ``genai_metrics.Series`` in C."""

from collections.abc import Callable, Mapping
from typing import Any

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
def request_spans(
    f: object,
    trace: object,
    end_ns: int,
    operation: str,
    provider: str,
    error_type: str,
    answer: bool,
    providers: dict[str, str],
    server: Callable[[str], tuple[str, int]],
    spans: list[bytes],
    /,
) -> None: ...
def record(
    pending: list[tuple[object, object, int]],
    traces: bool,
    providers: dict[str, str],
    server: Callable[[str], tuple[str, int]],
    spans: list[bytes],
    capture_build: Callable[..., None],
    hooks: tuple[dict[Any, Any], dict[Any, Any], Callable[[Any], Any], Callable[[Any], Any]] | None,
    /,
) -> None: ...

class Histogram:
    """One histogram series (genai_metrics.Series, compiled)."""

    def __init__(self, bounds: tuple[float, ...], start_ns: int) -> None: ...
    def add(self, value: float, /) -> None: ...
    @property
    def bounds(self) -> tuple[float, ...]: ...
    @property
    def counts(self) -> list[int]: ...
    @property
    def sum(self) -> float: ...
    @property
    def min(self) -> float: ...
    @property
    def max(self) -> float: ...
    @property
    def start_ns(self) -> int: ...

def bind(trace_type: type, attempt_type: type, getrandbits: Callable[[int], int], /) -> None: ...
def new_trace(bound: int, capture: bool, /) -> Any: ...
def attempt(trace: Any, provider: str, provider_kind: str, model: str, /) -> Any: ...
def request(trace: Any, model: str, head: Any, /) -> bool: ...
def set_aside(pending: list[Any], finished: Any, metrics: bool, traces: bool, /) -> int: ...

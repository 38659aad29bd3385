"""OpenTelemetry's GenAI histograms, aggregated in the process and exported over OTLP with the spans.

The four instruments of the convention's ``docs/gen-ai/gen-ai-metrics.md`` that a gateway sees, each with the
explicit bucket boundaries the convention gives it: ``gen_ai.client.token.usage`` and
``gen_ai.client.operation.duration`` (the gateway as its providers' client: per upstream attempt),
``gen_ai.server.request.duration`` and ``gen_ai.server.time_to_first_token`` (the gateway as its clients' server:
per request). A record is one call of a compiled ``Histogram`` (``_otlp_c``: ``Series`` in C, where ``Series``
stays the reference and the fallback) on a series found by one dict look-up; the data points are built only when
the exporter collects them (cumulative temporality, the OTLP default, from the process's start), so the Prometheus
metrics, which stay as they are, and these cost the request path about the same.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Any, Protocol

from gateway.observability.otlp_proto import TEMPORALITY_CUMULATIVE, Histogram, HistogramPoint

__all__ = [
    "CLIENT_DURATION",
    "INSTRUMENTS",
    "SERVER_DURATION",
    "TIME_TO_FIRST_TOKEN",
    "TOKEN_USAGE",
    "GenAiMetrics",
    "Instrument",
    "Series",
]

Attributes = tuple[tuple[str, Any], ...]

_TOKEN_BOUNDS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_DURATION_BOUNDS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class Instrument:
    __slots__ = ("bounds", "description", "name", "unit")

    def __init__(self, name: str, unit: str, description: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.bounds = bounds


TOKEN_USAGE, CLIENT_DURATION, SERVER_DURATION, TIME_TO_FIRST_TOKEN = range(4)
INSTRUMENTS = (
    Instrument("gen_ai.client.token.usage", "{token}", "Number of input and output tokens used.", _TOKEN_BOUNDS),
    Instrument("gen_ai.client.operation.duration", "s", "GenAI operation duration.", _DURATION_BOUNDS),
    Instrument("gen_ai.server.request.duration", "s", "Generative AI server request duration.", _DURATION_BOUNDS),
    Instrument(
        "gen_ai.server.time_to_first_token", "s", "Time to generate first token for successful responses.", _TTFT_BOUNDS
    ),
)


class Series:
    """One histogram series: its bucket counts, sum, min and max (``add`` is a ``bisect`` and four updates)."""

    __slots__ = ("bounds", "counts", "max", "min", "start_ns", "sum")

    def __init__(self, bounds: tuple[float, ...], start_ns: int) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        self.start_ns = start_ns

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # a bucket is (previous bound, bound]: OTLP's
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value


class Recorder(Protocol):
    """What a record goes to: a series (``Series``, ``Histogram``) or the overflow."""

    def add(self, value: float, /) -> None: ...


class SeriesData(Recorder, Protocol):
    """A series as ``collect`` reads it."""

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


class _Overflow:
    """Where a record goes past ``max_series``: counted, not kept."""

    def __init__(self, owner: GenAiMetrics) -> None:
        self._owner = owner

    def add(self, value: float, /) -> None:
        self._owner.overflow += 1


SeriesFactory = Callable[[tuple[float, ...], int], SeriesData]
COMPILED: SeriesFactory | None
try:  # Series in C (setup.py builds it when there is a C compiler)
    from gateway.observability._otlp_c import Histogram as COMPILED
except ImportError:  # pragma: no cover - no compiler where it was installed
    COMPILED = None


class GenAiMetrics:
    """The histograms' series, by instrument and attribute set."""

    def __init__(self, max_series: int = 2000, make: SeriesFactory | None = None) -> None:
        """``make``: the series' type (default: the compiled ``Histogram`` when built, else ``Series``)."""
        self._make: SeriesFactory = make or COMPILED or Series
        self._series: dict[tuple[int, Attributes], SeriesData] = {}
        self._max_series = max_series  # past it a new attribute set is not recorded (counted in `overflow`)
        self.overflow = 0
        self._overflow = _Overflow(self)

    def series(self, instrument: int, attributes: Attributes) -> Recorder:
        """The series of ``instrument`` with ``attributes`` (made on first use)."""
        key = (instrument, attributes)
        found = self._series.get(key)
        if found is None:
            if len(self._series) >= self._max_series:
                return self._overflow
            found = self._series[key] = self._make(INSTRUMENTS[instrument].bounds, time.time_ns())
        return found

    def collect(self, now_ns: int | None = None) -> list[Histogram]:
        """Every series' cumulative data point, by instrument."""
        now_ns = now_ns or time.time_ns()
        points: dict[int, list[HistogramPoint]] = {}
        for (instrument, attributes), series in self._series.items():  # (the event loop's: nothing records meanwhile)
            counts = list(series.counts)
            if not any(counts):  # made for a record that has not come (a failed attempt's tokens)
                continue
            points.setdefault(instrument, []).append(
                HistogramPoint(
                    attributes=dict(attributes),
                    start_ns=series.start_ns,
                    time_ns=now_ns,
                    count=sum(counts),
                    sum=series.sum,
                    bucket_counts=counts,
                    bounds=INSTRUMENTS[instrument].bounds,
                    min=series.min,
                    max=series.max,
                )
            )
        return [
            Histogram(
                name=INSTRUMENTS[i].name,
                description=INSTRUMENTS[i].description,
                unit=INSTRUMENTS[i].unit,
                points=points[i],
                temporality=TEMPORALITY_CUMULATIVE,
            )
            for i in sorted(points)
        ]

"""Optional OpenTelemetry spans (``pip install 'messages-gateway[otel]'``, ``server.tracing: true``).

One span per request, ``messages {alias}``, written when the request's usage is recorded, with its real
start and end times and the same low-cardinality facts as the access log (alias, provider, upstream model,
status, outcome, attempts, the four token counts, time to first token). Spans go to the global tracer
provider, which the operator configures the standard way (``opentelemetry-instrument``, ``OTEL_*``
variables, or their own SDK setup); without one they cost nothing. Never prompt text, never keys.
"""

from __future__ import annotations

from typing import Any

__all__ = ["request_tracer"]


def request_tracer(enabled: bool) -> Any:
    """The tracer to use, or None when tracing is off or OpenTelemetry is not installed."""
    if not enabled:
        return None
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - the extra is not installed
        import logging

        logging.getLogger("gateway").warning("server.tracing is on but opentelemetry-api is not installed")
        return None
    return trace.get_tracer("messages-gateway")

"""The per-request tally that records a request's usage exactly once (metrics, access line, span), over the
pure fold of ``gateway.fold``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.context import RequestContext
from gateway.events import EventView, Usage
from gateway.fold import EMPTY, fold_usage, overwrite_present, usage_of

if TYPE_CHECKING:
    from gateway.metrics import Metrics

__all__ = ["Outcome", "UsageTally", "access_line", "fold_usage", "overwrite_present", "usage_of"]

access_log = logging.getLogger("gateway.access")
"""One JSON line per request at INFO (``messages-gateway serve`` logs INFO; silence it with the logger's level)."""
_encode_line = msgspec.json.Encoder().encode


class Outcome:
    COMPLETED = "completed"
    UPSTREAM_ERROR = "upstream_error"
    CLIENT_CANCELLED = "client_cancelled"
    TIMEOUT = "timeout"
    REJECTED = "rejected"  # the request's own fault (4xx before routing or at it)
    INVALID_STREAM = "invalid_stream"
    INTERNAL_ERROR = "internal_error"  # an exception the gateway did not handle: 500 api_error
    SHED = "shed"  # server.max_inflight reached: 529 at once
    CLIENT_TIMEOUT = "client_timeout"  # the client went silent mid-request (server.client_timeout_s): 408


def access_line(
    *,
    request_id: str,
    method: str,
    path: str,
    status: int,
    outcome: str,
    duration: float,
    session_id: str = "",
    agent_id: str = "",
    upstream_request_id: str = "",
    alias: str = "",
    provider: str = "",
    model: str = "",
    ttft: float | None = None,
    usage: Usage = EMPTY,
    attempts: int = 0,
    key: str = "",
) -> str:
    """One request as one JSON object, the same keys for every route: no prompt text, no keys (``key`` is the
    name of the client key that authenticated the request, "" for none), nothing from the client but its model
    name, method, path and Claude Code's session and agent ids."""
    return _encode_line(
        {
            "request_id": request_id,
            "upstream_request_id": upstream_request_id,
            "key": key,
            "method": method,
            "path": path,
            "alias": alias,
            "provider": provider,
            "model": model,
            "status": status,
            "outcome": outcome,
            "ttft_ms": None if ttft is None else round(ttft * 1000, 2),
            "duration_ms": round(duration * 1000, 2),
            "input_tokens": usage.input_tokens or 0,
            "output_tokens": usage.output_tokens or 0,
            "cache_read_input_tokens": usage.cache_read_input_tokens or 0,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens or 0,
            "attempts": attempts,
            "session_id": session_id,
            "agent_id": agent_id,
        }
    ).decode()


class UsageTally:
    """Per-request usage and timings; ``record`` writes them to the metrics exactly once."""

    __slots__ = (
        "_clock",
        "_metrics",
        "alias",
        "context",
        "first_token_at",
        "inflight",
        "model",
        "model_label",
        "provider",
        "recorded",
        "started",
        "started_ns",
        "status",
        "timed",
        "upstream_request_id",
        "upstream_wait",
        "usage",
    )

    def __init__(
        self,
        metrics: Metrics,
        *,
        alias: str,
        provider: str = "",
        model: str = "",
        clock: Callable[[], float] = time.monotonic,
        context: RequestContext | None = None,
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self.alias = alias
        self.provider = provider
        self.model = model  # the upstream model id actually asked for (access line, pricing)
        self.model_label = model  # the configured target model: "" for one that forwards the client's name
        self.usage = EMPTY
        self.started = clock()
        self.started_ns = time.time_ns() if metrics.tracer is not None else 0
        self.first_token_at: float | None = None
        self.recorded: str | None = None
        self.inflight = False
        self.status = 0  # the HTTP status the client got (200 for a stream, even one that ended in `error`)
        self.upstream_request_id = ""
        self.upstream_wait: float | None = None  # the answering provider's own time to its first event
        self.context = context or RequestContext()  # the request's ids, principal and control state
        self.timed = True  # observe the latency histograms (not for a token count)

    def begin(self) -> None:
        """The request is being served: counted in flight until ``record``."""
        self._metrics.inflight.inc()
        self.inflight = True

    def first_byte(self) -> None:
        """The client's first byte is going out: what the gateway added to the provider's own wait."""
        if self.upstream_wait is not None and self.provider:
            added = self._clock() - self.started - self.upstream_wait
            self._metrics.added_latency.labels(self.alias, self.provider).observe(max(0.0, added))

    def observe(self, view: EventView) -> None:
        etype = view.type
        if etype == "message_start" or etype == "message_delta":
            self.usage = fold_usage(self.usage, view)
        elif etype == "content_block_delta" and self.first_token_at is None:
            self.first_token_at = self._clock()

    def record(self, outcome: str) -> bool:
        """Write the request's outcome, tokens and timings once; later calls do nothing."""
        if self.recorded is not None:
            return False
        self.recorded = outcome
        if self.inflight:
            self._metrics.inflight.dec()
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        duration = self._clock() - self.started
        self._metrics.record_request(
            alias=self.alias,
            provider=self.provider,
            model=self.model_label,
            priced_as=self.model,
            outcome=outcome,
            usage=self.usage,
            duration=duration,
            time_to_first_token=ttft,
            timed=self.timed,
        )
        if access_log.isEnabledFor(logging.INFO):
            access_log.info("%s", self._access_line(outcome, ttft, duration))
        if self._metrics.tracer is not None:
            self._span(outcome, ttft)
        return True

    def _span(self, outcome: str, ttft: float | None) -> None:
        usage = self.usage
        attributes: dict[str, Any] = {
            "gateway.alias": self.alias,
            "gateway.provider": self.provider,
            "gateway.model": self.model,
            "gateway.outcome": outcome,
            "gateway.attempts": self.context.attempts,
            "http.response.status_code": self.status,
            "gen_ai.usage.input_tokens": usage.input_tokens or 0,
            "gen_ai.usage.output_tokens": usage.output_tokens or 0,
            "gateway.usage.cache_read_input_tokens": usage.cache_read_input_tokens or 0,
            "gateway.usage.cache_creation_input_tokens": usage.cache_creation_input_tokens or 0,
            "gateway.request_id": self.context.request_id,
        }
        if ttft is not None:
            attributes["gateway.time_to_first_token_ms"] = round(ttft * 1000, 3)
        span = self._metrics.tracer.start_span(
            f"messages {self.alias}", start_time=self.started_ns, attributes=attributes
        )
        span.end()

    def _access_line(self, outcome: str, ttft: float | None, duration: float) -> str:
        context = self.context
        return access_line(
            request_id=context.request_id,
            method=context.method,
            path=context.path,
            status=self.status,
            outcome=outcome,
            duration=duration,
            session_id=context.session_id,
            agent_id=context.agent_id,
            upstream_request_id=self.upstream_request_id,
            alias=self.alias,
            provider=self.provider,
            model=self.model,
            ttft=ttft,
            usage=self.usage,
            attempts=context.attempts,
            key=context.key.name if context.key is not None else "",
        )

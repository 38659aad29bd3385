"""The per-request tally that records a request's usage exactly once (metrics, access line, span), over the
pure fold of ``gateway.wire.usage_fold``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.context import RequestContext
from gateway.observability.metrics import bump
from gateway.observability.recording import Finished, Recorder, access_line, access_log
from gateway.wire.events import EventView
from gateway.wire.usage_fold import EMPTY, cost_of, fold_usage, overwrite_present, total_tokens, usage_of

if TYPE_CHECKING:
    from gateway.observability.metrics import Metrics

__all__ = ["Outcome", "UsageTally", "access_line", "access_log", "fold_usage", "overwrite_present", "usage_of"]


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


class UsageTally:
    """Per-request usage and timings; ``record`` writes them to the metrics exactly once."""

    __slots__ = (
        "_clock",
        "_metrics",
        "_recorder",
        "alias",
        "context",
        "finish_reason",
        "first_token_at",
        "inflight",
        "model",
        "model_label",
        "provider",
        "recorded",
        "response_id",
        "response_model",
        "started",
        "started_at",
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
        recorder: Recorder | None = None,
    ) -> None:
        """``recorder``: where the finished request goes (the gateway's, with its ledger); by default the
        metrics, the access line and the span of ``metrics``."""
        self._metrics = metrics
        self._recorder = recorder or Recorder.default(metrics)
        self._clock = clock
        self.alias = alias
        self.provider = provider
        self.model = model  # the upstream model id actually asked for (access line, pricing)
        self.model_label = model  # the configured target model: "" for one that forwards the client's name
        self.usage = EMPTY
        self.started = clock()
        self.started_at = time.time()
        self.first_token_at: float | None = None
        self.recorded: str | None = None
        self.inflight = False
        self.status = 0  # the HTTP status the client got (200 for a stream, even one that ended in `error`)
        self.upstream_request_id = ""
        self.upstream_wait: float | None = None  # the answering provider's own time to its first event
        self.context = context or RequestContext()  # the request's ids, principal and control state
        self.timed = True  # observe the latency histograms (not for a token count)
        # what the answer said of itself (message_start's id and model, message_delta's stop reason): the spans'
        self.response_id = ""
        self.response_model = ""
        self.finish_reason = ""

    def begin(self) -> None:
        """The request is being served: counted in flight until ``record``."""
        bump(self._metrics.inflight, 1)
        self.inflight = True

    def first_byte(self) -> None:
        """The client's first byte is going out: what the gateway added to the provider's own wait."""
        if self.upstream_wait is not None and self.provider:
            added = self._clock() - self.started - self.upstream_wait
            self._metrics.added_latency_of(self.alias, self.provider).observe(max(0.0, added))

    def observe(self, view: EventView) -> None:
        etype = view.type
        if etype == "message_start" or etype == "message_delta":
            self.usage = usage = fold_usage(self.usage, view)
            message, delta = view.message, view.delta
            if message is not None:
                self.response_id, self.response_model = message.id, message.model
            elif delta is not None and delta.stop_reason:
                self.finish_reason = delta.stop_reason
            lease = self.context.lease
            if lease is not None:  # limits count each token as soon as the stream reports it
                price = self._metrics.price_of(self.model) if self._metrics.pricing else None
                lease.count(total_tokens(usage), None if price is None else cost_of(usage, price))
        elif etype == "content_block_delta" and self.first_token_at is None:
            self.first_token_at = self._clock()

    def record(self, outcome: str) -> bool:
        """Write the request's outcome, tokens and timings once (to every sink of its recorder); later calls do
        nothing."""
        if self.recorded is not None:
            return False
        self.recorded = outcome
        if self.inflight:
            bump(self._metrics.inflight, -1)
        self._recorder.record(self.finished(outcome))
        return True

    def finished(self, outcome: str) -> Finished:
        context, usage = self.context, self.usage
        key = context.key
        price = self._metrics.price_of(self.model) if self._metrics.pricing else None
        return Finished(
            started_at=self.started_at,
            request_id=context.request_id,
            upstream_request_id=self.upstream_request_id,
            method=context.method,
            path=context.path,
            key_name=key.id if key is not None else "",  # the key's id: its ledger rows, metrics and access line
            team=key.team if key is not None else "",
            user=key.user if key is not None else "",
            session_id=context.session_id,
            agent_id=context.agent_id,
            alias=self.alias,
            provider=self.provider,
            model=self.model,
            model_label=self.model_label,
            stream=context.stream,
            routed=bool(self.alias) and not context.count,  # a count spends nothing (whichever route asked)
            outcome=outcome,
            status=self.status,
            usage=usage,
            cost_usd=None if price is None else cost_of(usage, price),
            ttft=None if self.first_token_at is None else self.first_token_at - self.started,
            duration=self._clock() - self.started,
            attempts=context.attempts,
            timed=self.timed,
            dropped=context.dropped,
            lease=context.lease,
            limit=context.limit,
            response_id=self.response_id,
            response_model=self.response_model,
            finish_reason=self.finish_reason,
            upstream_wait=self.upstream_wait,
            panic=context.panic,
            trace=context.trace,
        )

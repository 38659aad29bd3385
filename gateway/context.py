"""One request as the edge serves it, apart from its usage.

``UsageTally`` is the usage fold's state and its recording; a ``RequestContext`` is the rest: which config
serves the request (``runtime``), who sent it (``key``: the principal), its ids, its deadline and the attempts
made for it, what has gone out to the client (``reply``), and how the gateway is ending it (``cancel_outcome``,
``last_chunk``). The tally refers to
its request's context for the access line; the ledger's attribution and the limiter's admission belong here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.observability.tracing import note_request

if TYPE_CHECKING:
    from gateway.governance.keys import ClientKey
    from gateway.governance.limits import Lease
    from gateway.observability.tracing import RequestTrace
    from gateway.runtime import Runtime
    from gateway.wire.events import Batch
    from gateway.wire.request import MessagesHead

__all__ = ["DRAIN_CANCEL", "Reply", "RequestContext"]

DRAIN_CANCEL = "gateway shutting down"  # the cancel message of streams ended by the shutdown drain


class Reply:
    """What has gone out to the client so far: tracked, never inferred (a drain's cancel arriving during the
    last write of a stream must not make a second response head)."""

    __slots__ = ("ended", "started")

    def __init__(self) -> None:
        self.started = False  # http.response.start sent
        self.ended = False  # the body's last message (more_body False) sent


class RequestContext:
    __slots__ = (
        "agent_id",
        "attempts",
        "cancel_outcome",
        "count",
        "deadline",
        "dropped",
        "key",
        "last_chunk",
        "lease",
        "limit",
        "method",
        "panic",
        "path",
        "reply",
        "request_id",
        "response_headers",
        "runtime",
        "sent",
        "session_id",
        "stream",
        "trace",
    )

    def __init__(
        self,
        *,
        request_id: str = "",
        method: str = "POST",
        path: str = "/v1/messages",
        session_id: str = "",
        agent_id: str = "",
        runtime: Runtime | None = None,
    ) -> None:
        self.request_id = request_id
        self.method = method
        self.path = path
        self.session_id = session_id  # x-claude-code-session-id
        self.agent_id = agent_id  # x-claude-code-agent-id
        self.runtime = runtime  # the config this request is served by (None outside the edge)
        self.key: ClientKey | None = None  # the principal, once authenticated (None: an open gateway)
        self.reply = Reply()
        self.cancel_outcome = "client_cancelled"  # what a stream cut short by the gateway records
        self.last_chunk = False  # the stream's body generator is yielding its final chunk
        # when the request's total timeout (``resilience.timeouts.total_s``) runs out, on the pipeline's clock; set
        # by its first attempt and kept by every later one (a panic pass included)
        self.deadline: float | None = None
        self.attempts = 0  # upstream attempts made so far
        self.stream = False  # the client asked for a stream
        self.dropped: tuple[str, ...] = ()  # what the serving attempt's provider was not sent (adapters.profiles)
        self.count = False  # a token count (Messages' count_tokens, a surface's count-tokens call): spends nothing
        self.lease: Lease | None = None  # the request's hold on its rate limits and budgets (gateway.governance.limits)
        self.limit = ""  # the limit that refused the request, as its access line names it ("team budget"…)
        self.response_headers: dict[str, str] = {}  # the gateway's own headers for the response (a clamp…)
        # (the chunk of the body the pipeline yielded last, the batch it is) when the chunk is a whole batch: a
        # surface encodes from the batch's decoded events (or sends the provider's own bytes of it,
        # ``Batch.wire``) instead of splitting the chunk again (surfaces.bedrock)
        self.sent: tuple[bytes, Batch] | None = None
        self.panic = False  # routed in panic mode: every target's breaker was open (gateway.routing.balance)
        self.trace: RequestTrace | None = None  # its spans, when the gateway traces (gateway.observability.tracing)

    def traced(self, model: str, body: bytes, head: MessagesHead | None) -> None:
        """The request as its client sent it, for its spans (when traced)."""
        trace = self.trace
        if trace is not None and note_request(trace, model, head):  # (compiled) and whether it captures content
            trace.capture_input(body)

    def failed(self, error_type: str) -> None:
        """The error its client is answered with, for its spans (when traced)."""
        if self.trace is not None:
            self.trace.error_type = error_type

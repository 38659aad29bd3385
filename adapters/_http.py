"""The one send / check / reply / stream path every HTTP provider shares, and the hooks a provider supplies.

As the anthropic SDK shapes its Bedrock and Vertex clients, a provider differs from the Claude API in two
steps only: how a request is **prepared** (URL, body, headers: ``HttpAdapter.prepare``) and how it is
**authenticated** (an ``Auth``: static key headers, the client's own key, SigV4, a Google or Entra ID bearer
token). Everything else is here, once: send, map a non-2xx answer to an Anthropic error (``check``; Bedrock
supplies its own), retry once with renewed credentials after a 401 (when the ``Auth`` can renew), read a JSON
answer with its forwardable headers (``reply``), and open the event stream (``events``).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import NamedTuple, Protocol

from gateway.wire.request import ProxyRequest
from gateway.wire.upstream import MAX_ERROR_BYTES, BodyTooLarge, HttpClient, Timeouts, UpstreamResponse

from .base import EventStream, JsonReply, SseEventStream, checked, raise_for_upstream
from .profiles import FIRST_PARTY, Profile

__all__ = [
    "ACCEPT_JSON",
    "USER_AGENT",
    "Auth",
    "BearerAuth",
    "ClientKeyAuth",
    "HeaderAuth",
    "HttpAdapter",
    "Operation",
    "Prepared",
    "base_headers",
]

USER_AGENT = "messages-gateway/0.1"

ACCEPT_JSON = "application/json"


class Operation(enum.Enum):
    """What a request asks of the provider: a stream, a whole message, or a token count."""

    STREAM = "stream"
    COMPLETE = "complete"
    COUNT = "count"


class Prepared(NamedTuple):
    """A request ready to authenticate and send."""

    url: str
    body: bytes
    headers: dict[str, str]


class _ProviderConnection(Protocol):
    @property
    def connect_timeout_s(self) -> float: ...
    @property
    def read_timeout_s(self) -> float: ...
    @property
    def pool_size(self) -> int | None: ...
    @property
    def pool_idle_s(self) -> float: ...
    @property
    def proxy(self) -> str | None: ...


def provider_timeouts(config: _ProviderConnection) -> Timeouts:
    """A provider's connection settings as its requests carry them: timeouts, and its origin's pool."""
    return Timeouts(
        config.connect_timeout_s,
        config.read_timeout_s,
        pool=config.pool_size,
        idle_s=config.pool_idle_s,
        proxy=config.proxy,
    )


def base_headers(accept: str) -> dict[str, str]:
    """The headers every provider request carries: a JSON body, what is accepted back, the gateway's name."""
    return {"content-type": "application/json", "accept": accept, "user-agent": USER_AGENT}


class Auth:
    """How a provider authenticates requests; this base adds nothing (a provider that needs no credentials)."""

    async def apply(self, request: ProxyRequest, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        """The headers to send: ``headers`` plus the credentials (or a signature over url, headers and body)."""
        return headers

    async def renew(self, sent: Mapping[str, str]) -> bool:
        """After a 401 to a request sent with ``sent``: renew the credentials and say whether one retry is worth
        it (a token revoked or skewed). Static credentials cannot be renewed."""
        return False

    async def aclose(self) -> None:
        return None


class HeaderAuth(Auth):
    """Static credentials: the provider's key in fixed headers (``x-api-key``, ``authorization: Bearer``…)."""

    __slots__ = ("_headers",)

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)

    async def apply(self, request: ProxyRequest, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        headers.update(self._headers)
        return headers


class ClientKeyAuth(Auth):
    """The client's own key headers, forwarded as they came (``forward_client_key``)."""

    async def apply(self, request: ProxyRequest, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        headers.update(request.client_auth)
        return headers


class BearerAuth(Auth):
    """A bearer token fetched (and cached, and refreshed) by a token source: Google's, Entra ID's."""

    __slots__ = ("_close", "_renew", "_token")

    def __init__(
        self,
        token: Callable[[], Awaitable[str]],
        *,
        renew: Callable[[str], Awaitable[str]] | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._token = token
        self._renew = renew
        self._close = close

    async def apply(self, request: ProxyRequest, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        headers["authorization"] = f"Bearer {await self._token()}"
        return headers

    async def renew(self, sent: Mapping[str, str]) -> bool:
        if self._renew is None:
            return False
        await self._renew(sent.get("authorization", "").removeprefix("Bearer "))
        return True

    async def aclose(self) -> None:
        if self._close is not None:
            await self._close()


Check = Callable[[UpstreamResponse, str], Awaitable[None]]


class HttpAdapter:
    """A provider reached over HTTP: ``prepare`` (and ``events``/``reply`` where its answers differ) per provider,
    the rest shared. ``auth`` authenticates every request; ``check`` maps a non-2xx answer to an error."""

    kind = "http"

    def __init__(
        self, name: str, client: HttpClient, *, timeouts: Timeouts, auth: Auth | None = None, check: Check | None = None
    ) -> None:
        self.name = name
        self._client = client
        self._timeouts = timeouts
        self.auth = auth or Auth()
        self._check = check or raise_for_upstream
        self.profile: Profile = FIRST_PARTY  # what the provider accepts (set from its config: adapters.build_adapter)

    async def prepare(self, request: ProxyRequest, model: str, operation: Operation) -> Prepared:
        raise NotImplementedError  # pragma: no cover - every provider prepares its own requests

    def events(self, resp: UpstreamResponse, request: ProxyRequest, model: str) -> EventStream:
        """The event stream of a 2xx streamed answer: first-party SSE unless the provider speaks otherwise."""
        return SseEventStream(resp)

    async def reply(self, resp: UpstreamResponse, request: ProxyRequest, model: str, operation: Operation) -> JsonReply:
        """The JSON answer of a 2xx non-streamed call, as the provider sent it (a message is JSON-checked by the
        pipeline's usage decode, so only a count is checked here)."""
        return await JsonReply.read(resp, self.name, check_json=operation is not Operation.COMPLETE)

    async def send(self, request: ProxyRequest, model: str, operation: Operation) -> UpstreamResponse:
        """Prepare, authenticate, send; the 2xx answer, or the error ``check`` maps the answer to."""
        url, body, headers = await self.prepare(request, model, operation)
        sent = await self.auth.apply(request, url, headers, body)
        traceparent = request.traceparent
        if traceparent is not None:  # traced: the attempt's CLIENT span goes upstream (W3C Trace Context)
            sent["traceparent"] = traceparent
            request.span.url = url
        resp = await self._client.send("POST", url, headers=sent, body=body, timeouts=self._timeouts)
        if resp.status == 401 and await self.auth.renew(sent):  # revoked or skewed: one new token, one retry
            with contextlib.suppress(BodyTooLarge):
                await resp.read(MAX_ERROR_BYTES)
            await resp.aclose()
            sent = await self.auth.apply(request, url, headers, body)
            if traceparent is not None:
                sent["traceparent"] = traceparent
            resp = await self._client.send("POST", url, headers=sent, body=body, timeouts=self._timeouts)
        return await checked(resp, self.name, self._check)

    async def open_stream(self, request: ProxyRequest, model: str) -> EventStream:
        return self.events(await self.send(request, model, Operation.STREAM), request, model)

    async def complete(self, request: ProxyRequest, model: str) -> JsonReply:
        resp = await self.send(request, model, Operation.COMPLETE)
        return await self.reply(resp, request, model, Operation.COMPLETE)

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply:
        resp = await self.send(request, model, Operation.COUNT)
        return await self.reply(resp, request, model, Operation.COUNT)

    async def aclose(self) -> None:
        await self.auth.aclose()

"""``kind: anthropic`` — the Claude API itself (or anything that speaks it at ``base_url``)."""

from __future__ import annotations

from gateway.request import ProxyRequest
from gateway.settings import AnthropicProvider
from gateway.upstream import HttpClient, Timeouts, UpstreamResponse

from .base import JsonReply, SseEventStream, forwardable_headers, raise_for_upstream

__all__ = ["DEFAULT_VERSION", "ClaudeAdapter"]

DEFAULT_VERSION = "2023-06-01"
USER_AGENT = "messages-gateway/0.1"


class ClaudeAdapter:
    kind = "anthropic"

    def __init__(self, name: str, config: AnthropicProvider, client: HttpClient) -> None:
        self.name = name
        self._config = config
        self._client = client
        base = config.base_url.rstrip("/")
        self._messages_url = base + "/v1/messages"
        self._count_url = base + "/v1/messages/count_tokens"
        self._timeouts = Timeouts(config.connect_timeout_s, config.read_timeout_s)

    def _headers(self, request: ProxyRequest, *, stream: bool) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
            "anthropic-version": request.anthropic_version or DEFAULT_VERSION,
            "user-agent": USER_AGENT,
        }
        if request.anthropic_beta:
            headers["anthropic-beta"] = request.anthropic_beta
        if self._config.forward_client_key:
            headers.update(request.client_auth)
        elif self._config.api_key:
            headers["x-api-key"] = self._config.api_key
        return headers

    async def _post(self, url: str, request: ProxyRequest, body: bytes, *, stream: bool) -> UpstreamResponse:
        if request.beta:
            url += "?beta=true"
        resp = await self._client.send(
            "POST", url, headers=self._headers(request, stream=stream), body=body, timeouts=self._timeouts
        )
        try:
            await raise_for_upstream(resp, self.name)
        except BaseException:
            await resp.aclose()
            raise
        return resp

    def _body(self, request: ProxyRequest, model: str) -> bytes:
        return request.body if model == request.model else request.body_with(set={"model": model})

    async def open_stream(self, request: ProxyRequest, model: str) -> SseEventStream:
        resp = await self._post(self._messages_url, request, self._body(request, model), stream=True)
        return SseEventStream(resp)

    async def complete(self, request: ProxyRequest, model: str) -> JsonReply:
        resp = await self._post(self._messages_url, request, self._body(request, model), stream=False)
        return JsonReply(resp.status, await resp.read(), forwardable_headers(resp.headers))

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply:
        resp = await self._post(self._count_url, request, self._body(request, model), stream=False)
        return JsonReply(resp.status, await resp.read(), forwardable_headers(resp.headers))

    async def aclose(self) -> None:
        return None

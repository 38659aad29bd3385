"""``kind: vertex`` — Claude on Google Vertex AI.

``POST {base}/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:streamRawPredict``
(``:rawPredict`` for JSON). The body loses ``model`` and gains ``anthropic_version: vertex-2023-10-16``;
``stream`` stays, ``anthropic-beta`` stays a header. The answer is first-party SSE plus Vertex's own
``vertex_event`` frames, which are dropped. Count tokens: ``…/models/count-tokens:rawPredict`` with ``model``
kept in the body. Google-shaped errors become the Anthropic envelope (``base.raise_for_upstream``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from urllib.parse import quote

from gateway.events import Batch
from gateway.request import ProxyRequest
from gateway.settings import VertexProvider
from gateway.upstream import MAX_ERROR_BYTES, BodyTooLarge, HttpClient, Timeouts, UpstreamResponse

from ._google import GoogleCredentialsUnavailable, GoogleTokenSource
from .base import JsonReply, SseEventStream, checked, url_model
from .claude import USER_AGENT

__all__ = ["VertexAdapter", "vertex_base_url"]

_VERTEX_EVENT = b"event: vertex_event\n"


def vertex_base_url(region: str) -> str:
    """The API root for a region, as the SDK's ``AnthropicVertex`` builds it."""
    if region == "global":
        return "https://aiplatform.googleapis.com/v1"
    if region in ("us", "eu"):
        return f"https://aiplatform.{region}.rep.googleapis.com/v1"
    return f"https://{region}-aiplatform.googleapis.com/v1"


class VertexEventStream(SseEventStream):
    """First-party SSE, minus ``vertex_event`` frames."""

    async def batches(self) -> AsyncGenerator[Batch]:
        async with contextlib.aclosing(super().batches()) as inner:
            async for batch in inner:
                raw = batch.raw
                if raw is not None and _VERTEX_EVENT not in raw:
                    yield batch
                    continue
                keep = [i for i, view in enumerate(batch.views) if view.type != "vertex_event"]
                if len(keep) == len(batch.views):
                    yield batch
                elif keep:
                    datas = batch.datas
                    yield Batch([batch.views[i] for i in keep], [datas[i] for i in keep])


class VertexAdapter:
    kind = "vertex"

    def __init__(
        self, name: str, config: VertexProvider, client: HttpClient, *, tokens: GoogleTokenSource | None = None
    ) -> None:
        self.name = name
        self._config = config
        self._client = client
        self._base = (config.base_url or vertex_base_url(config.region)).rstrip("/")
        self._timeouts = Timeouts(config.connect_timeout_s, config.read_timeout_s)
        self.tokens = tokens or GoogleTokenSource(
            provider=name, credentials_file=config.credentials_file, project=config.project
        )

    def _url(self, model: str, method: str) -> str:
        project = self.tokens.project
        if not project:
            raise GoogleCredentialsUnavailable(
                f"provider {self.name!r}: no Google Cloud project (set `project`, GOOGLE_CLOUD_PROJECT, "
                "or use credentials that name one)"
            )
        # every part escaped (``@`` of versioned ids is a legal path character and stays): a name can never add
        # a path segment, a query or a fragment, or pick another method than ``method``
        project, region, model = (
            quote(project, safe=""),
            quote(self._config.region, safe=""),
            url_model(model, safe="@"),
        )
        return f"{self._base}/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:{method}"

    async def _post(
        self, model: str, method: str, request: ProxyRequest, body: bytes, *, stream: bool
    ) -> UpstreamResponse:
        token = await self.tokens.token()  # first: it may learn the project from the credentials
        url = self._url(model, method)
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
            "user-agent": USER_AGENT,
        }
        if request.anthropic_beta:
            headers["anthropic-beta"] = request.anthropic_beta
        for attempt in (1, 2):
            headers["authorization"] = f"Bearer {token}"
            resp = await self._client.send("POST", url, headers=headers, body=body, timeouts=self._timeouts)
            if resp.status == 401 and attempt == 1:  # revoked or skewed: one new token, one retry
                with contextlib.suppress(BodyTooLarge):
                    await resp.read(MAX_ERROR_BYTES)
                await resp.aclose()
                token = await self.tokens.refresh_after_401(token)
                continue
            return await checked(resp, self.name)
        raise AssertionError("unreachable")  # pragma: no cover

    def _body(self, request: ProxyRequest) -> bytes:
        return request.body_with(set={"anthropic_version": self._config.anthropic_version}, drop=("model",))

    async def open_stream(self, request: ProxyRequest, model: str) -> VertexEventStream:
        resp = await self._post(model, "streamRawPredict", request, self._body(request), stream=True)
        return VertexEventStream(resp)

    async def complete(self, request: ProxyRequest, model: str) -> JsonReply:
        resp = await self._post(model, "rawPredict", request, self._body(request), stream=False)
        return await JsonReply.read(resp, self.name, check_json=False)

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply:
        url_model(model)  # in the body here, but a Vertex model id all the same: the same names are refused
        body = request.body_with(set={"anthropic_version": self._config.anthropic_version, "model": model})
        resp = await self._post("count-tokens", "rawPredict", request, body, stream=False)
        return await JsonReply.read(resp, self.name)

    async def aclose(self) -> None:
        return None

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

from gateway.settings import VertexProvider
from gateway.wire.events import Batch
from gateway.wire.request import ProxyRequest
from gateway.wire.upstream import HttpClient, UpstreamResponse

from ._google import GoogleCredentialsUnavailable, GoogleTokenSource
from ._http import ACCEPT_JSON, BearerAuth, HttpAdapter, Operation, Prepared, base_headers, provider_timeouts
from .base import SseEventStream, url_model
from .profiles import filter_request

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


class VertexAdapter(HttpAdapter):
    kind = "vertex"

    def __init__(
        self, name: str, config: VertexProvider, client: HttpClient, *, tokens: GoogleTokenSource | None = None
    ) -> None:
        self.tokens = tokens or GoogleTokenSource(
            provider=name, credentials_file=config.credentials_file, project=config.project
        )
        auth = BearerAuth(self.tokens.token, renew=self.tokens.refresh_after_401)
        super().__init__(
            name,
            client,
            timeouts=provider_timeouts(config),
            auth=auth,
        )
        self._config = config
        self._base = (config.base_url or vertex_base_url(config.region)).rstrip("/")

    def url(self, model: str, method: str) -> str:
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

    async def prepare(self, request: ProxyRequest, model: str, operation: Operation) -> Prepared:
        if not self.tokens.project:
            await self.tokens.token()  # the project may come with the credentials: loaded with the first token
        version = self._config.anthropic_version
        kept = filter_request(self.profile, request)  # what Vertex takes of the request (adapters/profiles.py)
        if operation is Operation.COUNT:
            url_model(model)  # in the body here, but a Vertex model id all the same: the same names are refused
            url = self.url("count-tokens", "rawPredict")
            body = request.body_with(set={**kept.set, "anthropic_version": version, "model": model}, drop=kept.drop)
        else:
            url = self.url(model, "streamRawPredict" if operation is Operation.STREAM else "rawPredict")
            body = request.body_with(set={**kept.set, "anthropic_version": version}, drop=("model", *kept.drop))
        headers = base_headers("text/event-stream" if operation is Operation.STREAM else ACCEPT_JSON)
        if kept.header:
            headers["anthropic-beta"] = kept.header
        return Prepared(url, body, headers)

    def events(self, resp: UpstreamResponse, request: ProxyRequest, model: str) -> VertexEventStream:
        return VertexEventStream(resp)

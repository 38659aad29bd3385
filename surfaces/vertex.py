"""Vertex AI rawPredict, inbound: ``POST /v1/projects/{p}/locations/{l}/publishers/anthropic/models/{m}:rawPredict``
and ``:streamRawPredict``, and ``…/models/count-tokens:rawPredict``, as ``AnthropicVertex`` and Claude Code's Vertex
mode send them.

Requests: the model from the path (``claude-opus-4-5@20251101`` forms mapped like Bedrock ids,
``surfaces.base.resolve_cloud_model``; for a token count, from the body, where Vertex keeps it); the body has
``anthropic_version`` (dropped: the target's adapter sets its own) and maybe ``stream`` (``:streamRawPredict``
streams whatever it says); betas in the ``anthropic-beta`` header, as on the Messages API. Answers are the
Messages API's own — JSON, SSE and errors in the Anthropic envelope, as Vertex returns them for Claude models —
so the call's ``send`` is the edge's, unchanged. The project and location in the path are the client's
configuration, not the gateway's: any are accepted.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping

import msgspec

from gateway.wire.errors import InvalidRequest
from surfaces.base import PathCall, Routes, Send, Wire, canonical_body, resolve_cloud_model

__all__ = ["VERTEX_PREFIX", "VertexCall", "match_vertex"]

VERTEX_PREFIX = "/v1/projects/"
_PATH = re.compile(
    r"^/v1/projects/[^/]+/locations/[^/]+/publishers/anthropic/models/([^/:]+):(rawPredict|streamRawPredict)$"
)


class _Model(msgspec.Struct):
    model: str | None = None


_decode_model = msgspec.json.Decoder(_Model).decode


def match_vertex(method: str, path: str) -> VertexCall | None:
    found = _PATH.match(path)
    if found is None:
        return None
    model, action = found.groups()
    route = f"{VERTEX_PREFIX}{{project}}/locations/{{location}}/publishers/anthropic/models/{{model}}:{action}"
    if model == "count-tokens":
        return VertexCall("", stream=False, count=True, route=route) if action == "rawPredict" else None
    return VertexCall(model, stream=action == "streamRawPredict", count=False, route=route)


class VertexCall(PathCall):
    kind = "vertex"

    def canonical(self, body: bytes, headers: MutableMapping[str, str], routes: Routes) -> bytes:
        model_id = self.model_id
        if self.count:
            try:
                model_id = _decode_model(body).model or ""
            except msgspec.DecodeError:
                raise InvalidRequest("request body is not a JSON object") from None
            if not model_id:
                raise InvalidRequest("model: a token count names its model in the body")
        model = resolve_cloud_model("vertex", model_id, routes)
        stream = None if self.count else (True if self.stream else None)
        out, _ = canonical_body(body, model=model, stream=stream, drop=("anthropic_version",))
        return out

    def wrap(self, send: Send, context: Wire) -> Send:
        return send

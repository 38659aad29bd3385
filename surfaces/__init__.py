"""Inbound API shapes beside the Messages API: what a Bedrock- or Vertex-configured client sends, made into the
canonical request, and the gateway's answer made into what that client expects back.

An adapter is canonical ↔ provider; a surface is client shape ↔ canonical. So N surfaces and M providers are
N + M pieces, and every surface enters through the one edge path (``gateway.http.messages``): the same
authentication, limits, pipeline, validator, usage fold, metrics, access line and ledger.

``match(method, path)`` names the surface call a request is (``None``: not one of theirs); the call rewrites the
body after it is read (``canonical``) and wraps the ASGI ``send`` so that what goes out is in its shape
(``wrap``). The Messages API itself has no surface: its requests and answers are already canonical.
"""

from __future__ import annotations

from surfaces.base import Call, cloud_model_names
from surfaces.bedrock import BEDROCK_PREFIX, BedrockCall, inference_profiles, match_bedrock
from surfaces.vertex import VERTEX_PREFIX, VertexCall, match_vertex

__all__ = [
    "BEDROCK_PREFIX",
    "VERTEX_PREFIX",
    "BedrockCall",
    "Call",
    "VertexCall",
    "cloud_model_names",
    "inference_profiles",
    "match",
]


def match(method: str, path: str) -> Call | None:
    """The surface call ``method path`` is, or None when no surface serves the path (a call of another method
    than POST is answered 405 by the edge)."""
    if path.startswith(BEDROCK_PREFIX):
        return match_bedrock(method, path)
    if path.startswith(VERTEX_PREFIX):
        return match_vertex(method, path)
    return None

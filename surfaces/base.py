"""What every surface call has: the model id from its path, whether it streams or counts, and the mapping of
a cloud's model id onto the gateway's aliases."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Protocol

import msgspec

from gateway.wire.errors import InvalidRequest, NotFound
from gateway.wire.events import Batch

__all__ = ["Call", "PathCall", "Routes", "Wire", "canonical_body", "cloud_model_names", "resolve_cloud_model"]

Send = Callable[[dict[str, Any]], Any]

_decode_top = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_encode = msgspec.json.Encoder().encode

_GEO = re.compile(r"^(?:us|eu|apac|jp|au|ca|global|us-gov)\.")
_BEDROCK_VERSION = re.compile(r"-v\d+(?::\d+)?$")  # -v1:0, -v2
_DATE = re.compile(r"-\d{8}$")


class Wire(Protocol):
    """What a surface reads of the request's context (``gateway.context.RequestContext``): the chunk the pipeline
    yielded last with the batch it is, when it is a whole batch."""

    sent: tuple[bytes, Batch] | None


class Routes(Protocol):
    """What mapping reads of the route table (``gateway.routing.table.RouteTable``)."""

    def by_cloud_id(self, kind: str, cloud_id: str) -> Any: ...

    def resolve(self, model: str) -> Any: ...


class Call(Protocol):
    """One request to a surface route."""

    kind: str  # "bedrock" | "vertex"
    model_id: str  # as the client named it in the path
    route: str  # the route's template (a span's http.route): "/model/{modelId}/invoke-with-response-stream"…
    stream: bool
    count: bool

    def canonical(self, body: bytes, headers: MutableMapping[str, str], routes: Routes) -> bytes:
        """The Messages body for ``body`` (``model`` and ``stream`` set, the shape's own fields out); may set
        ``headers["anthropic-beta"]``. ``InvalidRequest`` / ``NotFound`` as the Messages route answers them."""
        ...

    def wrap(self, send: Send, context: Wire) -> Send:
        """``send`` for the answer in this surface's shape (``context``: the request's, for the batch a chunk is)."""
        ...


class PathCall:
    """What a surface call's path says: the model id as the client named it, whether it streams or counts."""

    kind = ""

    def __init__(self, model_id: str, *, stream: bool, count: bool, route: str = "") -> None:
        self.model_id = model_id
        self.stream = stream
        self.count = count
        self.route = route


def cloud_model_names(model_id: str) -> list[str]:
    """The names a cloud model id may stand for, most specific first: the id itself; without an ARN's path,
    a geography prefix (``us.``), ``anthropic.`` and a Bedrock version suffix (``-v1:0``); with a Vertex
    ``@version`` joined by ``-`` (the first-party name) and dropped; and without a date suffix."""
    names = [model_id]
    name = model_id.rsplit("/", 1)[-1] if model_id.startswith("arn:") else model_id
    name = _GEO.sub("", name)
    name = name.removeprefix("anthropic.")
    name = _BEDROCK_VERSION.sub("", name)
    base, at, version = name.partition("@")
    candidates = [f"{base}-{version}", base] if at else [name]
    for candidate in [*candidates, *(_DATE.sub("", c) for c in candidates)]:
        if candidate and candidate not in names:
            names.append(candidate)
    return names


def resolve_cloud_model(kind: str, model_id: str, routes: Routes) -> str:
    """The model name the canonical request carries for a cloud ``model_id``: the alias that lists the id in its
    ``bedrock_ids`` / ``vertex_ids``; else the first of ``cloud_model_names`` an exact alias or a glob serves
    (the default rule); ``NotFound`` when none is."""
    route = routes.by_cloud_id(kind, model_id)
    if route is not None:
        return str(route.alias)
    names = cloud_model_names(model_id)
    for name in names[1:] + names[:1]:  # the default rule's names, then the id itself (a route may glob it)
        try:
            routes.resolve(name)
        except NotFound:
            continue
        return name
    raise NotFound(f"model {model_id!r} is not served by this gateway (see GET /v1/models)")


def canonical_body(
    body: bytes, *, model: str, stream: bool | None, drop: tuple[str, ...]
) -> tuple[bytes, Mapping[str, msgspec.Raw]]:
    """``body`` (a JSON object) with ``model`` set, ``stream: true`` when ``stream`` is True and no ``stream``
    when it is False (None: as the body says), and ``drop`` out; and its top-level fields as they came. Nested
    values are carried as raw JSON."""
    try:
        fields = _decode_top(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not a JSON object: {exc}") from None
    except RecursionError:
        raise InvalidRequest("request body is nested too deeply to decode") from None
    version = fields.get("anthropic_version")
    if version is not None and not bytes(version).startswith(b'"'):
        raise InvalidRequest("anthropic_version: a string")
    out: dict[str, Any] = {k: v for k, v in fields.items() if k not in drop and k != "model"}
    out["model"] = model
    if stream:
        out["stream"] = True
    elif stream is not None:
        out.pop("stream", None)
    return _encode(out), fields

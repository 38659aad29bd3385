"""What every provider adapter offers the pipeline, and the pieces they share.

An adapter is long-lived and stateless; per-request state lives in the ``EventStream`` it opens.
``open_stream`` returns once the provider has answered with a 2xx status and headers (a non-2xx
answer raises a ``GatewayError`` with the mapped status, before anything reached the client); the
stream then yields *batches* of events, one batch per upstream read, so the pipeline writes to the
client once per read rather than once per event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Protocol

import msgspec

from gateway.errors import UpstreamStatusError, error_type_for_status
from gateway.events import EventView, WireEvent, decode_view
from gateway.request import ProxyRequest
from gateway.sse import SseDecoder, SseFrame
from gateway.upstream import UpstreamResponse

__all__ = [
    "Adapter",
    "EventStream",
    "JsonReply",
    "SseEventStream",
    "forwardable_headers",
    "raise_for_upstream",
    "wire_event_of",
]


class JsonReply:
    """A complete JSON answer (non-streamed message, token count)."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers: dict[str, str] = dict(headers or {})


class EventStream(Protocol):
    headers: dict[str, str]

    def batches(self) -> AsyncGenerator[list[WireEvent]]: ...

    async def aclose(self) -> None: ...


class Adapter(Protocol):
    """A provider. ``name`` is the provider's key in the config; ``kind`` its type."""

    name: str
    kind: str

    async def open_stream(self, request: ProxyRequest, model: str) -> EventStream: ...

    async def complete(self, request: ProxyRequest, model: str) -> JsonReply: ...

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply: ...

    async def aclose(self) -> None: ...


_FORWARD_EXACT = frozenset({"request-id", "retry-after", "retry-after-ms", "x-should-retry"})
_FORWARD_PREFIXES = ("anthropic-ratelimit-", "anthropic-priority-")


def forwardable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The provider response headers a client's SDK reads: request id, retry hints, rate limits."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if low in _FORWARD_EXACT or low.startswith(_FORWARD_PREFIXES):
            out[low] = value
    return out


class _ErrorBody(msgspec.Struct):
    type: str = ""
    message: str = ""


class _Envelope(msgspec.Struct):
    type: str = ""
    error: _ErrorBody | None = None


_decode_envelope = msgspec.json.Decoder(_Envelope).decode


async def raise_for_upstream(resp: UpstreamResponse, provider: str) -> None:
    """Map a non-2xx provider answer to the same status and error type, keeping its own envelope."""
    status = resp.status
    if 200 <= status < 300:
        return
    body = await resp.read()
    headers = forwardable_headers(resp.headers)
    try:
        parsed = _decode_envelope(body)
    except msgspec.DecodeError:
        parsed = _Envelope()
    if parsed.type == "error" and parsed.error is not None and parsed.error.type:
        raise UpstreamStatusError(status, parsed.error.type, parsed.error.message, headers=headers, body=body)
    text = body[:300].decode("utf-8", "replace").strip()
    message = f"provider {provider!r} answered HTTP {status}" + (f": {text}" if text else "")
    raise UpstreamStatusError(status, error_type_for_status(status), message, headers=headers)


_MALFORMED = EventView(type="")


def wire_event_of(frame: SseFrame) -> WireEvent:
    """An SSE frame as a forwarded event: its exact data bytes plus a partial view of them."""
    try:
        view = decode_view(frame.data)
    except msgspec.DecodeError:
        return WireEvent("", frame.data, _MALFORMED)
    if not view.type and frame.event:
        view.type = frame.event.decode("utf-8", "replace")
    return WireEvent(view.type, frame.data, view)


class SseEventStream:
    """The event stream of a provider that already speaks the canonical SSE (Claude API, Foundry…)."""

    __slots__ = ("_resp", "headers")

    def __init__(self, resp: UpstreamResponse) -> None:
        self._resp = resp
        self.headers = forwardable_headers(resp.headers)

    async def batches(self) -> AsyncGenerator[list[WireEvent]]:
        decoder = SseDecoder()
        feed = decoder.feed
        async for chunk in self._resp.chunks():
            frames = feed(chunk)
            if frames:
                yield [wire_event_of(frame) for frame in frames]

    async def aclose(self) -> None:
        await self._resp.aclose()

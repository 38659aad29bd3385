"""``kind: mock`` — a built-in provider that answers offline, deterministically, in the exact canonical
shape (with real citations of the documents it is given). Its responses say ``mock:`` in the model
name and carry ``x-gateway-mock: true``, so they are never mistaken for a real model's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import msgspec

from gateway.settings import MockProvider
from gateway.wire.errors import InvalidRequest
from gateway.wire.events import Batch, decode_views
from gateway.wire.request import ProxyRequest
from gateway.wire.sse import encode_frame

from ._mock_answer import estimate_input_tokens, mock_events, mock_message
from .base import JsonReply

__all__ = ["MockAdapter"]

_encode = msgspec.json.Encoder().encode
_MOCK_HEADERS = {"x-gateway-mock": "true"}


class _MockStream:
    __slots__ = ("_config", "_events", "headers", "request_id")

    def __init__(self, events: Batch, config: MockProvider, request_id: str) -> None:
        self._events = events
        self._config = config
        self.headers = {**_MOCK_HEADERS, "request-id": request_id}
        self.request_id = request_id

    async def batches(self) -> AsyncGenerator[Batch]:
        config = self._config
        if config.first_event_delay_ms:
            await asyncio.sleep(config.first_event_delay_ms / 1000)
        events = self._events
        if not config.event_delay_ms:
            yield events
            return
        delay = config.event_delay_ms / 1000
        for i, (view, data) in enumerate(zip(events.views, events.datas, strict=True)):
            if i:
                await asyncio.sleep(delay)
            yield Batch([view], [data])

    def at_eof(self) -> bool:
        return True  # nothing to read from anywhere

    async def aclose(self) -> None:
        return None


class MockAdapter:
    kind = "mock"

    def __init__(self, name: str, config: MockProvider) -> None:
        self.name = name
        self._config = config

    def _body(self, request: ProxyRequest, model: str) -> dict[str, object]:
        try:
            body = request.json()
        except msgspec.DecodeError as exc:  # parse_messages accepted it, so this is not expected
            raise InvalidRequest(f"request body is not valid JSON: {exc}") from exc
        body["model"] = model
        return body

    @staticmethod
    def _message_id(request: ProxyRequest) -> str:
        return "msg_mock_" + request.request_id.rsplit("_", 1)[-1]

    async def open_stream(self, request: ProxyRequest, model: str) -> _MockStream:
        events = mock_events(
            self._body(request, model), deltas=self._config.deltas, message_id=self._message_id(request)
        )
        datas = [_encode(event) for event in events]
        raw = b"".join([encode_frame(event["type"], data) for event, data in zip(events, datas, strict=True)])
        return _MockStream(Batch(decode_views(datas), datas, raw), self._config, request.request_id)

    async def complete(self, request: ProxyRequest, model: str) -> JsonReply:
        if self._config.first_event_delay_ms:
            await asyncio.sleep(self._config.first_event_delay_ms / 1000)
        message = mock_message(
            self._body(request, model), deltas=self._config.deltas, message_id=self._message_id(request)
        )
        return JsonReply(200, _encode(message), {**_MOCK_HEADERS, "request-id": request.request_id})

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply:
        tokens = estimate_input_tokens(self._body(request, model))
        return JsonReply(200, _encode({"input_tokens": tokens}), {**_MOCK_HEADERS, "request-id": request.request_id})

    async def aclose(self) -> None:
        return None

"""The shared send path of the HTTP adapters (``adapters/_http.py``): prepare, authenticate, send, and the one
retry after a 401 when the auth can renew its token (Google's), none when it cannot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import pytest

from adapters._http import BearerAuth, HeaderAuth, HttpAdapter, Operation, Prepared, base_headers
from gateway.wire.errors import UpstreamStatusError
from gateway.wire.request import ProxyRequest
from gateway.wire.upstream import Timeouts

_OK = b'{"id":"m","type":"message","role":"assistant","content":[],"model":"x","usage":{"input_tokens":1}}'


class _Resp:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.headers: Mapping[str, str] = {"content-type": "application/json"}
        self._body = body
        self.closed = False

    async def chunks(self) -> AsyncGenerator[bytes]:
        yield self._body

    async def read(self, limit: int | None = None) -> bytes:
        return self._body

    def at_eof(self) -> bool:
        return True

    async def aclose(self) -> None:
        self.closed = True


class _Client:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.sent: list[dict[str, str]] = []
        self.responses: list[_Resp] = []

    async def send(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes | None, timeouts: Any
    ) -> _Resp:
        self.sent.append(dict(headers))
        status = self.statuses[len(self.sent) - 1]
        body = _OK if status == 200 else b'{"type":"error","error":{"type":"authentication_error","message":"no"}}'
        self.responses.append(_Resp(status, body))
        return self.responses[-1]


class _Adapter(HttpAdapter):
    async def prepare(self, request: ProxyRequest, model: str, operation: Operation) -> Prepared:
        return Prepared("http://upstream/v1/messages", request.body, base_headers("application/json"))


class _Tokens:
    def __init__(self) -> None:
        self.current = "t1"
        self.renewed: list[str] = []

    async def token(self) -> str:
        return self.current

    async def refresh_after_401(self, rejected: str) -> str:
        self.renewed.append(rejected)
        self.current = "t2"
        return self.current


REQUEST = ProxyRequest(body=b'{"model":"m","max_tokens":1,"messages":[]}', model="m", stream=False, request_id="r")


def test_a_401_renews_a_renewable_token_and_retries_once() -> None:
    tokens, client = _Tokens(), _Client([401, 200])
    adapter = _Adapter(
        "v", client, timeouts=Timeouts(1, 1), auth=BearerAuth(tokens.token, renew=tokens.refresh_after_401)
    )  # type: ignore[arg-type]
    reply = asyncio.run(adapter.complete(REQUEST, "m"))
    assert reply.status == 200 and tokens.renewed == ["t1"]
    assert [h["authorization"] for h in client.sent] == ["Bearer t1", "Bearer t2"]
    assert client.responses[0].closed  # the rejected answer was read and released


def test_a_second_401_and_a_static_key_are_the_providers_answer() -> None:
    tokens, client = _Tokens(), _Client([401, 401])
    adapter = _Adapter(
        "v", client, timeouts=Timeouts(1, 1), auth=BearerAuth(tokens.token, renew=tokens.refresh_after_401)
    )  # type: ignore[arg-type]
    with pytest.raises(UpstreamStatusError) as info:
        asyncio.run(adapter.complete(REQUEST, "m"))
    assert info.value.status_code == 401 and len(client.sent) == 2  # one renewal, never a loop
    static = _Client([401])
    keyed = _Adapter("c", static, timeouts=Timeouts(1, 1), auth=HeaderAuth({"x-api-key": "k"}))  # type: ignore[arg-type]
    with pytest.raises(UpstreamStatusError):
        asyncio.run(keyed.complete(REQUEST, "m"))
    assert len(static.sent) == 1 and static.sent[0]["x-api-key"] == "k"

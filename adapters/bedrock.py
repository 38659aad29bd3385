"""``kind: bedrock`` — Claude on Amazon Bedrock through InvokeModel / InvokeModelWithResponseStream, and
(``api: converse``) any model that speaks Converse / ConverseStream.

InvokeModel takes the Messages body minus ``model`` and ``stream``, plus ``anthropic_version`` and the
``anthropic-beta`` header as a body list (docs/wire-formats.md §3.3). Its stream is binary AWS event-stream; each
``chunk`` frame carries one first-party event as base64, which is passed on byte for byte — except the
final ``message_stop``, whose ``amazon-bedrock-invocationMetrics`` is stripped (and compared with the
stream's own usage). Exception frames become one canonical ``error`` event (§6 mapping table).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import msgspec

from gateway.settings import BedrockProvider
from gateway.wire.errors import InvalidRequest, NotSupported, UpstreamStatusError
from gateway.wire.request import ProxyRequest
from gateway.wire.upstream import HttpClient, UpstreamResponse

from ._aws import aws_auth, aws_region, bedrock_api_key
from ._bedrock_stream import (
    BEDROCK_ERRORS,
    STREAM_EXCEPTIONS,
    BedrockEventStream,
    ConverseEventStream,
    bedrock_error,
    decode_json,
    raise_for_bedrock,
)
from ._converse import ConverseUnsupported, from_converse_response, to_converse
from ._http import ACCEPT_JSON, HttpAdapter, Operation, Prepared, base_headers, provider_timeouts
from .base import EventStream, JsonReply, read_answer, url_model
from .profiles import filter_request

__all__ = ["BEDROCK_ERRORS", "STREAM_EXCEPTIONS", "BedrockAdapter", "BedrockConverseAdapter", "bedrock_error"]

_encode = msgspec.json.Encoder().encode

_EVENTSTREAM = "application/vnd.amazon.eventstream"


class BedrockAdapter(HttpAdapter):
    """InvokeModel / InvokeModelWithResponseStream (and CountTokens over an InvokeModel body)."""

    kind = "bedrock"
    # the operation each call is, and what it accepts back (for a stream: each chunk's payload too)
    _OPERATIONS: dict[Operation, tuple[str, dict[str, str]]] = {
        Operation.STREAM: (
            "invoke-with-response-stream",
            {"accept": _EVENTSTREAM, "x-amzn-bedrock-accept": ACCEPT_JSON},
        ),
        Operation.COMPLETE: ("invoke", {}),
        Operation.COUNT: ("count-tokens", {}),
    }

    def __init__(
        self,
        name: str,
        config: BedrockProvider,
        client: HttpClient,
        *,
        on_usage_mismatch: Callable[[], None] | None = None,
    ) -> None:
        self.region = region = aws_region(config.region, config.profile)
        auth = aws_auth(name, config, "bedrock", region, api_key=bedrock_api_key(config))
        timeouts = provider_timeouts(config)
        super().__init__(name, client, timeouts=timeouts, auth=auth, check=raise_for_bedrock)
        self._config = config
        self._on_mismatch = on_usage_mismatch
        self._base = (config.base_url or f"https://bedrock-runtime.{region}.amazonaws.com").rstrip("/")

    def url(self, model: str, operation: str) -> str:
        """``…/model/{modelId}/{operation}``; ``/`` in ARNs is sent as ``%2F``, ``:`` stays (as the SDKs do)."""
        return f"{self._base}/model/{url_model(model, arn=True, safe=':')}/{operation}"

    async def prepare(self, request: ProxyRequest, model: str, operation: Operation) -> Prepared:
        name, accept = self._OPERATIONS[operation]
        headers = {**base_headers(ACCEPT_JSON), **accept}
        body = self.count_body(request) if operation is Operation.COUNT else self.body(request)
        return Prepared(self.url(model, name), body, headers)

    def body(self, request: ProxyRequest, *, extra: dict[str, Any] | None = None) -> bytes:
        """The InvokeModel body: the client's, minus ``model``/``stream``, plus Bedrock's version and betas. The betas
        are the ``anthropic-beta`` header's (what ``server.forward_headers`` lets through), never a client's own
        ``anthropic_beta`` body field: without betas in the header the field is dropped."""
        kept = filter_request(self.profile, request)  # what Bedrock takes of the request (adapters/profiles.py)
        changes: dict[str, Any] = {**kept.set, "anthropic_version": self._config.anthropic_version}
        betas = kept.betas
        if betas:
            changes["anthropic_beta"] = betas
        if extra:
            changes.update(extra)
        drop = ("model", "stream", *kept.drop) if betas else ("model", "stream", "anthropic_beta", *kept.drop)
        return request.body_with(set=changes, drop=drop)

    def count_input(self, request: ProxyRequest) -> dict[str, Any]:
        """CountTokens' ``input``: the invoke body (no ``model``), ``max_tokens`` above any thinking budget (InvokeModel
        requires one, and one above the budget), no empty ``tools`` (refused)."""
        fields = request.fields()
        max_tokens = _int_field(fields.get("max_tokens"))
        budget = _thinking_budget(fields.get("thinking"))
        extra: dict[str, Any] = {}
        if max_tokens is None or (budget is not None and max_tokens <= budget):
            extra["max_tokens"] = max(max_tokens or 1, (budget or 0) + 1)
        body = self.body(request, extra=extra or None)
        tools = fields.get("tools")
        if tools is not None and len(memoryview(tools)) <= 8 and bytes(tools).strip() == b"[]":
            body = _encode({k: v for k, v in msgspec.json.decode(body).items() if k != "tools"})
        return {"invokeModel": {"body": base64.b64encode(body).decode()}}

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply:
        """Bedrock's CountTokens; an application inference profile (it cannot count) or a count Bedrock refuses is
        ``501 not_supported`` (``x-should-retry: false``): the client counts on its own (the gateway contract)."""
        self.url(model, "count-tokens")  # a name no URL may hold is a 400 first, as for every operation
        if ":application-inference-profile/" in model:
            raise NotSupported(
                f"count_tokens: Bedrock cannot count tokens for an application inference profile ({self.name!r})"
            )
        try:
            return await super().count_tokens(request, model)
        except UpstreamStatusError as exc:
            if exc.retryable or exc.status_code in (401, 403):  # its credentials, a throttle, an outage: as they are
                raise
            raise NotSupported(
                f"count_tokens: provider {self.name!r} could not count this request ({exc.message})"
            ) from exc

    def count_body(self, request: ProxyRequest) -> bytes:
        return _encode({"input": self.count_input(request)})

    def events(self, resp: UpstreamResponse, request: ProxyRequest, model: str) -> EventStream:
        return BedrockEventStream(resp, self.name, self._on_mismatch)

    async def reply(self, resp: UpstreamResponse, request: ProxyRequest, model: str, operation: Operation) -> JsonReply:
        if operation is Operation.COUNT:
            return await self._count_reply(resp)
        return await super().reply(resp, request, model, operation)

    async def _count_reply(self, resp: UpstreamResponse) -> JsonReply:
        """CountTokens answers ``{"inputTokens": n}``; the client reads ``{"input_tokens": n}``."""
        try:
            tokens = decode_json(await read_answer(resp, self.name))["inputTokens"]
        except (msgspec.DecodeError, KeyError, TypeError) as exc:
            raise UpstreamStatusError(
                502, "api_error", f"provider {self.name!r}: unexpected CountTokens answer"
            ) from exc
        return JsonReply.of(resp, _encode({"input_tokens": tokens}), 200)


class BedrockConverseAdapter(BedrockAdapter):
    """``api: converse``: Converse / ConverseStream, the Messages request and answer translated both ways."""

    _OPERATIONS: dict[Operation, tuple[str, dict[str, str]]] = {
        Operation.STREAM: ("converse-stream", {"accept": _EVENTSTREAM}),
        Operation.COMPLETE: ("converse", {}),
        Operation.COUNT: ("count-tokens", {}),
    }

    def body(self, request: ProxyRequest, *, extra: dict[str, Any] | None = None) -> bytes:
        kept = filter_request(self.profile, request)
        body = request.json()
        for name in kept.drop:
            body.pop(name, None)
        body.update(kept.set)
        try:
            return _encode(to_converse(body, betas=kept.betas or None))
        except ConverseUnsupported as exc:
            raise InvalidRequest(f"{exc} (provider {self.name!r} speaks Bedrock Converse)") from exc

    def count_input(self, request: ProxyRequest) -> dict[str, Any]:
        body = request.json()
        body.setdefault("max_tokens", 1)
        try:
            converse = to_converse(body)
        except ConverseUnsupported as exc:
            raise InvalidRequest(str(exc)) from exc
        kept = ("messages", "system", "toolConfig", "additionalModelRequestFields")
        return {"converse": {k: v for k, v in converse.items() if k in kept}}

    def events(self, resp: UpstreamResponse, request: ProxyRequest, model: str) -> EventStream:
        return ConverseEventStream(resp, self.name, model=model, message_id=_message_id(request))

    async def reply(self, resp: UpstreamResponse, request: ProxyRequest, model: str, operation: Operation) -> JsonReply:
        if operation is Operation.COUNT:
            return await self._count_reply(resp)
        try:
            answer = decode_json(await read_answer(resp, self.name))
            message = from_converse_response(answer, model=model, message_id=_message_id(request))
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise UpstreamStatusError(502, "api_error", f"provider {self.name!r}: unexpected Converse answer") from exc
        return JsonReply.of(resp, _encode(message), 200)


def _message_id(request: ProxyRequest) -> str:
    return "msg_" + request.request_id.rsplit("_", 1)[-1]


def _int_field(raw: msgspec.Raw | None) -> int | None:
    try:
        value = msgspec.json.decode(raw) if raw is not None else None
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _thinking_budget(raw: msgspec.Raw | None) -> int | None:
    """``thinking.budget_tokens`` of an enabled thinking block, else None."""
    try:
        thinking = msgspec.json.decode(raw) if raw is not None else None
    except msgspec.DecodeError:
        return None
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        return budget if isinstance(budget, int) and not isinstance(budget, bool) else None
    return None

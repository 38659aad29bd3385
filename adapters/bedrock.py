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
import os
from collections.abc import Callable
from typing import Any

import msgspec

from gateway.errors import InvalidRequest, UpstreamStatusError
from gateway.request import ProxyRequest
from gateway.settings import BedrockProvider
from gateway.upstream import HttpClient, Timeouts, UpstreamResponse

from ._aws import CredentialSource, SigV4Signer, sigv4_headers
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
from .base import JsonReply, checked, read_answer, url_model
from .claude import USER_AGENT, aws_region

__all__ = ["BEDROCK_ERRORS", "STREAM_EXCEPTIONS", "BedrockAdapter", "bedrock_error"]

_encode = msgspec.json.Encoder().encode


class BedrockAdapter:
    kind = "bedrock"

    def __init__(
        self,
        name: str,
        config: BedrockProvider,
        client: HttpClient,
        *,
        on_usage_mismatch: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._config = config
        self._client = client
        self._on_mismatch = on_usage_mismatch
        self.region = region = aws_region(config.region, config.profile)
        self._base = (config.base_url or f"https://bedrock-runtime.{region}.amazonaws.com").rstrip("/")
        self._timeouts = Timeouts(config.connect_timeout_s, config.read_timeout_s)
        api_key = config.api_key
        if not api_key and not (config.access_key_id or config.profile):
            api_key = os.environ.get("AWS_BEARER_TOKEN_BEDROCK") or None
        self._bearer = f"Bearer {api_key}" if api_key else None
        self._signer = SigV4Signer("bedrock", region)
        self._credentials = CredentialSource(
            provider=name,
            access_key_id=config.access_key_id,
            secret_access_key=config.secret_access_key,
            session_token=config.session_token,
            profile=config.profile,
        )
        self._converse = config.api == "converse"

    def url(self, model: str, operation: str) -> str:
        """``…/model/{modelId}/{operation}``; ``/`` in ARNs is sent as ``%2F``, ``:`` stays (as the SDKs do)."""
        return f"{self._base}/model/{url_model(model, arn=True, safe=':')}/{operation}"

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        headers["content-type"] = "application/json"
        headers["user-agent"] = USER_AGENT
        if self._bearer is not None:
            headers["authorization"] = self._bearer
        else:
            headers = await sigv4_headers(self._signer, self._credentials, "POST", url, headers, body)
        resp = await self._client.send("POST", url, headers=headers, body=body, timeouts=self._timeouts)
        return await checked(resp, self.name, raise_for_bedrock)

    def invoke_body(self, request: ProxyRequest, *, extra: dict[str, Any] | None = None) -> bytes:
        """The InvokeModel body: the client's, minus ``model``/``stream``, plus Bedrock's version and betas."""
        changes: dict[str, Any] = {"anthropic_version": self._config.anthropic_version}
        if request.anthropic_beta:
            changes["anthropic_beta"] = [b.strip() for b in request.anthropic_beta.split(",") if b.strip()]
        if extra:
            changes.update(extra)
        return request.body_with(set=changes, drop=("model", "stream"))

    async def open_stream(self, request: ProxyRequest, model: str) -> BedrockEventStream | ConverseEventStream:
        if self._converse:
            return await self._converse_stream(request, model)
        headers = {"accept": "application/vnd.amazon.eventstream", "x-amzn-bedrock-accept": "application/json"}
        resp = await self._post(self.url(model, "invoke-with-response-stream"), self.invoke_body(request), headers)
        return BedrockEventStream(resp, self.name, self._on_mismatch)

    async def complete(self, request: ProxyRequest, model: str) -> JsonReply:
        if self._converse:
            return await self._converse_complete(request, model)
        resp = await self._post(self.url(model, "invoke"), self.invoke_body(request), {"accept": "application/json"})
        return await JsonReply.read(resp, self.name, check_json=False)

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply:
        if self._converse:
            inner: dict[str, Any] = {"converse": _converse_count_input(request)}
        else:
            extra = None if "max_tokens" in request.fields() else {"max_tokens": 1}  # InvokeModel requires it
            inner = {"invokeModel": {"body": base64.b64encode(self.invoke_body(request, extra=extra)).decode()}}
        body = _encode({"input": inner})
        resp = await self._post(self.url(model, "count-tokens"), body, {"accept": "application/json"})
        try:
            tokens = decode_json(await read_answer(resp, self.name))["inputTokens"]
        except (msgspec.DecodeError, KeyError, TypeError) as exc:
            raise UpstreamStatusError(
                502, "api_error", f"provider {self.name!r}: unexpected CountTokens answer"
            ) from exc
        return JsonReply.of(resp, _encode({"input_tokens": tokens}), 200)

    # --- api: converse ------------------------------------------------------------------------------------

    def _converse_request(self, request: ProxyRequest) -> bytes:
        betas = [b.strip() for b in (request.anthropic_beta or "").split(",") if b.strip()] or None
        try:
            return _encode(to_converse(request.json(), betas=betas))
        except ConverseUnsupported as exc:
            raise InvalidRequest(f"{exc} (provider {self.name!r} speaks Bedrock Converse)") from exc

    async def _converse_stream(self, request: ProxyRequest, model: str) -> ConverseEventStream:
        body = self._converse_request(request)
        headers = {"accept": "application/vnd.amazon.eventstream"}
        resp = await self._post(self.url(model, "converse-stream"), body, headers)
        return ConverseEventStream(resp, self.name, model=model, message_id=_message_id(request))

    async def _converse_complete(self, request: ProxyRequest, model: str) -> JsonReply:
        body = self._converse_request(request)
        resp = await self._post(self.url(model, "converse"), body, {"accept": "application/json"})
        try:
            answer = decode_json(await read_answer(resp, self.name))
            message = from_converse_response(answer, model=model, message_id=_message_id(request))
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise UpstreamStatusError(502, "api_error", f"provider {self.name!r}: unexpected Converse answer") from exc
        return JsonReply.of(resp, _encode(message), 200)

    async def aclose(self) -> None:
        return None


def _message_id(request: ProxyRequest) -> str:
    return "msg_" + request.request_id.rsplit("_", 1)[-1]


def _converse_count_input(request: ProxyRequest) -> dict[str, Any]:
    body = request.json()
    body.setdefault("max_tokens", 1)
    try:
        converse = to_converse(body)
    except ConverseUnsupported as exc:
        raise InvalidRequest(str(exc)) from exc
    return {
        k: v for k, v in converse.items() if k in ("messages", "system", "toolConfig", "additionalModelRequestFields")
    }

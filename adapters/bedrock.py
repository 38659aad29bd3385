"""``kind: bedrock`` — Claude on Amazon Bedrock through InvokeModel / InvokeModelWithResponseStream, and
(``api: converse``) any model that speaks Converse / ConverseStream.

InvokeModel takes the Messages body minus ``model`` and ``stream``, plus ``anthropic_version`` and the
``anthropic-beta`` header as a body list (protocols.md §3.3). Its stream is binary AWS event-stream; each
``chunk`` frame carries one first-party event as base64, which is passed on byte for byte — except the
final ``message_stop``, whose ``amazon-bedrock-invocationMetrics`` is stripped (and compared with the
stream's own usage). Exception frames become one canonical ``error`` event (§6 mapping table).
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncGenerator, Callable
from typing import Any
from urllib.parse import quote

import msgspec

from gateway.errors import InvalidRequest, UpstreamStatusError, error_type_for_status
from gateway.events import Batch, ErrorDetail, ErrorEvent, Usage, decode_views, encode_event
from gateway.request import ProxyRequest
from gateway.settings import BedrockProvider
from gateway.upstream import HttpClient, StreamInterrupted, Timeouts, UpstreamResponse
from gateway.usage import fold_usage

from ._aws import CredentialSource, SigV4Signer, sigv4_headers
from ._eventstream import EventStreamDecoder, EventStreamError, EventStreamMessage, parse_headers
from .base import JsonReply, batch_of_block
from .claude import USER_AGENT, aws_region

__all__ = [
    "BEDROCK_ERRORS",
    "STREAM_EXCEPTIONS",
    "BedrockAdapter",
    "BedrockEventStream",
    "ConverseEventStream",
    "bedrock_error",
    "error_batch",
]

# protocols.md §3.5: Bedrock exception name -> (HTTP status, Anthropic error type) for the client.
BEDROCK_ERRORS: dict[str, tuple[int, str]] = {
    "ValidationException": (400, "invalid_request_error"),
    "ServiceQuotaExceededException": (429, "rate_limit_error"),
    "AccessDeniedException": (403, "permission_error"),
    "ResourceNotFoundException": (404, "not_found_error"),
    "ModelTimeoutException": (504, "timeout_error"),
    "ThrottlingException": (429, "rate_limit_error"),
    "ModelNotReadyException": (529, "overloaded_error"),
    "ModelErrorException": (500, "api_error"),
    "ModelStreamErrorException": (500, "api_error"),
    "InternalServerException": (500, "api_error"),
    "ServiceUnavailableException": (529, "overloaded_error"),
}

# §6: exception members of the response stream -> Anthropic error type of the terminal `error` event.
STREAM_EXCEPTIONS: dict[str, str] = {
    "throttlingException": "rate_limit_error",
    "serviceUnavailableException": "overloaded_error",
    "modelTimeoutException": "timeout_error",
    "validationException": "invalid_request_error",
    "internalServerException": "api_error",
    "modelStreamErrorException": "api_error",
}

_METRICS_KEY = "amazon-bedrock-invocationMetrics"
_METRICS_BYTES = _METRICS_KEY.encode()


class _Chunk(msgspec.Struct):
    data: bytes = msgspec.field(default=b"", name="bytes")  # base64 in the JSON; padding ("p") is ignored


class _InvocationMetrics(msgspec.Struct, rename="camel"):
    input_token_count: int | None = None
    output_token_count: int | None = None
    cache_read_input_token_count: int | None = None
    cache_write_input_token_count: int | None = None


class _AwsErrorBody(msgspec.Struct):
    message: str | None = None
    Message: str | None = None
    type_: str | None = msgspec.field(default=None, name="__type")


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_chunks = msgspec.json.Decoder(list[_Chunk]).decode
_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_metrics = msgspec.json.Decoder(_InvocationMetrics).decode
_decode_error_body = msgspec.json.Decoder(_AwsErrorBody).decode
_decode_message = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode


def _error_data(error_type: str, message: str) -> bytes:
    return encode_event(ErrorEvent(error=ErrorDetail(type=error_type, message=message)))


def error_batch(error_type: str, message: str) -> Batch:
    data = _error_data(error_type, message)
    return Batch(decode_views([data]), [data])


def bedrock_error(status: int, error_code: str | None, message: str, provider: str) -> UpstreamStatusError:
    """A pre-stream Bedrock failure as the Anthropic error the client's SDK understands (§3.5)."""
    name = (error_code or "").split(":", 1)[0].rsplit("#", 1)[-1]
    mapped = BEDROCK_ERRORS.get(name)
    client_status, error_type = mapped if mapped else (status, error_type_for_status(status))
    if not message:
        message = f"provider {provider!r} answered HTTP {status}" + (f" ({name})" if name else "")
    return UpstreamStatusError(client_status, error_type, message)


async def raise_for_bedrock(resp: UpstreamResponse, provider: str) -> None:
    status = resp.status
    if 200 <= status < 300:
        return
    body = await resp.read()
    try:
        parsed = _decode_error_body(body)
    except msgspec.DecodeError:
        parsed = _AwsErrorBody(message=body[:300].decode("utf-8", "replace").strip() or None)
    code = resp.headers.get("x-amzn-errortype") or parsed.type_
    raise bedrock_error(status, code, parsed.message or parsed.Message or "", provider)


class BedrockEventStream:
    """InvokeModelWithResponseStream's event-stream → batches of first-party events."""

    __slots__ = ("_name", "_on_mismatch", "_resp", "headers")

    def __init__(self, resp: UpstreamResponse, provider: str, on_mismatch: Callable[[], None] | None) -> None:
        self._resp = resp
        self._name = provider
        self._on_mismatch = on_mismatch
        self.headers: dict[str, str] = {}

    async def batches(self) -> AsyncGenerator[Batch]:
        decoder = EventStreamDecoder()
        chunk_headers = b""  # the header block of this stream's chunk frames, once seen
        usage = Usage()
        try:
            async for received in self._resp.chunks():
                failure: bytes | None = None
                try:
                    frames = decoder.feed_raw(received)
                except EventStreamError as exc:  # what arrived intact before the damage still goes out
                    frames = exc.decoded
                    failure = _error_data("api_error", f"provider {self._name!r}: damaged event stream: {exc}")
                if not frames and failure is None:
                    continue
                payloads: list[bytes] = []
                for raw_headers, payload in frames:
                    if raw_headers == chunk_headers:
                        payloads.append(payload)
                        continue
                    headers = parse_headers(raw_headers)
                    kind = headers.get(":message-type")
                    if kind == "event":
                        if headers.get(":event-type") == "chunk":
                            chunk_headers = raw_headers
                            payloads.append(payload)
                    else:
                        failure = self._failure(EventStreamMessage(headers, payload))
                        break
                datas = self._chunk_datas(payloads) if payloads else []
                if failure is None and len(datas) < len(payloads):
                    failure = _error_data("api_error", f"provider {self._name!r}: undecodable event-stream chunk")
                if failure is not None:
                    datas.append(failure)
                if not datas:
                    continue
                views = decode_views(datas)
                for i, view in enumerate(views):
                    etype = view.type
                    if etype == "message_delta" or etype == "message_start":
                        usage = fold_usage(usage, view)
                    elif etype == "message_stop" and _METRICS_BYTES in datas[i]:
                        datas[i] = self._strip_metrics(datas[i], usage)
                yield Batch(views, datas)
                if failure is not None:
                    return
            decoder.close()
        except EventStreamError as exc:
            yield error_batch("api_error", f"provider {self._name!r}: damaged event stream: {exc}")
        except StreamInterrupted as exc:
            if decoder.pending:  # the connection broke inside a frame
                message = f"provider {self._name!r}: connection lost inside an event-stream frame"
                raise StreamInterrupted(message) from exc
            raise

    @staticmethod
    def _chunk_datas(payloads: list[bytes]) -> list[bytes]:
        """Each chunk's event bytes (``{"bytes": <base64>, "p": <padding>}``), all decoded in one call; when one
        is malformed, the ones before it (fewer than ``payloads``)."""
        try:
            return [c.data for c in _decode_chunks(b"[" + b",".join(payloads) + b"]")]
        except msgspec.DecodeError:
            datas = []
            for payload in payloads:
                try:
                    datas.append(_decode_chunk(payload).data)
                except msgspec.DecodeError:
                    break
            return datas

    def _failure(self, message: EventStreamMessage) -> bytes:
        headers = message.headers
        if headers.get(":message-type") == "exception":
            name = str(headers.get(":exception-type", ""))
            try:
                body = _decode_error_body(message.payload)
                text = body.message or body.Message or ""
            except msgspec.DecodeError:
                text = ""
            error_type = STREAM_EXCEPTIONS.get(name, "api_error")
            return _error_data(error_type, text or f"provider {self._name!r}: {name or 'exception'} mid-stream")
        code = _text(headers.get(":error-code"))
        text = _text(headers.get(":error-message")) or "error"
        return _error_data("api_error", f"provider {self._name!r}: {code}: {text}" if code else text)

    def _strip_metrics(self, data: bytes, usage: Usage) -> bytes:
        """``message_stop`` without Bedrock's metrics; the metrics are checked against the stream's usage."""
        fields = _decode_fields(data)
        raw = fields.pop(_METRICS_KEY, None)
        if raw is not None and self._on_mismatch is not None and _mismatch(_decode_metrics(raw), usage):
            self._on_mismatch()
        return _encode(fields)

    async def aclose(self) -> None:
        await self._resp.aclose()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _mismatch(metrics: _InvocationMetrics, usage: Usage) -> bool:
    pairs = (
        (metrics.input_token_count, usage.input_tokens),
        (metrics.output_token_count, usage.output_tokens),
        (metrics.cache_read_input_token_count, usage.cache_read_input_tokens),
        (metrics.cache_write_input_token_count, usage.cache_creation_input_tokens),
    )
    return any(reported is not None and reported != (ours or 0) for reported, ours in pairs)


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
        return f"{self._base}/model/{quote(model, safe=':')}/{operation}"

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        headers["content-type"] = "application/json"
        headers["user-agent"] = USER_AGENT
        if self._bearer is not None:
            headers["authorization"] = self._bearer
        else:
            headers = await sigv4_headers(self._signer, self._credentials, "POST", url, headers, body)
        resp = await self._client.send("POST", url, headers=headers, body=body, timeouts=self._timeouts)
        try:
            await raise_for_bedrock(resp, self.name)
        except BaseException:
            await resp.aclose()
            raise
        return resp

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
        return JsonReply(resp.status, await resp.read())

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply:
        if self._converse:
            inner: dict[str, Any] = {"converse": _converse_count_input(request)}
        else:
            extra = None if "max_tokens" in request.fields() else {"max_tokens": 1}  # InvokeModel requires it
            inner = {"invokeModel": {"body": base64.b64encode(self.invoke_body(request, extra=extra)).decode()}}
        body = _encode({"input": inner})
        resp = await self._post(self.url(model, "count-tokens"), body, {"accept": "application/json"})
        try:
            tokens = _decode_message(await resp.read())["inputTokens"]
        except (msgspec.DecodeError, KeyError, TypeError) as exc:
            raise UpstreamStatusError(
                502, "api_error", f"provider {self.name!r}: unexpected CountTokens answer"
            ) from exc
        return JsonReply(200, _encode({"input_tokens": tokens}))

    # --- api: converse ------------------------------------------------------------------------------------

    def _converse_request(self, request: ProxyRequest) -> bytes:
        from ._converse import ConverseUnsupported, to_converse

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
        from ._converse import from_converse_response

        body = self._converse_request(request)
        resp = await self._post(self.url(model, "converse"), body, {"accept": "application/json"})
        try:
            answer = _decode_message(await resp.read())
            message = from_converse_response(answer, model=model, message_id=_message_id(request))
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise UpstreamStatusError(502, "api_error", f"provider {self.name!r}: unexpected Converse answer") from exc
        return JsonReply(200, _encode(message))

    async def aclose(self) -> None:
        return None


def _message_id(request: ProxyRequest) -> str:
    return "msg_" + request.request_id.rsplit("_", 1)[-1]


def _converse_count_input(request: ProxyRequest) -> dict[str, Any]:
    from ._converse import ConverseUnsupported, to_converse

    body = request.json()
    body.setdefault("max_tokens", 1)
    try:
        converse = to_converse(body)
    except ConverseUnsupported as exc:
        raise InvalidRequest(str(exc)) from exc
    return {
        k: v for k, v in converse.items() if k in ("messages", "system", "toolConfig", "additionalModelRequestFields")
    }


class ConverseEventStream:
    """ConverseStream's event-stream → the canonical sequence, through the sans-IO ``ConverseTranscoder``."""

    __slots__ = ("_message_id", "_model", "_name", "_resp", "headers")

    def __init__(self, resp: UpstreamResponse, provider: str, *, model: str, message_id: str) -> None:
        self._resp = resp
        self._name = provider
        self._model = model
        self._message_id = message_id
        self.headers: dict[str, str] = {}

    async def batches(self) -> AsyncGenerator[Batch]:
        from ._converse import ConverseTranscoder

        transcoder = ConverseTranscoder(model=self._model, message_id=self._message_id)
        decoder = EventStreamDecoder()
        try:
            async for chunk in self._resp.chunks():
                out: list[bytes] = []
                failed = False
                for message in decoder.feed(chunk):
                    headers = message.headers
                    kind = headers.get(":message-type")
                    payload = _decode_message(message.payload) if message.payload else {}
                    if kind == "event":
                        out.append(transcoder.feed(str(headers.get(":event-type", "")), payload))
                    elif kind == "exception":
                        out.append(transcoder.exception(str(headers.get(":exception-type", "")), payload))
                        failed = True
                        break
                    else:
                        text = f"{_text(headers.get(':error-code')) or 'error'}: {_text(headers.get(':error-message'))}"
                        out.append(_sse_error("api_error", f"provider {self._name!r}: {text}"))
                        failed = True
                        break
                block = b"".join(out)
                if block:
                    yield batch_of_block(block)
                if failed:
                    return
            decoder.close()
            tail = transcoder.close()
            if tail:
                yield batch_of_block(tail)
        except EventStreamError as exc:
            yield error_batch("api_error", f"provider {self._name!r}: damaged event stream: {exc}")
        except (msgspec.DecodeError, TypeError, KeyError) as exc:
            yield error_batch("api_error", f"provider {self._name!r}: undecodable Converse event: {exc}")

    async def aclose(self) -> None:
        await self._resp.aclose()


def _sse_error(error_type: str, message: str) -> bytes:
    return b"event: error\ndata: " + _error_data(error_type, message) + b"\n\n"

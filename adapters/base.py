"""What every provider adapter offers the pipeline, and the pieces they share.

An adapter is long-lived and stateless; per-request state lives in the ``EventStream`` it opens.
``open_stream`` returns once the provider has answered with a 2xx status and headers (a non-2xx
answer raises a ``GatewayError`` with the mapped status, before anything reached the client); the
stream then yields *batches* of events, one batch per upstream read, so the pipeline writes to the
client once per read rather than once per event.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Protocol
from urllib.parse import quote

import msgspec

from gateway.wire.errors import InvalidRequest, UpstreamStatusError, error_type_for_status
from gateway.wire.events import MALFORMED, Batch, decode_view, decode_views
from gateway.wire.request import ProxyRequest
from gateway.wire.sse import FrameTooLarge, SseDecoder, names_match, split_block, split_canonical
from gateway.wire.upstream import MAX_ANSWER_BYTES, MAX_ERROR_BYTES, BodyTooLarge, StreamInterrupted, UpstreamResponse

from ._provider_messages import VERTEX_TOO_BIG, client_message

__all__ = [
    "NOT_JSON",
    "Adapter",
    "EventStream",
    "JsonReply",
    "SseEventStream",
    "batch_of_block",
    "checked",
    "forwardable_headers",
    "provider_request_id",
    "raise_for_redirect",
    "raise_for_upstream",
    "read_answer",
    "read_error_body",
    "url_model",
]


class JsonReply:
    """A complete JSON answer (non-streamed message, token count): the headers to forward and the provider's own
    request id."""

    __slots__ = ("body", "headers", "request_id", "status")

    def __init__(
        self, status: int, body: bytes, headers: Mapping[str, str] | None = None, *, request_id: str = ""
    ) -> None:
        self.status = status
        self.body = body
        self.headers: dict[str, str] = dict(headers or {})
        self.request_id = request_id or self.headers.get("request-id", "")

    @classmethod
    async def read(cls, resp: UpstreamResponse, provider: str, *, check_json: bool = True) -> JsonReply:
        """The JSON answer ``resp`` carries (``read_answer``: capped, and checked to be JSON unless the caller
        decodes it anyway)."""
        return cls.of(resp, await read_answer(resp, provider, check_json=check_json))

    @classmethod
    def of(cls, resp: UpstreamResponse, body: bytes, status: int | None = None) -> JsonReply:
        """``body`` as the answer to ``resp`` (its status unless given), with its forwardable headers and id."""
        headers = resp.headers
        return cls(
            resp.status if status is None else status,
            body,
            forwardable_headers(headers),
            request_id=provider_request_id(headers),
        )


class EventStream(Protocol):
    headers: dict[str, str]  # the provider's response headers a client reads (forwardable_headers)
    request_id: str  # the provider's own id of the request (provider_request_id), "" when it gave none

    def batches(self) -> AsyncGenerator[Batch]: ...

    def at_eof(self) -> bool:
        """Whether the provider's body has arrived to its end: finishing ``batches`` waits for nothing."""
        ...

    async def aclose(self) -> None: ...


class Adapter(Protocol):
    """A provider. ``name`` is the provider's key in the config; ``kind`` its type."""

    name: str
    kind: str

    async def open_stream(self, request: ProxyRequest, model: str) -> EventStream: ...

    async def complete(self, request: ProxyRequest, model: str) -> JsonReply: ...

    async def count_tokens(self, request: ProxyRequest, model: str) -> JsonReply: ...

    async def aclose(self) -> None: ...


log = logging.getLogger("gateway")

_FORWARD_EXACT = frozenset({"request-id", "retry-after", "retry-after-ms", "x-should-retry"})
_FORWARD_PREFIXES = ("anthropic-ratelimit-", "anthropic-priority-")


_NOT_IN_A_MODEL_ID = re.compile(r"[/?#%\s\x00-\x1f\x7f]")
_NOT_IN_AN_ARN = re.compile(r"[?#%\s\x00-\x1f\x7f]")


def url_model(model: str, *, arn: bool = False, safe: str = "") -> str:
    """``model`` as one escaped path segment of an upstream URL, or ``InvalidRequest`` (400) if it could change the
    URL: a ``/ ? # %``, white space, a control character, or ``.``/``..``. With ``arn`` a Bedrock ARN may hold
    ``/`` (escaped as ``%2F``), but no dot segment. So the name a key's allow-list matched is exactly the model
    the provider is asked for, and nothing else can be reached with the gateway's credentials."""
    if arn and model.startswith("arn:"):
        bad = _NOT_IN_AN_ARN.search(model) is not None or any(part in (".", "..") for part in model.split("/"))
    else:
        bad = _NOT_IN_A_MODEL_ID.search(model) is not None or model in (".", "..") or not model
    if bad:
        raise InvalidRequest(
            f"model {model[:80]!r} is not a valid model id for this provider (no /, ?, #, %, spaces or dot segments)"
        )
    return quote(model, safe=safe)


def provider_request_id(headers: Mapping[str, str]) -> str:
    """The provider's own id for a request, from its response headers (case-insensitive): ``request-id`` (the
    Claude API, Vertex, Foundry), else AWS's ``x-amzn-requestid`` (Bedrock; what an AWS support case asks for);
    "" without one. Kept for the access line, never sent to the client unless it is ``request-id``."""
    for name in ("request-id", "x-amzn-requestid"):
        value = headers.get(name)
        if value and _REQUEST_ID.fullmatch(value):
            return value
    return ""


def forwardable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The provider response headers a client's SDK reads: request id, retry hints, rate limits. A
    ``request-id`` that is not a short token is dropped (the gateway's own id stays)."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if low in _FORWARD_EXACT or low.startswith(_FORWARD_PREFIXES):
            if low == "request-id" and not _REQUEST_ID.fullmatch(value):
                continue
            out[low] = value
    return out


_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
"""What a provider's request id may look like to be kept (``req_…``, a UUID, Vertex's and Foundry's forms): a
short token, so it can go into a response header and the access line as it is."""


class _ErrorBody(msgspec.Struct):
    type: str = ""
    message: str = ""
    code: int | str | None = None  # Google (int) and Azure (str) error shapes
    status: str = ""  # Google: RESOURCE_EXHAUSTED, UNAVAILABLE, ...


class _Envelope(msgspec.Struct):
    type: str = ""
    error: _ErrorBody | None = None


_decode_envelope = msgspec.json.Decoder(_Envelope | list[_Envelope]).decode

# Google's canonical error codes -> (client status, Anthropic error type), where the HTTP status alone misleads.
_GOOGLE_STATUS = {
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (529, "overloaded_error"),
    "DEADLINE_EXCEEDED": (504, "timeout_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "not_found_error"),
}


async def checked(
    resp: UpstreamResponse,
    provider: str,
    check: Callable[[UpstreamResponse, str], Awaitable[None]] | None = None,
) -> UpstreamResponse:
    """``resp`` if it succeeded; otherwise the Anthropic error that ``check`` (``raise_for_upstream`` by
    default; Bedrock passes its own) maps it to, with the response closed."""
    try:
        await (check or raise_for_upstream)(resp, provider)
    except BaseException:
        await resp.aclose()
        raise
    return resp


async def read_error_body(resp: UpstreamResponse, provider: str) -> bytes:
    """An error answer's body, at most ``MAX_ERROR_BYTES`` decompressed (a 300-character message needs no more;
    a gzipped 500 that inflates to gigabytes is refused, not inflated)."""
    try:
        return await resp.read(MAX_ERROR_BYTES)
    except BodyTooLarge:
        raise UpstreamStatusError(
            502,
            "api_error",
            f"provider {provider!r} answered HTTP {resp.status} with an error body over {MAX_ERROR_BYTES} bytes",
            request_id=provider_request_id(resp.headers),
        ) from None


async def read_answer(resp: UpstreamResponse, provider: str, *, check_json: bool = True) -> bytes:
    """A JSON answer's body, at most ``MAX_ANSWER_BYTES`` decompressed, UTF-8, and JSON: a provider that answers
    200 with something else (an HTML page, a truncated body) is an upstream error, not a message. With
    ``check_json=False`` the caller decodes the body itself and answers a non-JSON one the same way."""
    try:
        body = await resp.read(MAX_ANSWER_BYTES)
    except BodyTooLarge:
        raise UpstreamStatusError(
            502,
            "api_error",
            f"provider {provider!r} answered with a body over {MAX_ANSWER_BYTES} bytes",
            request_id=provider_request_id(resp.headers),
        ) from None
    try:
        if check_json:
            _check_json(body)  # (a message's answer is parsed by the pipeline's usage decode anyway)
        if not body.isascii():
            body.decode("utf-8")  # msgspec skips over strings it does not decode: check them here
    except (msgspec.DecodeError, UnicodeDecodeError):
        raise UpstreamStatusError(
            502,
            "api_error",
            f"provider {provider!r} {NOT_JSON}",
            request_id=provider_request_id(resp.headers),
        ) from None
    return body


_check_json = msgspec.json.Decoder(msgspec.Raw).decode  # validates the whole document, builds nothing

NOT_JSON = "answered with a body that is not JSON (or not UTF-8)"


def raise_for_redirect(status: int, provider: str, request_id: str = "") -> None:
    """A 3xx is an upstream error (502 ``api_error``): the gateway never follows a redirect, so the provider's
    key never goes to another host, and no other host's answer reaches the client."""
    if 300 <= status < 400:
        log.warning("provider %r answered a Messages call with a redirect (HTTP %d): not followed", provider, status)
        raise UpstreamStatusError(
            502,
            "api_error",
            f"provider {provider!r} answered with a redirect (HTTP {status}), which is not followed",
            request_id=request_id,
        )


async def raise_for_upstream(resp: UpstreamResponse, provider: str) -> None:
    """Map a non-2xx provider answer to an Anthropic error. The Anthropic envelope is kept as it came; the
    Google (``{"error":{"code","message","status"}}``, possibly inside a list) and Azure
    (``{"error":{"code","message"}}``) shapes become the envelope with the matching type."""
    status = resp.status
    if 200 <= status < 300:
        return
    rid = provider_request_id(resp.headers)
    raise_for_redirect(status, provider, rid)
    body = await read_error_body(resp, provider)
    headers = forwardable_headers(resp.headers)
    try:
        decoded = _decode_envelope(body)
        parsed = decoded[0] if isinstance(decoded, list) and decoded else decoded
    except msgspec.DecodeError:
        parsed = _Envelope()
    if not isinstance(parsed, _Envelope):
        parsed = _Envelope()
    error = parsed.error
    if parsed.type == "error" and error is not None and error.type:
        message = error.message
        if status not in (400, 413) or VERTEX_TOO_BIG.search(message or ""):  # a 400/413 envelope is relayed
            message = client_message(message, provider=provider, error_type=error.type, request_id=rid)
        if message == error.message:
            raise UpstreamStatusError(status, error.type, message, headers=headers, body=body, request_id=rid)
        raise UpstreamStatusError(status, error.type, message, headers=headers, request_id=rid)
    if error is not None and error.message:  # Google / Azure shape
        client_status, error_type = _GOOGLE_STATUS.get(error.status, (status, error_type_for_status(status)))
        if status == 503 and not error.status:
            client_status, error_type = 529, "overloaded_error"
        message = client_message(error.message, provider=provider, error_type=error_type, request_id=rid)
        raise UpstreamStatusError(client_status, error_type, message, headers=headers, request_id=rid)
    text = body[:300].decode("utf-8", "replace").strip()
    message = f"provider {provider!r} answered HTTP {status}" + (f": {text}" if text else "")
    error_type = error_type_for_status(status)
    message = client_message(message, provider=provider, error_type=error_type, request_id=rid)
    raise UpstreamStatusError(status, error_type, message, headers=headers, request_id=rid)


def batch_of_block(block: bytes) -> Batch:
    """The events of a block of complete SSE frames: exact data bytes plus their partial views. The block
    itself is kept as the batch's canonical bytes when every frame is canonical and names its own type."""
    # One frame, the common case for a paced token stream: ``event: <name>\ndata: <json>\n\n``, exactly three
    # newlines. Found by where its first two are (memchr, stopping at the first data line's end in a block of many
    # frames), never by counting a whole block's (a byte at a time: ~5 % of a 200-event stream's instructions).
    first = block.find(b"\n")
    if (
        block.startswith(b"data: ", first + 1)
        and block.find(b"\n", first + 1) == len(block) - 2
        and block.endswith(b"\n\n")
        and block.startswith(b"event: ")
    ):
        data = block[first + 7 : -2]
        try:
            one = decode_view(data)
        except msgspec.DecodeError:
            one = MALFORMED
        if one.type.encode() == block[7:first]:
            return Batch([one], [data], block)
    canonical = split_canonical(block)
    if canonical is not None:
        views = decode_views([], canonical.array)  # [] when any event is malformed: handled frame by frame below
        if len(views) == canonical.frame_count and names_match(canonical.events, views):
            return Batch(views, None, block)
    names, datas = split_block(block)
    views = decode_views(datas)
    for view, name in zip(views, names, strict=True):
        if not view.type and name and view is not MALFORMED:  # the event name stands in for a missing type
            view.type = name.decode("utf-8", "replace")
    return Batch(views, datas)


_FIRST_DELTA = b"event: content_block_delta\n"
_SPLIT_MIN = 4096


def split_after_first_delta(block: bytes) -> tuple[bytes, bytes]:
    """Cut a stream's first large block after its first delta, so that the first token goes out (and
    the client's response starts) before the rest of the block is decoded and checked. Small blocks and
    blocks without a delta stay whole: ``(b"", block)``."""
    if len(block) < _SPLIT_MIN:
        return b"", block
    at = block.find(_FIRST_DELTA)
    end = block.find(b"\n\n", at) + 2 if at >= 0 else 1
    if at < 0 or end == 1 or end >= len(block):
        return b"", block
    return block[:end], block[end:]


class SseEventStream:
    """The event stream of a provider that already speaks the canonical SSE (Claude API, Foundry…)."""

    __slots__ = ("_resp", "headers", "request_id")

    def __init__(self, resp: UpstreamResponse) -> None:
        self._resp = resp
        self.headers = forwardable_headers(resp.headers)
        self.request_id = provider_request_id(resp.headers)

    async def batches(self) -> AsyncGenerator[Batch]:
        feed = SseDecoder().feed_block
        first = True
        async with aclosing(self._resp.chunks()) as chunks:  # closed with this generator, not at GC
            async for chunk in chunks:
                try:
                    block = feed(chunk)
                except FrameTooLarge as exc:
                    raise StreamInterrupted(f"the provider's stream broke the limits: {exc}") from None
                if not block:
                    continue
                if first:
                    first = False
                    head, block = split_after_first_delta(block)
                    if head:
                        yield batch_of_block(head)
                        if not block:
                            continue
                yield batch_of_block(block)

    def at_eof(self) -> bool:
        return self._resp.at_eof()

    async def aclose(self) -> None:
        await self._resp.aclose()

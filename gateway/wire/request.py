"""The canonical request: the client's body bytes, a checked view of its head, and the client headers
that matter to providers.

The body is validated once, shallowly (the fields the gateway routes and fails on), and kept as the
bytes that arrived; a rewrite (a different upstream model id, a provider's own ``anthropic_version``)
re-encodes only the top level, with every nested value carried as raw JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any

import msgspec

from gateway.wire.errors import InvalidRequest, RequestTooLarge

__all__ = [
    "BETA_NAME",
    "NEVER_FORWARDED",
    "CountTokensHead",
    "MessagesHead",
    "ProxyRequest",
    "check_betas",
    "check_duplicates",
    "check_max_tokens",
    "check_model_name",
    "client_id",
    "duplicate_key_py",
    "forwarded_headers",
    "parse_count_tokens",
    "parse_messages",
    "proxy_request",
    "read_body",
]


class _MessageParam(msgspec.Struct):
    role: str
    content: str | list[msgspec.Raw]


class MessagesHead(msgspec.Struct):
    model: Annotated[str, msgspec.Meta(min_length=1)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    messages: list[_MessageParam]
    stream: bool | None = None
    # the sampling parameters a traced request's spans carry (gen_ai.request.*): read as they are, not checked
    # (the provider answers a mistyped one; the spans leave it out)
    temperature: Any = None
    top_p: Any = None
    top_k: Any = None
    stop_sequences: Any = None


class CountTokensHead(msgspec.Struct):
    model: Annotated[str, msgspec.Meta(min_length=1)]
    messages: list[_MessageParam]


_decode_messages = msgspec.json.Decoder(MessagesHead).decode
_decode_count = msgspec.json.Decoder(CountTokensHead).decode
_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_encode = msgspec.json.Encoder().encode


def _explain(exc: msgspec.DecodeError) -> str:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        if " - at `$." in text:
            reason, _, path = text.partition(" - at `$.")
            return f"{path.rstrip('`')}: {reason}"
        if text.startswith("Object missing required field"):
            return text.replace("Object missing required field", "missing required field")
        return f"request body: {text}"
    return f"request body is not valid JSON: {text}"


_TOO_DEEP = "request body is nested too deeply to decode"

_ONCE = (b"model", b"stream", b"max_tokens")  # routed, authorised and checked on: each may be given once
_top_level_duplicate: Callable[[bytes, tuple[bytes, ...]], bytes | None] | None
try:  # gateway/wire/_views_c.c: a walk of the top-level object, nested values skipped
    from gateway.wire._views_c import top_level_duplicate as _top_level_duplicate
except ImportError:  # pragma: no cover - no compiler where it was installed
    _top_level_duplicate = None


def duplicate_key_py(body: bytes, names: tuple[bytes, ...] = _ONCE) -> bytes | None:
    """The first of ``names`` that is a top-level key of ``body`` more than once (the reference; the C walk is
    tested equal to it), decoding the whole body with the standard library."""
    top: list[list[tuple[str, Any]]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        top[:] = [items]  # objects end inner first: the last one is the top level
        return {}

    try:
        json.loads(body, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None  # msgspec reports what is wrong with it
    if not top:
        return None
    seen: set[str] = set()
    wanted = {name.decode(): name for name in names}
    for key, _ in top[0]:
        if key in wanted:
            if key in seen:
                return wanted[key]
            seen.add(key)
    return None


def check_duplicates(body: bytes) -> None:
    """``InvalidRequest`` when ``model``, ``stream`` or ``max_tokens`` is a top-level key twice: msgspec keeps the
    last, a provider may keep the first, so the request could be routed and allowed as one model and served as
    another. In C when gateway.wire._views_c is built; otherwise the standard library decodes the bodies that could
    hold a duplicate (a name twice anywhere, or an escape)."""
    if _top_level_duplicate is not None:
        found = _top_level_duplicate(body, _ONCE)
        if found == b"\\":  # a top-level key with an escape: decode properly
            found = duplicate_key_py(body)
    elif b"\\" in body or any(body.count(b'"%s"' % name) > 1 for name in _ONCE):
        found = duplicate_key_py(body)
    else:
        found = None
    if found is not None:
        raise InvalidRequest(f"{found.decode()}: given more than once in the request body")


def parse_messages(body: bytes) -> MessagesHead:
    try:
        head = _decode_messages(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(_explain(exc)) from exc
    except RecursionError:  # msgspec decodes nested arrays and objects recursively, skipped fields included
        raise InvalidRequest(_TOO_DEEP) from None
    check_duplicates(body)
    return head


def parse_count_tokens(body: bytes) -> CountTokensHead:
    try:
        head = _decode_count(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(_explain(exc)) from exc
    except RecursionError:
        raise InvalidRequest(_TOO_DEEP) from None
    check_duplicates(body)
    return head


class ProxyRequest:
    """One client request as adapters see it."""

    __slots__ = (
        "_fields",
        "anthropic_beta",
        "anthropic_version",
        "beta",
        "body",
        "client_auth",
        "dropped",
        "extra_headers",
        "model",
        "request_id",
        "span",
        "stream",
        "traceparent",
    )

    def __init__(
        self,
        *,
        body: bytes,
        model: str,
        stream: bool,
        request_id: str,
        anthropic_version: str | None = None,
        anthropic_beta: str | None = None,
        client_auth: Mapping[str, str] | None = None,
        beta: bool = False,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.body = body
        self.model = model
        self.stream = stream
        self.request_id = request_id
        self.anthropic_version = anthropic_version
        self.anthropic_beta = anthropic_beta
        self.client_auth = dict(client_auth or {})  # the client's own key headers, forwarded only on request
        self.beta = beta
        # other client headers the `server.forward_headers` policy lets through (lower-case names); adapters
        # that speak the first-party API send them, others may ignore them
        self.extra_headers: dict[str, str] = dict(extra_headers) if extra_headers else {}
        self._fields: dict[str, msgspec.Raw] | None = None
        # what the adapter of the last attempt left out for its provider (``adapters.profiles``): the access
        # line's ``dropped`` and gateway_dropped_features_total
        self.dropped: tuple[str, ...] = ()
        # the W3C traceparent of the attempt being made (its CLIENT span), sent upstream; None: not traced
        self.traceparent: str | None = None
        self.span: Any = None  # that attempt's span (gateway.observability.tracing.AttemptSpan): where it was sent

    def rewrite(self, changes: Mapping[str, Any]) -> None:
        """Change top-level fields of the body itself (the gateway's own policy, e.g. a clamped max_tokens),
        before any adapter reads it."""
        self.body = self.body_with(set=changes)
        self._fields = None

    def betas(self) -> list[str]:
        """The ``anthropic-beta`` header as a list of names (Bedrock takes them in the body)."""
        header = self.anthropic_beta
        return [b.strip() for b in header.split(",") if b.strip()] if header else []

    def fields(self) -> dict[str, msgspec.Raw]:
        """The body's top level, nested values left as raw JSON (decoded once, on first use)."""
        if self._fields is None:
            self._fields = _decode_fields(self.body)
        return self._fields

    def json(self) -> dict[str, Any]:
        """The whole body as Python objects (for providers that compute an answer, not forward one)."""
        result: dict[str, Any] = msgspec.json.decode(self.body)
        return result

    def body_with(self, *, set: Mapping[str, Any] | None = None, drop: Iterable[str] = ()) -> bytes:
        """The body with top-level fields replaced, added or removed; untouched when nothing changes."""
        fields = self.fields()
        changes = {k: v for k, v in (set or {}).items() if k not in fields or fields[k] != _raw(v)}
        removed = [k for k in drop if k in fields]
        if not changes and not removed:
            return self.body
        out: dict[str, Any] = {k: v for k, v in fields.items() if k not in removed}
        out.update(changes)
        return _encode(out)


def _raw(value: Any) -> msgspec.Raw:
    return msgspec.Raw(_encode(value))


# -- the request as it arrived: its size, model name and max_tokens checked, the headers that go upstream

NEVER_FORWARDED = frozenset(
    {
        # credentials: the client's key is the gateway's (forwarded only by `forward_client_key`)
        "authorization",
        "x-api-key",
        "api-key",
        "proxy-authorization",
        "cookie",
        # framing and hop-by-hop: the upstream connection has its own
        "host",
        "content-length",
        "connection",
        "transfer-encoding",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
"""Client headers no ``server.forward_headers`` list can send upstream (listed ones are ignored)."""

_OWN_FIELDS = frozenset({"anthropic-version", "anthropic-beta"})  # carried in their own ProxyRequest fields


MAX_MODEL_NAME = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_model_name(model: str) -> None:
    """``InvalidRequest`` (400) for a model name over 256 characters or holding control characters, before it is
    routed. (What may go into an upstream URL is the URL-building adapters' check: ``adapters.base.url_model``.)"""
    if len(model) > MAX_MODEL_NAME:
        raise InvalidRequest(f"model: longer than {MAX_MODEL_NAME} characters")
    if _CONTROL.search(model) is not None:
        raise InvalidRequest("model: holds control characters")


BETA_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # a beta's name: a token (every Anthropic beta is one)
MAX_BETAS = 64


_CLIENT_ID = re.compile(r"[\x20-\x7e]{1,128}")


def client_id(value: str) -> str | None:
    """An ``x-claude-code-session-id`` / ``x-claude-code-agent-id`` value as the ledger and the access line keep
    it: 1-128 printable ASCII characters (Claude Code sends a UUID), or None (the header is dropped, not refused:
    a client never breaks on it) — "" when there is none."""
    if not value or _CLIENT_ID.fullmatch(value) is not None:
        return value
    return None


def check_betas(value: str | None) -> None:
    """``InvalidRequest`` (400) unless ``value`` (an ``anthropic-beta`` header, or a Bedrock body's list joined)
    is comma-separated beta names, each ``[A-Za-z0-9._:-]{1,128}`` (spaces around the commas allowed). Nothing
    else may reach an upstream header: a JSON string can hold CR, LF or a character latin-1 cannot encode."""
    if not value:
        return
    names = [name.strip(" \t") for name in value.split(",")]
    if len(names) > MAX_BETAS:
        raise InvalidRequest(f"anthropic-beta: more than {MAX_BETAS} beta names")
    for name in names:
        if name and BETA_NAME.fullmatch(name) is None:
            shown = name if len(name) <= 40 else name[:40] + "…"
            raise InvalidRequest(f"anthropic-beta: {shown!r} is not a beta name (letters, digits, '.', '_', ':', '-')")


def check_max_tokens(requested: int, ceiling: int | None, model: str) -> None:
    """``InvalidRequest`` (400) when ``requested`` exceeds the alias's ``max_tokens`` ceiling."""
    if ceiling is not None and requested > ceiling:
        raise InvalidRequest(f"max_tokens: {requested} > {ceiling}, the maximum this gateway allows for {model!r}")


async def read_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """The whole request body; ``RequestTooLarge`` as soon as it is known to exceed ``limit``."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def forwarded_headers(headers: Mapping[str, str], allow: Sequence[str]) -> dict[str, str]:
    """The client headers named in ``allow`` (``server.forward_headers``), lower-cased, that the client sent,
    minus ``NEVER_FORWARDED`` and the two carried in their own fields (``anthropic-version``, ``anthropic-beta``).
    ``headers`` must answer lower-case names (ASGI headers are lower-case; Litestar's are case-insensitive)."""
    out: dict[str, str] = {}
    for name in allow:
        low = name.lower()
        if low in NEVER_FORWARDED or low in _OWN_FIELDS:
            continue
        value = headers.get(low)
        if value is not None:
            out[low] = value
    return out


def proxy_request(
    headers: Mapping[str, str],
    query: str,
    *,
    body: bytes,
    model: str,
    stream: bool,
    client_auth: dict[str, str],
    request_id: str,
    forward: Sequence[str] | None = None,
) -> ProxyRequest:
    """``forward`` is ``server.forward_headers``: ``None`` sends ``anthropic-beta`` only; a list sends exactly the
    listed headers (``anthropic-beta`` only if listed). ``anthropic-version`` is always carried."""
    if forward is None:
        beta, extra = headers.get("anthropic-beta"), None
    else:
        listed = any(name.lower() == "anthropic-beta" for name in forward)
        beta, extra = headers.get("anthropic-beta") if listed else None, forwarded_headers(headers, forward)
    return ProxyRequest(
        body=body,
        model=model,
        stream=stream,
        request_id=request_id,
        anthropic_version=headers.get("anthropic-version"),
        anthropic_beta=beta,
        client_auth=client_auth,
        beta="beta=true" in query.split("&"),
        extra_headers=extra,
    )

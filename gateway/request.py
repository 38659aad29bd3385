"""The canonical request: the client's body bytes, a checked view of its head, and the client headers
that matter to providers.

The body is validated once, shallowly (the fields the gateway routes and fails on), and kept as the
bytes that arrived; a rewrite (a different upstream model id, a provider's own ``anthropic_version``)
re-encodes only the top level, with every nested value carried as raw JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import msgspec

from gateway.errors import InvalidRequest

__all__ = ["CountTokensHead", "MessagesHead", "ProxyRequest", "parse_count_tokens", "parse_messages"]


class _MessageParam(msgspec.Struct):
    role: str
    content: str | list[msgspec.Raw]


class MessagesHead(msgspec.Struct):
    model: Annotated[str, msgspec.Meta(min_length=1)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    messages: list[_MessageParam]
    stream: bool | None = None


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


def parse_messages(body: bytes) -> MessagesHead:
    try:
        return _decode_messages(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(_explain(exc)) from exc
    except RecursionError:  # msgspec decodes nested arrays and objects recursively, skipped fields included
        raise InvalidRequest(_TOO_DEEP) from None


def parse_count_tokens(body: bytes) -> CountTokensHead:
    try:
        return _decode_count(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(_explain(exc)) from exc
    except RecursionError:
        raise InvalidRequest(_TOO_DEEP) from None


class ProxyRequest:
    """One client request as adapters see it."""

    __slots__ = (
        "_fields",
        "anthropic_beta",
        "anthropic_version",
        "beta",
        "body",
        "client_auth",
        "extra_headers",
        "model",
        "request_id",
        "stream",
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

"""Messages API <-> Bedrock Converse / ConverseStream, sans-IO (protocols.md §3.6, §6).

``to_converse`` turns a Messages request body into a Converse request body (no ``modelId``; blobs as
base64 strings, as restJson1 sends them); ``from_converse_response`` turns a Converse response into a
``Message``; ``ConverseTranscoder`` turns ConverseStream events into canonical SSE frames.

A request feature Converse cannot express raises ``ConverseUnsupported`` naming the field, rather than
being dropped, when dropping it could change the answer. Dropped on purpose (no effect on the answer):
``model``/``stream`` (the URL says them), ``service_tier``, ``anthropic_version``, a ``metadata.user_id``
that Converse's ``requestMetadata`` pattern refuses (one it accepts is sent as ``requestMetadata.user_id``),
``caller: {type: direct}`` on ``tool_use``, and ``tool_choice: auto`` without tools. Cache breakpoints
inside ``tool_result``/``document``/``search_result`` content move to just after that block (Converse
has no cache point inside them). Output blocks with no Messages equivalent (image, toolResult) are
skipped, and unknown stream events and delta kinds are ignored: tolerant of their frames.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import msgspec

from gateway.sse import encode_frame

__all__ = ["ConverseTranscoder", "ConverseUnsupported", "from_converse_response", "to_converse"]

_encode = msgspec.json.Encoder().encode


class ConverseUnsupported(Exception):
    """A Messages feature Converse cannot express; ``str(exc)`` is a client-facing message naming the field."""


def _no(field: str, what: str = "this field") -> ConverseUnsupported:
    return ConverseUnsupported(f"{field}: {what} cannot be expressed through Bedrock Converse")


# --- request ------------------------------------------------------------------------------------------

_TOP_LEVEL = frozenset(
    {"model", "stream", "service_tier", "anthropic_version", "max_tokens", "messages", "system", "temperature"}
    | {"top_p", "top_k", "stop_sequences", "tools", "tool_choice", "thinking", "metadata", "cache_control"}
    | {"output_config"}
)
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_NAME_BAD = re.compile(r"[^A-Za-z0-9\s()\[\]-]+")  # DocumentBlock.name: alnum, whitespace, - ( ) [ ]
_SPACES = re.compile(r"\s+")
_METADATA_VALUE = re.compile(r"[a-zA-Z0-9\s:_@$#=/+,.-]{0,256}")  # RequestMetadataValueString
# Which stop sequence fired: Claude reports it under either path (JSON pointers Converse ignores if absent).
_STOP_SEQUENCE_PATHS = ["/stop_sequence", "/delta/stop_sequence"]
_TO_LOCATION = {  # Messages citation type -> (Converse location member, index key, start key, end key)
    "char_location": ("documentChar", "document_index", "start_char_index", "end_char_index"),
    "page_location": ("documentPage", "document_index", "start_page_number", "end_page_number"),
    "content_block_location": ("documentChunk", "document_index", "start_block_index", "end_block_index"),
    "search_result_location": ("searchResultLocation", "search_result_index", "start_block_index", "end_block_index"),
}
_FROM_LOCATION = {v[0]: (k, v[1], v[2], v[3]) for k, v in _TO_LOCATION.items()}
_INDEX_KEY = {"searchResultLocation": "searchResultIndex"}  # the others: documentIndex


def _only(block: dict[str, Any], allowed: frozenset[str], path: str) -> None:
    for key, value in block.items():
        if value is not None and key not in allowed:
            raise _no(f"{path}.{key}")


def _cache_point(cache: Any, field: str) -> dict[str, Any]:
    """``cache_control`` -> the cache point that follows the block (``field``: where it was, for errors)."""
    if not isinstance(cache, dict) or cache.get("type") != "ephemeral":
        raise _no(field, "a cache_control other than {type: ephemeral}")
    point: dict[str, Any] = {"type": "default"}
    ttl = cache.get("ttl")
    if ttl is not None:
        if ttl not in ("5m", "1h"):
            raise _no(f"{field}.ttl", f"ttl {ttl!r}")
        point["ttl"] = ttl
    return {"cachePoint": point}


class _Request:
    """Per-request state of the translation: the document names handed out so far (they must be unique)."""

    __slots__ = ("names",)

    def __init__(self) -> None:
        self.names: set[str] = set()

    def content(self, content: Any, path: str) -> list[dict[str, Any]]:
        """Converse blocks for a message's ``content`` (a string or a block list)."""
        if isinstance(content, str):
            return [{"text": content}]
        if not isinstance(content, list):
            raise _no(path, f"content of type {type(content).__name__}")
        out: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            out.extend(self.block(block, f"{path}[{j}]"))
        return out

    def inner(self, content: Any, path: str, allowed: frozenset[str]) -> tuple[list[dict[str, Any]], bool]:
        """Blocks inside a container that has no cache points: the blocks, and whether one was asked for."""
        if isinstance(content, str):
            return ([{"text": content}] if content else []), False
        if not isinstance(content, list):
            raise _no(path, f"content of type {type(content).__name__}")
        out: list[dict[str, Any]] = []
        cached = False
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in allowed:
                raise _no(f"{path}[{j}].type", f"block type {kind!r} here")
            converted = self.block(block, f"{path}[{j}]")
            cached = cached or len(converted) > 1
            out.append(converted[0])
        return out, cached

    def block(self, block: Any, path: str) -> list[dict[str, Any]]:
        """One Messages block -> its Converse block, followed by a cache point when it has cache_control."""
        if not isinstance(block, dict):
            raise _no(path, "a block that is not an object")
        kind = block.get("type")
        cached = False
        if kind == "text":
            _only(block, _TEXT_KEYS, path)
            out = _text(block, path)
        elif kind == "image":
            _only(block, _IMAGE_KEYS, path)
            out = {"image": _image(block.get("source"), f"{path}.source")}
        elif kind == "document":
            out, cached = self.document(block, path)
        elif kind == "search_result":
            _only(block, _SEARCH_KEYS, path)
            content, cached = self.inner(block.get("content"), f"{path}.content", _TEXT_ONLY)
            result = {"source": block.get("source"), "title": block.get("title"), "content": content}
            if isinstance(block.get("citations"), dict):
                result["citations"] = {"enabled": bool(block["citations"].get("enabled"))}
            out = {"searchResult": result}
        elif kind == "tool_use":
            _only(block, _TOOL_USE_KEYS, path)
            caller = block.get("caller")
            if caller is not None and caller != {"type": "direct"}:
                raise _no(f"{path}.caller", f"caller {caller!r}")
            out = {"toolUse": {"toolUseId": block.get("id"), "name": block.get("name"), "input": block.get("input")}}
        elif kind == "tool_result":
            _only(block, _TOOL_RESULT_KEYS, path)
            content, cached = self.inner(block.get("content") or [], f"{path}.content", _RESULT_CONTENT)
            result = {"toolUseId": block.get("tool_use_id"), "content": content}
            if block.get("is_error"):
                result["status"] = "error"
            out = {"toolResult": result}
        elif kind == "thinking":
            _only(block, _THINKING_KEYS, path)
            reasoning = {"text": block.get("thinking", "")}
            if block.get("signature"):
                reasoning["signature"] = block["signature"]
            out = {"reasoningContent": {"reasoningText": reasoning}}
        elif kind == "redacted_thinking":
            _only(block, _REDACTED_KEYS, path)
            out = {"reasoningContent": {"redactedContent": block.get("data")}}
        else:
            raise _no(f"{path}.type", f"block type {kind!r}")
        cache = block.get("cache_control")
        if cache is not None:
            return [out, _cache_point(cache, f"{path}.cache_control")]
        return [out, {"cachePoint": {"type": "default"}}] if cached else [out]

    def document(self, block: dict[str, Any], path: str) -> tuple[dict[str, Any], bool]:
        _only(block, _DOCUMENT_KEYS, path)
        source = block.get("source")
        source = source if isinstance(source, dict) else {}
        kind = source.get("type")
        doc: dict[str, Any] = {}
        cached = False
        if kind == "base64" and source.get("media_type") == "application/pdf":
            doc["format"], doc["source"] = "pdf", {"bytes": source.get("data")}
        elif kind == "text" and source.get("media_type", "text/plain") == "text/plain":
            doc["format"], doc["source"] = "txt", {"text": source.get("data")}
        elif kind == "content":
            content, cached = self.inner(source.get("content"), f"{path}.source.content", _TEXT_ONLY)
            doc["source"] = {"content": content}
        else:
            media = f" {source.get('media_type')!r}" if kind == "base64" else ""
            raise _no(f"{path}.source", f"document source type {kind!r}{media}")
        doc["name"] = self.name(block.get("title"))
        if block.get("context"):
            doc["context"] = block["context"]
        citations = block.get("citations")
        if isinstance(citations, dict) and citations.get("enabled"):
            doc["citations"] = {"enabled": True}
        return {"document": doc}, cached

    def name(self, title: Any) -> str:
        """A unique ``DocumentBlock.name`` from the title: only the characters Converse allows, single spaces."""
        base = _SPACES.sub(" ", _NAME_BAD.sub(" ", title)).strip()[:190] if isinstance(title, str) else ""
        base = base or f"document-{len(self.names) + 1}"
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base} ({n})"
        self.names.add(name)
        return name


_MESSAGE_KEYS = frozenset({"role", "content"})
_TEXT_KEYS = frozenset({"type", "text", "cache_control", "citations"})
_IMAGE_KEYS = frozenset({"type", "source", "cache_control"})
_DOCUMENT_KEYS = frozenset({"type", "source", "title", "context", "citations", "cache_control"})
_SEARCH_KEYS = frozenset({"type", "source", "title", "content", "citations", "cache_control"})
_TOOL_USE_KEYS = frozenset({"type", "id", "name", "input", "cache_control", "caller"})
_TOOL_RESULT_KEYS = frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"})
_THINKING_KEYS = frozenset({"type", "thinking", "signature"})
_REDACTED_KEYS = frozenset({"type", "data"})
_TOOL_KEYS = frozenset({"type", "name", "description", "input_schema", "cache_control", "strict"})
_TEXT_ONLY = frozenset({"text"})
_RESULT_CONTENT = frozenset({"text", "image", "document", "search_result"})


def _text(block: dict[str, Any], path: str) -> dict[str, Any]:
    citations = block.get("citations")
    if not citations:
        return {"text": block.get("text")}
    converted = [_to_converse_citation(c, f"{path}.citations[{k}]") for k, c in enumerate(citations)]
    return {"citationsContent": {"content": [{"text": block.get("text")}], "citations": converted}}


def _to_converse_citation(citation: Any, path: str) -> dict[str, Any]:
    kind = citation.get("type") if isinstance(citation, dict) else None
    out: dict[str, Any] = {}
    if kind == "web_search_result_location":
        out["location"] = {"web": {"url": citation.get("url")}}
    elif kind in _TO_LOCATION:
        member, index, start, end = _TO_LOCATION[kind]
        key = _INDEX_KEY.get(member, "documentIndex")
        out["location"] = {member: {key: citation.get(index), "start": citation.get(start), "end": citation.get(end)}}
    else:
        raise _no(f"{path}.type", f"citation type {kind!r}")
    title = citation.get("title", citation.get("document_title"))
    if title is not None:
        out["title"] = title
    if citation.get("source") is not None:
        out["source"] = citation["source"]
    out["sourceContent"] = [{"text": citation.get("cited_text", "")}]
    return out


def _image(source: Any, path: str) -> dict[str, Any]:
    kind = source.get("type") if isinstance(source, dict) else None
    if kind != "base64":
        raise _no(path, f"image source type {kind!r}")
    media = source.get("media_type")
    if media not in _IMAGE_TYPES:
        raise _no(f"{path}.media_type", f"image media type {media!r}")
    return {"format": media[6:], "source": {"bytes": source.get("data")}}


def _system(system: Any) -> list[dict[str, Any]]:
    if isinstance(system, str):
        return [{"text": system}] if system else []
    if not isinstance(system, list):
        raise _no("system", f"a system prompt of type {type(system).__name__}")
    out: list[dict[str, Any]] = []
    for i, block in enumerate(system):
        path = f"system[{i}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _no(f"{path}.type", "a system block other than text")
        _only(block, _TEXT_KEYS, path)
        if block.get("citations"):
            raise _no(f"{path}.citations")
        out.append({"text": block.get("text")})
        if block.get("cache_control") is not None:
            out.append(_cache_point(block["cache_control"], f"{path}.cache_control"))
    return out


def _tools(tools: Any, choice: Any) -> dict[str, Any] | None:
    specs: list[dict[str, Any]] = []
    for i, tool in enumerate(tools or []):
        path = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _no(path, "a tool that is not an object")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _no(f"{path}.type", f"tool type {kind!r} (server and Anthropic-defined tools)")
        _only(tool, _TOOL_KEYS, path)
        spec: dict[str, Any] = {"name": tool.get("name"), "inputSchema": {"json": tool.get("input_schema")}}
        if tool.get("description"):
            spec["description"] = tool["description"]
        if tool.get("strict") is not None:
            spec["strict"] = tool["strict"]
        specs.append({"toolSpec": spec})
        if tool.get("cache_control") is not None:
            specs.append(_cache_point(tool["cache_control"], f"{path}.cache_control"))
    if choice is None:
        return {"tools": specs} if specs else None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "none":
        raise _no("tool_choice", "type 'none'")
    if kind not in ("auto", "any", "tool"):
        raise _no("tool_choice.type", f"type {kind!r}")
    _only(choice, frozenset({"type", "name", "disable_parallel_tool_use"}), "tool_choice")
    if choice.get("disable_parallel_tool_use"):
        raise _no("tool_choice.disable_parallel_tool_use", "disable_parallel_tool_use: true")
    if not specs:
        if kind == "auto":
            return None
        raise _no("tool_choice", f"type {kind!r} without tools")
    return {"tools": specs, "toolChoice": {"tool": {"name": choice.get("name")}} if kind == "tool" else {kind: {}}}


def _output_config(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise _no("output_config")
    _only(config, frozenset({"effort", "format"}), "output_config")
    out: dict[str, Any] = {}
    if config.get("effort") is not None:
        out["effort"] = config["effort"]
    fmt = config.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            raise _no("output_config.format.type", f"format {fmt!r}")
        _only(fmt, frozenset({"type", "schema"}), "output_config.format")
        schema = json.dumps(fmt.get("schema"), separators=(",", ":"), ensure_ascii=False)
        out["textFormat"] = {"type": "json_schema", "structure": {"jsonSchema": {"schema": schema}}}
    return out


def to_converse(body: dict[str, Any], *, betas: list[str] | None = None) -> dict[str, Any]:
    """A Messages request body -> the Converse request body (without ``modelId``)."""
    for key in body:
        if key not in _TOP_LEVEL and body[key] is not None:
            raise _no(key)
    request = _Request()
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            raise _no(f"messages[{i}]", "a message that is not an object")
        _only(message, _MESSAGE_KEYS, f"messages[{i}]")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _no(f"messages[{i}].role", f"role {role!r}")
        content = request.content(message.get("content"), f"messages[{i}].content")
        if messages and messages[-1]["role"] == role:  # consecutive turns of one role are one turn
            messages[-1]["content"].extend(content)
        else:
            messages.append({"role": role, "content": content})
    if body.get("cache_control") is not None and messages:  # automatic caching: after the last block
        point = _cache_point(body["cache_control"], "cache_control")
        last = messages[-1]["content"]
        if not last or "cachePoint" not in last[-1]:
            last.append(point)
    out: dict[str, Any] = {"messages": messages}
    if body.get("system"):
        out["system"] = _system(body["system"])
    inference: dict[str, Any] = {}
    for key, name in (("max_tokens", "maxTokens"), ("temperature", "temperature"), ("top_p", "topP")):
        if body.get(key) is not None:
            inference[name] = body[key]
    if body.get("stop_sequences"):
        inference["stopSequences"] = list(body["stop_sequences"])
        out["additionalModelResponseFieldPaths"] = list(_STOP_SEQUENCE_PATHS)
    if inference:
        out["inferenceConfig"] = inference
    tool_config = _tools(body.get("tools"), body.get("tool_choice"))
    if tool_config is not None:
        out["toolConfig"] = tool_config
    extra: dict[str, Any] = {}
    if body.get("top_k") is not None:
        extra["top_k"] = body["top_k"]
    if body.get("thinking") is not None:
        extra["thinking"] = body["thinking"]
    if betas:
        extra["anthropic_beta"] = list(betas)
    if extra:
        out["additionalModelRequestFields"] = extra
    if body.get("output_config") is not None:
        out["outputConfig"] = _output_config(body["output_config"])
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _no("metadata", "a metadata that is not an object")
        _only(metadata, frozenset({"user_id"}), "metadata")
        user = metadata.get("user_id")
        if isinstance(user, str) and _METADATA_VALUE.fullmatch(user):
            out["requestMetadata"] = {"user_id": user}
    return out


# --- response ---------------------------------------------------------------------------------------

_STOP_REASONS = {
    **{r: r for r in ("end_turn", "tool_use", "max_tokens", "stop_sequence", "model_context_window_exceeded")},
    **{r: r for r in ("pause_turn", "refusal")},  # Anthropic values, should Converse ever pass them on
    "guardrail_intervened": "refusal",
    "content_filtered": "refusal",
    "malformed_model_output": "end_turn",
    "malformed_tool_use": "end_turn",
}


def _stop(reason: Any, fields: Any) -> tuple[str, str | None]:
    """The Messages stop_reason for a Converse stopReason (unknown values: end_turn), and the stop sequence."""
    stop_reason = _STOP_REASONS.get(reason, "end_turn") if isinstance(reason, str) else "end_turn"
    sequence = None
    if stop_reason == "stop_sequence" and isinstance(fields, dict):
        sequence = fields.get("stop_sequence")
        if sequence is None and isinstance(fields.get("delta"), dict):
            sequence = fields["delta"].get("stop_sequence")
    return stop_reason, sequence if isinstance(sequence, str) else None


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    """Converse TokenUsage -> Messages usage. Messages' ``input_tokens`` excludes cache traffic; should
    Converse's ``inputTokens`` include it (``totalTokens`` = input + output although cache tokens were
    counted), the cache tokens are taken out."""
    output = usage.get("outputTokens") or 0
    inputs = usage.get("inputTokens") or 0
    read = usage.get("cacheReadInputTokens") or 0
    write = usage.get("cacheWriteInputTokens") or 0
    if (read or write) and usage.get("totalTokens") == inputs + output and inputs >= read + write:
        inputs -= read + write
    return {
        "output_tokens": output,
        "input_tokens": inputs,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write,
    }


def _citation(citation: dict[str, Any]) -> dict[str, Any] | None:
    """A Converse citation -> a Messages citation object; ``None`` for a location type this does not know."""
    cited = "".join(part.get("text") or "" for part in citation.get("sourceContent") or ())
    title = citation.get("title")
    for member, loc in (citation.get("location") or {}).items():  # a union: one member is set
        if member == "web":
            url = loc.get("url") or ""
            return {
                "type": "web_search_result_location",
                "cited_text": cited,
                "url": url,
                "title": title,
                "encrypted_index": "",
            }
        spec = _FROM_LOCATION.get(member)
        if spec is None:
            continue
        kind, index, start, end = spec
        out: dict[str, Any] = {
            "type": kind,
            "cited_text": cited,
            index: loc.get(_INDEX_KEY.get(member, "documentIndex"), 0),
        }
        if member == "searchResultLocation":
            out["source"] = citation.get("source") or ""
            out["title"] = title
        else:
            out["document_title"] = title
        out[start] = loc.get("start", 0)
        out[end] = loc.get("end", 0)
        return out
    return None


def _b64(blob: Any) -> str:
    return base64.b64encode(blob).decode("ascii") if isinstance(blob, bytes | bytearray) else str(blob)


def _output_block(block: dict[str, Any]) -> dict[str, Any] | None:
    if "text" in block:
        return {"type": "text", "text": block["text"]}
    if "citationsContent" in block:
        cc = block["citationsContent"]
        text = "".join(part.get("text") or "" for part in cc.get("content") or ())
        citations = [c for c in map(_citation, cc.get("citations") or ()) if c is not None]
        return {"type": "text", "text": text, "citations": citations or None}
    if "toolUse" in block:
        tool = block["toolUse"]
        kind = "server_tool_use" if tool.get("type") == "server_tool_use" else "tool_use"
        return {"type": kind, "id": tool.get("toolUseId"), "name": tool.get("name"), "input": tool.get("input") or {}}
    reasoning = block.get("reasoningContent")
    if reasoning is not None:
        if "redactedContent" in reasoning:
            return {"type": "redacted_thinking", "data": _b64(reasoning["redactedContent"])}
        part = reasoning.get("reasoningText") or {}
        return {"type": "thinking", "thinking": part.get("text", ""), "signature": part.get("signature", "")}
    return None  # image, toolResult, …: no Messages response equivalent


def from_converse_response(resp: dict[str, Any], *, model: str, message_id: str) -> dict[str, Any]:
    """A non-streaming Converse response -> an Anthropic ``Message`` dict."""
    message = (resp.get("output") or {}).get("message") or {}
    content = [b for b in map(_output_block, message.get("content") or ()) if b is not None]
    stop_reason, sequence = _stop(resp.get("stopReason"), resp.get("additionalModelResponseFields"))
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": sequence,
        "usage": _usage(resp.get("usage") or {}),
    }


# --- stream -----------------------------------------------------------------------------------------

_ERROR_TYPES = {
    "throttlingException": "rate_limit_error",
    "serviceUnavailableException": "overloaded_error",
    "validationException": "invalid_request_error",
    "internalServerException": "api_error",
    "modelStreamErrorException": "api_error",
    "modelTimeoutException": "timeout_error",
}
_DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_DELTA_KEYS = {"text": b"text_delta", "thinking": b"thinking_delta", "tool_use": b"input_json_delta"}
_DELTA_FIELD = {"text": b"text", "thinking": b"thinking", "tool_use": b"partial_json"}
_END = b"}}\n\n"
_MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_TEXT_START = {"type": "text", "text": ""}
_THINKING_START = {"type": "thinking", "thinking": "", "signature": ""}


def _frame(event: str, data: dict[str, Any]) -> bytes:
    return encode_frame(event, _encode(data))


def _error_frame(error_type: str, message: str) -> bytes:
    return _frame("error", {"type": "error", "error": {"type": error_type, "message": message}})


class ConverseTranscoder:
    """Sans-IO: ConverseStream events in, canonical Anthropic SSE frames (bytes) out.

    Blocks are numbered densely in start order; only one is open at a time (a delta for another
    Converse index closes it). ``messageStop`` and ``metadata`` are held until both arrived, then become
    ``message_delta`` + ``message_stop``.
    """

    __slots__ = ("_done", "_id", "_kind", "_model", "_next", "_prefix", "_sig", "_src", "_started", "_stop", "_usage")

    def __init__(self, *, model: str, message_id: str) -> None:
        self._model = model
        self._id = message_id
        self._started = False
        self._done = False
        self._next = 0  # the next dense block index
        self._kind = ""  # kind of the open block: text | thinking | tool_use | skip ("" = none open)
        self._src = -1  # the Converse contentBlockIndex of the open (or skipped) block
        self._prefix = b""  # the open block's delta frame up to its JSON string value
        self._sig = ""  # the open thinking block's signature, sent just before its stop
        self._stop: tuple[str, str | None] | None = None
        self._usage: dict[str, int] | None = None

    def feed(self, event_type: str, payload: dict[str, Any]) -> bytes:
        """One ConverseStream event -> zero or more complete SSE frames."""
        if event_type == "contentBlockDelta" and payload.get("contentBlockIndex") == self._src:
            kind, delta = self._kind, payload.get("delta") or {}  # hot path: one more delta of the open block
            if kind == "text":
                value = delta.get("text")
            elif kind == "thinking":
                value = (delta.get("reasoningContent") or {}).get("text")
            elif kind == "tool_use":
                value = (delta.get("toolUse") or {}).get("input")
            else:
                value = None
            if value is not None:
                return self._prefix + _encode(value) + _END
        if self._done:
            return b""
        handler = _HANDLERS.get(event_type)
        if handler is None:
            return b""
        out = b"" if self._started or event_type == "messageStart" else self._message_start({})
        return out + handler(self, payload)

    def exception(self, name: str, payload: dict[str, Any]) -> bytes:
        """A modeled exception frame -> one ``error`` frame; the transcoder is finished after it."""
        if self._done:
            return b""
        self._end()
        message = payload.get("message") or payload.get("Message") or name
        return _error_frame(_ERROR_TYPES.get(name, "api_error"), str(message))

    def close(self) -> bytes:
        """End of input: ``b""`` after ``message_stop`` (or an error); otherwise an ``error`` frame."""
        if self._done:
            return b""
        where = (
            "inside a content block"
            if self._kind
            else "before its metadata event"
            if self._stop is not None
            else "before messageStop"
        )
        self._end()
        return _error_frame("api_error", f"The Converse stream ended early ({where}).")

    # -- handlers --

    def _end(self) -> None:
        self._done = True
        self._kind = ""
        self._src = -1

    def _message_start(self, payload: dict[str, Any]) -> bytes:
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return _frame("message_start", {"type": "message_start", "message": message})

    def _open(self, kind: str, src: int, block: dict[str, Any]) -> bytes:
        out = self._close()
        index = self._next
        self._next += 1
        self._kind, self._src = kind, src
        if kind in _DELTA_KEYS:
            self._prefix = b'%s%d,"delta":{"type":"%s","%s":' % (
                _DELTA_HEAD,
                index,
                _DELTA_KEYS[kind],
                _DELTA_FIELD[kind],
            )
        start = {"type": "content_block_start", "index": index, "content_block": block}
        return out + _frame("content_block_start", start)

    def _close(self) -> bytes:
        kind = self._kind
        self._kind, self._src = "", -1
        if kind in ("", "skip"):
            return b""
        index = self._next - 1
        out = b""
        if self._sig:
            out = _frame(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": self._sig},
                },
            )
            self._sig = ""
        return out + _frame("content_block_stop", {"type": "content_block_stop", "index": index})

    def _ensure(self, kind: str, src: int, block: dict[str, Any]) -> bytes:
        """Open a ``kind`` block for Converse index ``src`` unless that is the open block already."""
        return b"" if self._kind == kind and self._src == src else self._open(kind, src, block)

    def _block_start(self, payload: dict[str, Any]) -> bytes:
        src = payload.get("contentBlockIndex", -1)
        tool = (payload.get("start") or {}).get("toolUse")
        if tool is None:  # toolResult / image starts: a block Messages cannot carry, skipped whole
            out = self._close()
            self._kind, self._src = "skip", src
            return out
        kind = "server_tool_use" if tool.get("type") == "server_tool_use" else "tool_use"
        block = {"type": kind, "id": tool.get("toolUseId"), "name": tool.get("name"), "input": {}}
        return self._open("tool_use", src, block)

    def _block_delta(self, payload: dict[str, Any]) -> bytes:
        src = payload.get("contentBlockIndex", -1)
        if self._kind == "skip" and self._src == src:
            return b""
        delta = payload.get("delta") or {}
        if "text" in delta:
            out = self._ensure("text", src, _TEXT_START)
            return out + self._prefix + _encode(delta["text"]) + _END
        reasoning = delta.get("reasoningContent")
        if reasoning is not None:
            if "redactedContent" in reasoning:  # a block of its own, complete at its start
                block = {"type": "redacted_thinking", "data": _b64(reasoning["redactedContent"])}
                out = self._open("redacted", src, block) + self._close()
                self._src = src  # its contentBlockStop, if any, is ignored
                return out
            out = self._ensure("thinking", src, _THINKING_START)
            if "text" in reasoning:
                out += self._prefix + _encode(reasoning["text"]) + _END
            if "signature" in reasoning:
                self._sig += reasoning["signature"]
            return out
        citation = delta.get("citation")
        if citation is not None:
            converted = _citation(citation)
            if converted is None:
                return b""
            out = self._ensure("text", src, _TEXT_START)
            event = {
                "type": "content_block_delta",
                "index": self._next - 1,
                "delta": {"type": "citations_delta", "citation": converted},
            }
            return out + _frame("content_block_delta", event)
        return b""  # toolUse input without a start, toolResult, image, future kinds

    def _block_stop(self, payload: dict[str, Any]) -> bytes:
        if payload.get("contentBlockIndex", -1) != self._src:
            return b""
        return self._close()

    def _message_stop(self, payload: dict[str, Any]) -> bytes:
        out = self._close()
        self._stop = _stop(payload.get("stopReason"), payload.get("additionalModelResponseFields"))
        return out + self._finish() if self._usage is not None else out

    def _metadata(self, payload: dict[str, Any]) -> bytes:
        self._usage = _usage(payload.get("usage") or {})
        return self._finish() if self._stop is not None else b""

    def _finish(self) -> bytes:
        assert self._stop is not None and self._usage is not None
        usage = self._usage
        event = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop[0], "stop_sequence": self._stop[1]},
            "usage": usage,
        }
        self._end()
        return _frame("message_delta", event) + _MESSAGE_STOP


_HANDLERS = {
    "messageStart": ConverseTranscoder._message_start,
    "contentBlockStart": ConverseTranscoder._block_start,
    "contentBlockDelta": ConverseTranscoder._block_delta,
    "contentBlockStop": ConverseTranscoder._block_stop,
    "messageStop": ConverseTranscoder._message_stop,
    "metadata": ConverseTranscoder._metadata,
}

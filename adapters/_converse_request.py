"""Messages request -> Bedrock Converse request, sans-IO (docs/wire-formats.md §3.6): ``to_converse``.

A request feature Converse cannot express raises ``ConverseUnsupported`` naming the field whenever
dropping it could change the answer: ``tool_choice`` ``none`` and ``disable_parallel_tool_use: true``,
server and Anthropic-defined tools, URL/file sources, unknown block types, unknown fields. Dropped on
purpose, because they cannot change the answer: ``model``/``stream`` (the URL says them),
``service_tier``, ``anthropic_version``, a client's own ``anthropic_beta`` body field (the betas sent are the
header's, as ``server.forward_headers`` lets it through), a ``metadata.user_id`` outside Converse's ``requestMetadata``
pattern (one inside it is sent as ``requestMetadata.user_id``), ``caller: {type: direct}`` and
``tool_choice: auto`` without tools. Cache breakpoints inside ``tool_result``/``document``/
``search_result`` content move to just after that block (Converse has none inside them). Consecutive
turns of one role are merged, as the Messages API does. With ``stop_sequences``, the fired sequence is
asked for through ``additionalModelResponseFieldPaths`` and reported as ``stop_sequence``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

__all__ = ["FROM_LOCATION", "INDEX_KEY", "ConverseUnsupported", "to_converse"]

_encode = msgspec.json.Encoder().encode


class ConverseUnsupported(Exception):
    """A Messages feature Converse cannot express; ``str(exc)`` is a client-facing message naming the field."""


def _no(field: str, what: str = "this field") -> ConverseUnsupported:
    return ConverseUnsupported(f"{field}: {what} cannot be expressed through Bedrock Converse")


# --- request ------------------------------------------------------------------------------------------

_TOP_LEVEL = frozenset(
    {"model", "stream", "service_tier", "anthropic_version", "max_tokens", "messages", "system", "temperature"}
    | {"top_p", "top_k", "stop_sequences", "tools", "tool_choice", "thinking", "metadata", "cache_control"}
    | {"output_config", "anthropic_beta"}  # anthropic_beta: dropped, the betas are the policy-filtered header's
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
FROM_LOCATION = {v[0]: (k, v[1], v[2], v[3]) for k, v in _TO_LOCATION.items()}
INDEX_KEY = {"searchResultLocation": "searchResultIndex"}  # the others: documentIndex


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
            if "citationsContent" in converted[0]:
                raise _no(f"{path}[{j}].citations", "citations on text here")
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
        key = INDEX_KEY.get(member, "documentIndex")
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
    out: dict[str, Any] = {"messages": _messages(body)}
    if body.get("system"):
        out["system"] = _system(body["system"])
    inference = _inference(body, out)
    if inference:
        out["inferenceConfig"] = inference
    tool_config = _tools(body.get("tools"), body.get("tool_choice"))
    if tool_config is not None:
        out["toolConfig"] = tool_config
    extra = _additional_fields(body, betas)
    if extra:
        out["additionalModelRequestFields"] = extra
    if body.get("output_config") is not None:
        out["outputConfig"] = _output_config(body["output_config"])
    metadata = _request_metadata(body.get("metadata"))
    if metadata is not None:
        out["requestMetadata"] = metadata
    return out


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The turns: consecutive messages of one role are one turn; ``cache_control`` at the top level (automatic
    caching) puts a cache point after the last block."""
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
    return messages


def _inference(body: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """``inferenceConfig``; stop sequences also ask for the field that says which one matched (in ``out``)."""
    inference: dict[str, Any] = {}
    for key, name in (("max_tokens", "maxTokens"), ("temperature", "temperature"), ("top_p", "topP")):
        if body.get(key) is not None:
            inference[name] = body[key]
    if body.get("stop_sequences"):
        inference["stopSequences"] = list(body["stop_sequences"])
        out["additionalModelResponseFieldPaths"] = list(_STOP_SEQUENCE_PATHS)
    return inference


def _additional_fields(body: dict[str, Any], betas: list[str] | None) -> dict[str, Any]:
    """What Converse has no field for, passed to the model as it is: ``top_k``, ``thinking``, the betas."""
    extra: dict[str, Any] = {}
    if body.get("top_k") is not None:
        extra["top_k"] = body["top_k"]
    if body.get("thinking") is not None:
        extra["thinking"] = body["thinking"]
    if betas:
        extra["anthropic_beta"] = list(betas)
    return extra


def _request_metadata(metadata: Any) -> dict[str, str] | None:
    """``requestMetadata`` from ``metadata.user_id`` when it is a value Converse accepts; None otherwise."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise _no("metadata", "a metadata that is not an object")
    _only(metadata, frozenset({"user_id"}), "metadata")
    user = metadata.get("user_id")
    if isinstance(user, str) and _METADATA_VALUE.fullmatch(user):
        return {"user_id": user}
    return None

"""Bedrock Converse -> Messages, sans-IO (docs/wire-formats.md §3.6, §6): ``from_converse_response`` turns a Converse
response into a ``Message``; ``ConverseTranscoder`` turns ConverseStream events into canonical SSE frames.
The request side is ``_converse_request.to_converse`` (re-exported here).

Output blocks with no Messages equivalent (image, toolResult) are skipped, and unknown stream events,
fields and delta kinds are ignored: tolerant of their frames.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from gateway.wire.errors import error_frame
from gateway.wire.sse import encode_frame

from ._converse_request import FROM_LOCATION as _FROM_LOCATION
from ._converse_request import INDEX_KEY as _INDEX_KEY
from ._converse_request import ConverseUnsupported, to_converse

__all__ = ["STREAM_EXCEPTIONS", "ConverseTranscoder", "ConverseUnsupported", "from_converse_response", "to_converse"]

_encode = msgspec.json.Encoder().encode


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

# docs/wire-formats.md §6.2: exception members of a Bedrock response stream (InvokeModel's and ConverseStream's alike)
# -> the Anthropic error type of the terminal `error` event.
STREAM_EXCEPTIONS: dict[str, str] = {
    "throttlingException": "rate_limit_error",
    "serviceUnavailableException": "overloaded_error",
    "modelTimeoutException": "timeout_error",
    "validationException": "invalid_request_error",
    "internalServerException": "api_error",
    "modelStreamErrorException": "api_error",
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
        return error_frame(STREAM_EXCEPTIONS.get(name, "api_error"), str(message))

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
        return error_frame("api_error", f"The Converse stream ended early ({where}).")

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
        self._stop = _stop(payload.get("stopReason"), payload.get("additionalModelResponseFields"))
        return self._finish() if self._usage is not None else self._close()

    def _metadata(self, payload: dict[str, Any]) -> bytes:
        self._usage = _usage(payload.get("usage") or {})
        return self._finish() if self._stop is not None else b""

    def _finish(self) -> bytes:
        assert self._stop is not None and self._usage is not None
        out = self._close()  # a block still open (no contentBlockStop, or content after messageStop) ends here
        delta = {"stop_reason": self._stop[0], "stop_sequence": self._stop[1]}
        self._end()
        return (
            out
            + _frame("message_delta", {"type": "message_delta", "delta": delta, "usage": self._usage})
            + _MESSAGE_STOP
        )


_HANDLERS = {
    "messageStart": ConverseTranscoder._message_start,
    "contentBlockStart": ConverseTranscoder._block_start,
    "contentBlockDelta": ConverseTranscoder._block_delta,
    "contentBlockStop": ConverseTranscoder._block_stop,
    "messageStop": ConverseTranscoder._message_stop,
    "metadata": ConverseTranscoder._metadata,
}

"""Prompts and answers in the GenAI conventions' opt-in content attributes (``telemetry.otlp.capture_content``).

``gen_ai.system_instructions``, ``gen_ai.input.messages`` and ``gen_ai.output.messages`` in the shapes of the
convention's JSON schemas (``docs/gen-ai/gen-ai-input-messages.json`` and its siblings): a message is
``{"role", "parts"}``, a part ``{"type": "text", "content"}``, ``{"type": "tool_call", "id", "name",
"arguments"}``, ``{"type": "tool_call_response", "id", "response"}``, ``{"type": "reasoning", "content"}``, or a
generic part named for its Anthropic block type (an image's or a document's data is never copied). Each is written
on the span as a JSON string, as the convention allows where structured values are not supported. Off by default:
nothing here runs unless the operator opts in, and never a key (those are headers, never read here).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["OutputCollector", "input_attributes"]

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def _part(block: Any) -> dict[str, Any]:
    if isinstance(block, str):
        return {"type": "text", "content": block}
    if not isinstance(block, dict):
        return {"type": "unknown"}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": block.get("text", "")}
    if kind in ("tool_use", "server_tool_use"):
        return {"type": "tool_call", "id": block.get("id"), "name": block.get("name"), "arguments": block.get("input")}
    if kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_tool_result")):
        return {"type": "tool_call_response", "id": block.get("tool_use_id"), "response": block.get("content")}
    if kind == "thinking":
        return {"type": "reasoning", "content": block.get("thinking", "")}
    return {"type": str(kind or "unknown")}  # an image, a document, redacted thinking…: named, never copied


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return [_part(block) for block in content]
    return [_part(content)]


def input_attributes(body: bytes) -> dict[str, str]:
    """``gen_ai.system_instructions`` and ``gen_ai.input.messages`` of a Messages request body ({} when it is
    not one)."""
    try:
        request = _decode(body)
    except msgspec.DecodeError:
        return {}
    if not isinstance(request, dict):
        return {}
    out: dict[str, str] = {}
    system = request.get("system")
    if system:
        out["gen_ai.system_instructions"] = _encode(_parts(system)).decode()
    messages = request.get("messages")
    if isinstance(messages, list):
        shaped = [
            {"role": m.get("role", "user"), "parts": _parts(m.get("content", ""))}
            for m in messages
            if isinstance(m, dict)
        ]
        out["gen_ai.input.messages"] = _encode(shaped).decode()
    return out


class OutputCollector:
    """The answer's content, from a JSON message or folded from a stream's events (text, thinking and tool input
    deltas joined per block)."""

    __slots__ = ("blocks", "stop_reason")

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.stop_reason = ""

    def message(self, body: bytes) -> None:
        try:
            answer = _decode(body)
        except msgspec.DecodeError:
            return
        if isinstance(answer, dict):
            for n, block in enumerate(answer.get("content") or []):
                if isinstance(block, dict):
                    self.blocks[n] = dict(block)
            self.stop_reason = str(answer.get("stop_reason") or "")

    def feed(self, datas: list[bytes]) -> None:
        for data in datas:
            try:
                event = _decode(data)
            except msgspec.DecodeError:
                continue
            if isinstance(event, dict):
                self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        kind, index = event.get("type"), event.get("index")
        if kind == "content_block_start" and isinstance(index, int):
            block = event.get("content_block")
            if isinstance(block, dict):
                self.blocks[index] = {**block, "_json": ""}
        elif kind == "content_block_delta" and isinstance(index, int) and index in self.blocks:
            delta, block = event.get("delta") or {}, self.blocks[index]
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif dtype == "input_json_delta":
                block["_json"] += delta.get("partial_json", "")
        elif kind == "message_delta":
            self.stop_reason = str((event.get("delta") or {}).get("stop_reason") or self.stop_reason)

    def attribute(self) -> str:
        """``gen_ai.output.messages``: the one assistant message, with its finish reason."""
        parts = []
        for _, block in sorted(self.blocks.items()):
            raw = block.pop("_json", "")
            if raw:
                try:
                    block["input"] = _decode(raw)
                except msgspec.DecodeError:
                    block["input"] = raw
            parts.append(_part(block))
        return _encode([{"role": "assistant", "parts": parts, "finish_reason": self.stop_reason}]).decode()

"""What the built-in ``kind: mock`` provider says.

Pure functions: a parsed ``POST /v1/messages`` body goes in, the canonical stream event list (or the
final ``Message`` folded from it) comes out.  No I/O, no clock, no randomness - the same body always
gives the same events.  Documents with ``citations.enabled`` are really read (plain text, base64 PDF
via pypdf, custom content, search results) so the citations point at true locations.
"""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["estimate_input_tokens", "mock_events", "mock_message"]

_SNIPPET_CHARS = 80
_MAX_CITATIONS = 6
_MAX_PDF_PAGES = 100
_IMAGE_TOKENS = 1500
_PDF_TOKENS = 1500
_FILLER = "The mock keeps going with deterministic filler so the stream has the requested number of pieces."
_INTRO = "Here is what the sources say. "
_BETWEEN = " "
_CLOSING = " That is everything the mock found in the cited sources."
# Sentence ends: terminal punctuation followed by whitespace, or a blank line (paragraph break).
_BOUNDARY = re.compile(r"(?<=[.!?])\s+|\n[^\S\n]*\n\s*")
_PIECE = re.compile(r"\s*\S+")


@dataclass(frozen=True)
class _Cite:
    """One sentence/block to quote: its display text and the citation object pointing at it."""

    sentence: str
    citation: dict[str, Any]


# --------------------------------------------------------------------------- request walking


def _blocks(content: Any) -> Iterator[dict[str, Any]]:
    """Content blocks in wire order, descending into ``tool_result`` content."""
    if isinstance(content, str):
        yield {"type": "text", "text": content}
        return
    if not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, dict):
            continue
        yield block
        if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
            yield from _blocks(block["content"])


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []


def _last_user_text(body: dict[str, Any]) -> str:
    for msg in reversed(_messages(body)):
        if msg.get("role") == "user":
            texts = [b["text"] for b in _blocks(msg.get("content")) if isinstance(b.get("text"), str)]
            return " ".join(" ".join(texts).split())
    return ""


def _cites_enabled(block: dict[str, Any]) -> bool:
    cfg = block.get("citations")
    return isinstance(cfg, dict) and cfg.get("enabled") is True


def _chars(value: Any) -> int:
    """Characters of text anywhere in a block tree; images and binary documents count as a fixed size."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    if not isinstance(value, dict):
        return 0
    kind, source = value.get("type"), value.get("source")
    if kind == "image":
        return _IMAGE_TOKENS * 4
    if kind == "document" and isinstance(source, dict) and source.get("type") not in ("text", "content"):
        return _PDF_TOKENS * 4
    keys = ("text", "data", "content", "source", "title", "context", "thinking")
    total = sum(_chars(value.get(k)) for k in keys)
    if "input" in value:
        total += len(json.dumps(value["input"], sort_keys=True, default=str))
    return total


def estimate_input_tokens(body: dict[str, Any]) -> int:
    """Rough, deterministic input-token estimate: text characters // 4, images and PDFs a fixed cost."""
    chars = _chars(body.get("system"))
    for msg in _messages(body):
        chars += _chars(msg.get("content"))
    tools = body.get("tools")
    if isinstance(tools, list):
        chars += len(json.dumps(tools, sort_keys=True, default=str))
    return max(1, chars // 4)


# --------------------------------------------------------------------------- citation sources


def _sentences(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` code-point spans of the sentences of ``text``, outer whitespace excluded."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for cut in [*((m.start(), m.end()) for m in _BOUNDARY.finditer(text)), (len(text), len(text))]:
        seg = text[pos : cut[0]]
        lead = len(seg) - len(seg.lstrip())
        end = len(seg.rstrip())
        if end > lead and any(ch.isalnum() for ch in seg):
            spans.append((pos + lead, pos + end))
        pos = cut[1]
    return spans


@functools.lru_cache(maxsize=16)  # load tests resend the same PDF; parse it once
def _pdf_pages(data: str) -> tuple[str, ...]:
    """Extracted text of each page of a base64 PDF; ``()`` when it cannot be read."""
    try:
        from pypdf import PdfReader

        reader = PdfReader(io.BytesIO(base64.b64decode(data)))
        return tuple(page.extract_text() or "" for page in reader.pages[:_MAX_PDF_PAGES])
    except Exception:  # a mock must not fail on a broken attachment; it just does not cite it
        return ()


def _content_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _text_blocks(content: Any) -> list[tuple[int, str]]:
    """``(block index, text)`` of the non-blank text blocks of a custom-content document or search result."""
    out: list[tuple[int, str]] = []
    for i, block in enumerate(_content_blocks(content)):
        text = block.get("text")
        if block.get("type") == "text" and isinstance(text, str) and text.strip():
            out.append((i, text))
    return out


def _document_cites(block: dict[str, Any], index: int) -> list[_Cite]:
    source = block.get("source")
    if not isinstance(source, dict):
        return []
    title = block.get("title") if isinstance(block.get("title"), str) else None
    head: dict[str, Any] = {"document_index": index, "document_title": title}
    kind, data = source.get("type"), source.get("data")
    out: list[_Cite] = []
    if kind == "text" and isinstance(data, str):
        for start, end in _sentences(data):
            cite = {"type": "char_location", "cited_text": data[start:end], **head}
            cite |= {"start_char_index": start, "end_char_index": end, "file_id": None}
            out.append(_Cite(" ".join(data[start:end].split()), cite))
    elif kind == "base64" and source.get("media_type") == "application/pdf" and isinstance(data, str):
        for number, page in enumerate(_pdf_pages(data), start=1):
            for start, end in _sentences(page):
                cite = {"type": "page_location", "cited_text": page[start:end], **head}
                cite |= {"start_page_number": number, "end_page_number": number + 1, "file_id": None}
                out.append(_Cite(" ".join(page[start:end].split()), cite))
    elif kind == "content":
        for i, text in _text_blocks(source.get("content")):
            cite = {"type": "content_block_location", "cited_text": text, **head}
            cite |= {"start_block_index": i, "end_block_index": i + 1, "file_id": None}
            out.append(_Cite(" ".join(text.split()), cite))
    return out


def _search_result_cites(block: dict[str, Any], index: int) -> list[_Cite]:
    title = block.get("title") if isinstance(block.get("title"), str) else None
    head = {"search_result_index": index, "source": str(block.get("source", "")), "title": title}
    out: list[_Cite] = []
    for i, text in _text_blocks(block.get("content")):
        cite = {"type": "search_result_location", "cited_text": text, **head}
        cite |= {"start_block_index": i, "end_block_index": i + 1}
        out.append(_Cite(" ".join(text.split()), cite))
    return out


def _pick(candidates: list[_Cite], per_source: int) -> list[_Cite]:
    """The first and the last candidate (different pages/regions of the source when possible)."""
    if per_source < 2 or len(candidates) < 2:
        return candidates[:1]
    return [candidates[0], candidates[-1]]


def _citations(body: dict[str, Any]) -> list[_Cite]:
    """Up to ``_MAX_CITATIONS`` quotes from citation-enabled documents and search results, in order."""
    sources: list[list[_Cite]] = []
    doc_index = search_index = 0
    for msg in _messages(body):
        for block in _blocks(msg.get("content")):
            kind = block.get("type")
            if kind == "document":
                if _cites_enabled(block):
                    sources.append(_document_cites(block, doc_index))
                doc_index += 1
            elif kind == "search_result":
                if _cites_enabled(block):
                    sources.append(_search_result_cites(block, search_index))
                search_index += 1
    sources = [s for s in sources if s]
    per_source = 2 if 2 * len(sources) <= _MAX_CITATIONS else 1
    return [c for s in sources for c in _pick(s, per_source)][:_MAX_CITATIONS]


# --------------------------------------------------------------------------- text shaping


def _split(text: str, n: int) -> list[str]:
    """Split ``text`` into exactly ``min(n, pieces)`` non-empty chunks on word boundaries."""
    pieces = _PIECE.findall(text) or [text]
    tail = text[len("".join(pieces)) :]
    pieces[-1] += tail
    n = max(1, min(n, len(pieces)))
    size, extra = divmod(len(pieces), n)
    out: list[str] = []
    pos = 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append("".join(pieces[pos : pos + step]))
        pos += step
    return out


def _plain_answer(body: dict[str, Any], deltas: int) -> list[str]:
    snippet = _last_user_text(body)[:_SNIPPET_CHARS].rstrip(" .!?") or "(no text)"
    text = f"This is a mock reply from messages-gateway to: {snippet}."
    filler = _FILLER.split()
    count = len(_PIECE.findall(text))
    i = 0
    while count < deltas:
        text += " " + filler[i % len(filler)]
        count += 1
        i += 1
    return _split(text, deltas)


def _thinking_text(body: dict[str, Any]) -> str | None:
    cfg = body.get("thinking")
    if not isinstance(cfg, dict) or cfg.get("type") not in ("enabled", "adaptive"):
        return None
    if cfg.get("display") == "omitted":
        return ""
    topic = _last_user_text(body)[:40].rstrip(" .!?") or "nothing in particular"
    return f"The user asked about {topic}. I am the mock provider, so I answer with a fixed reply."


# --------------------------------------------------------------------------- events


def _text_block(index: int, chunks: list[str], cites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
    ]
    events += [
        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": c}} for c in chunks
    ]
    events += [
        {"type": "content_block_delta", "index": index, "delta": {"type": "citations_delta", "citation": c}}
        for c in cites
    ]
    events.append({"type": "content_block_stop", "index": index})
    return events


def _thinking_block(index: int, text: str, message_id: str) -> list[dict[str, Any]]:
    digest = hashlib.sha256(f"{message_id}\n{text}".encode()).digest()
    signature = "EqMB" + base64.b64encode(digest + hashlib.sha256(digest).digest()).decode()
    start = {"type": "thinking", "thinking": "", "signature": ""}
    events: list[dict[str, Any]] = [{"type": "content_block_start", "index": index, "content_block": start}]
    events += [
        {"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": c}}
        for c in (_split(text, 3) if text else [])
    ]
    sig_delta = {"type": "signature_delta", "signature": signature}
    events.append({"type": "content_block_delta", "index": index, "delta": sig_delta})
    events.append({"type": "content_block_stop", "index": index})
    return events


def mock_events(body: dict[str, Any], *, deltas: int = 12, message_id: str = "msg_mock_0001") -> list[dict[str, Any]]:
    """The whole canonical event sequence the mock streams for ``body``."""
    deltas = max(1, int(deltas))
    model = str(body.get("model", ""))
    usage = {
        "input_tokens": estimate_input_tokens(body),
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model if model.startswith("mock:") else "mock:" + model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    texts: list[str] = []  # everything emitted, for the output token count
    index = 0
    thinking = _thinking_text(body)
    if thinking is not None:
        events += _thinking_block(index, thinking, message_id)
        texts.append(thinking)
        index += 1

    cites = _citations(body)
    if not cites:
        blocks: list[tuple[str, int, list[dict[str, Any]]]] = [("", deltas, [])]
    else:
        # As the API shapes a cited answer: uncited connecting text blocks, and one text block per cited claim
        # (the claim's text, then its citation; no newline inside it), so the answer reads as one paragraph.
        bodies: list[str] = [_INTRO]
        cited: list[list[dict[str, Any]]] = [[]]
        for i, c in enumerate(cites):
            if i:
                bodies.append(_BETWEEN)
                cited.append([])
            bodies.append(c.sentence)
            cited.append([c.citation])
        bodies.append(_CLOSING)
        cited.append([])
        words = [len(b.split()) for b in bodies]
        shares = [max(1, round(deltas * w / sum(words))) for w in words]
        blocks = list(zip(bodies, shares, cited, strict=True))
    for text, n, block_cites in blocks:
        chunks = _split(text, n) if text else _plain_answer(body, n)
        events += _text_block(index, chunks, block_cites)
        texts += chunks
        index += 1

    output_tokens = max(1, sum(len(t.split()) for t in texts))
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        }
    )
    events.append({"type": "message_stop"})
    return events


def mock_message(body: dict[str, Any], *, deltas: int = 12, message_id: str = "msg_mock_0001") -> dict[str, Any]:
    """The final ``Message`` obtained by folding :func:`mock_events` like the SDK accumulator does."""
    message: dict[str, Any] = {}
    for event in mock_events(body, deltas=deltas, message_id=message_id):
        kind = event["type"]
        if kind == "message_start":
            message = copy.deepcopy(event["message"])
        elif kind == "content_block_start":
            message["content"].append(copy.deepcopy(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "citations_delta":
                block.setdefault("citations", []).append(copy.deepcopy(delta["citation"]))
        elif kind == "message_delta":
            message["stop_reason"] = event["delta"]["stop_reason"]
            message["stop_sequence"] = event["delta"]["stop_sequence"]
            message["stop_details"] = event["delta"].get("stop_details")
            message["usage"].update(event["usage"])
    return message

"""The model-name knobs shared by the fake upstream and the load generator's checks.

A request's ``model`` is ``bench-d<N>[-p<ms>][-f<ms>][-c][-i<tokens>][-k<tokens>]``:

- ``d<N>``: N text deltas (text ``"tok0 tok1 … tok<N-1> "``, one ``"tok<i> "`` per delta);
- ``p<ms>``: a pause of ``ms`` milliseconds between events (0 / absent: the whole stream in one write);
- ``f<ms>``: a pause before the response starts (time to first byte);
- ``c``: a ``citations_delta`` (one ``char_location`` citation) after every 10th text delta;
- ``i<tokens>`` / ``k<tokens>``: ``input_tokens`` / ``cache_read_input_tokens`` (defaults 25 / 1000).

Usage: ``message_start`` carries the input side, ``message_delta`` ``output_tokens = N``.
Unknown model names fall back to ``bench-d200``. A Bedrock model id names the same knobs: a geography prefix
and ``anthropic.`` are left out (``us.anthropic.bench-d200-p1`` is ``bench-d200-p1``; :func:`cloud_base`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["Knobs", "Spec", "cloud_base", "parse_knobs", "spec_for"]

_KNOB = re.compile(r"(?:^|-)([dpfcik])([0-9]*(?:\.[0-9]+)?)")
_CLOUD_PREFIX = re.compile(r"^(?:[a-z-]+\.)?anthropic\.")
DEFAULT_INPUT = 25
DEFAULT_CACHE_READ = 1000


@dataclass(frozen=True, slots=True)
class Knobs:
    deltas: int = 200
    pace_ms: float = 0.0
    first_ms: float = 0.0
    citations: bool = False
    input_tokens: int = DEFAULT_INPUT
    cache_read: int = DEFAULT_CACHE_READ


def cloud_base(model: str) -> str:
    """A Bedrock model id without its geography prefix and ``anthropic.``: ``us.anthropic.bench-d200`` is
    ``bench-d200`` (what the gateway's default rule maps it to); any other name as it is."""
    return _CLOUD_PREFIX.sub("", model)


def parse_knobs(model: str) -> Knobs:
    name = model.split("/", 1)[-1]  # "anthropic/bench-d200" (LiteLLM) names the same knobs
    name = cloud_base(name)  # so does "us.anthropic.bench-d200" (a Bedrock-shaped client's model id)
    name = name.removeprefix("bedrock-")  # so does "bedrock-bench-d200" (a Bedrock model id holds no "/")
    if not name.startswith("bench"):
        return Knobs()
    values: dict[str, Any] = {}
    for key, raw in _KNOB.findall(name[len("bench") :]):
        if key == "c":
            values["citations"] = True
        elif raw:
            number = float(raw)
            if key == "d":
                values["deltas"] = max(1, int(number))
            elif key == "p":
                values["pace_ms"] = number
            elif key == "f":
                values["first_ms"] = number
            elif key == "i":
                values["input_tokens"] = int(number)
            elif key == "k":
                values["cache_read"] = int(number)
    return Knobs(**values)


def _citation(k: int, start: int, end: int) -> dict[str, Any]:
    return {
        "type": "char_location",
        "cited_text": f"source sentence {k}.",
        "document_index": 0,
        "document_title": "bench document",
        "start_char_index": start,
        "end_char_index": end,
        "file_id": None,
    }


@dataclass(frozen=True, slots=True)
class Spec:
    """What a knob's answer is: the events of its stream and the facts a client must see."""

    knobs: Knobs
    events: tuple[dict[str, Any], ...]  # the full SSE event sequence, ping included
    message: dict[str, Any]  # the equivalent non-streamed Message
    text: str  # the concatenation of every text_delta
    cited: tuple[str, ...]  # cited_text of each citations_delta, in order
    types: tuple[str, ...]  # the event types in order, pings left out
    output_tokens: int


@lru_cache(maxsize=256)
def spec_for(model: str) -> Spec:
    knobs = parse_knobs(model)
    msg_id = "msg_bench_" + re.sub(r"[^A-Za-z0-9]", "_", model)[:40]
    usage_in = {
        "input_tokens": knobs.input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": knobs.cache_read,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": 1,
        "service_tier": "standard",
    }
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": msg_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage_in,
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
    ]
    texts: list[str] = []
    citations: list[dict[str, Any]] = []
    for i in range(knobs.deltas):
        piece = f"tok{i} "
        events.append({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}})
        start = sum(map(len, texts))
        texts.append(piece)
        if knobs.citations and i % 10 == 9:
            citation = _citation(len(citations), max(0, start - 40), start + len(piece))
            citations.append(citation)
            events.append(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta", "citation": citation}}
            )
    events += [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": knobs.deltas},
        },
        {"type": "message_stop"},
    ]
    text = "".join(texts)
    block: dict[str, Any] = {"type": "text", "text": text}
    if knobs.citations:
        block["citations"] = citations
    message = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {**usage_in, "output_tokens": knobs.deltas},
    }
    return Spec(
        knobs=knobs,
        events=tuple(events),
        message=message,
        text=text,
        cited=tuple(c["cited_text"] for c in citations),
        types=tuple(e["type"] for e in events if e["type"] != "ping"),
        output_tokens=knobs.deltas,
    )

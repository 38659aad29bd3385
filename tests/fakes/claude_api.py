"""A faithful fake of the Claude API (``api.anthropic.com``) for end-to-end tests.

The fake serves ``POST /v1/messages`` (JSON and SSE), ``POST /v1/messages/count_tokens`` and
``GET /v1/models`` on 127.0.0.1 from an aiohttp server running in a background thread. The
request body's ``model`` field picks a scenario (see :data:`STREAM_SCENARIOS` and
:data:`STATUS_SCENARIOS`); unknown model names behave like ``fake-text``.

Every streaming scenario is a list of event dicts.  The SSE body (:func:`sse_body`) and the
non-streaming ``Message`` (:func:`final_message`) are both derived from that list, the latter by an
accumulator that follows the SDK's ``MessageStream`` semantics, so the two are always consistent.

``python -m tests.fakes.claude_api --write-fixtures [DIR]`` writes ``<scenario>.sse`` files (the
exact bytes the fake sends) into ``tests/fixtures/claude/`` by default.
"""

# ruff: noqa: RUF001  (scenario texts deliberately contain non-ASCII look-alike characters)
from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import hashlib
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from ._server import BackgroundServer

__all__ = [
    "DEFAULT_FIXTURE_DIR",
    "STATUS_SCENARIOS",
    "STREAM_SCENARIOS",
    "FakeClaudeAPI",
    "RecordedRequest",
    "Scenario",
    "accumulate",
    "encode_event",
    "final_message",
    "get_scenario",
    "rename_ids",
    "sse_body",
    "write_fixtures",
]

Event = dict[str, Any]

DEFAULT_FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "claude"

SLOW_INTERVAL = 0.05  # seconds between text deltas in fake-slow
SLOW_DELTAS = 400  # 400 x 50 ms = 20 s

# ---------------------------------------------------------------------------------------------
# Wire helpers
# ---------------------------------------------------------------------------------------------


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


_FAKE_ID = re.compile(r"^(msg|toolu|srvtoolu)_fake_")


def rename_ids(obj: Any, tag: str) -> Any:
    """A deep copy of ``obj`` with this fake's ids (``msg_fake_…``, ``toolu_fake_…``) as another provider
    writes them (``tag`` ``"bdrk"``: ``msg_bdrk_…``)."""
    if isinstance(obj, dict):
        is_id = ("id", "tool_use_id")
        return {
            k: _FAKE_ID.sub(rf"\1_{tag}_", v) if k in is_id and isinstance(v, str) else rename_ids(v, tag)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [rename_ids(v, tag) for v in obj]
    return obj


def encode_event(event: Event) -> bytes:
    """One SSE frame exactly as the Claude API writes it: ``event: <type>\\ndata: <json>\\n\\n``.

    The API writes every payload as compact JSON with raw UTF-8, except ``ping`` which it sends
    as ``{"type": "ping"}`` (with a space).
    """
    etype = event["type"]
    data = '{"type": "ping"}' if event == {"type": "ping"} else _compact(event)
    return f"event: {etype}\ndata: {data}\n\n".encode()


def _fake_id(prefix: str, model: str, n: int = 0) -> str:
    digest = hashlib.sha256(f"{prefix}|{model}|{n}".encode()).hexdigest()
    return f"{prefix}_fake_{digest[:24]}"


def _b64_blob(seed: str, nbytes: int) -> str:
    """A deterministic base64 string (``nbytes % 3 == 1`` gives ``==`` padding)."""
    out = b""
    i = 0
    while len(out) < nbytes:
        out += hashlib.sha256(f"{seed}:{i}".encode()).digest()
        i += 1
    return base64.b64encode(out[:nbytes]).decode("ascii")


def _error_envelope(error_type: str, message: str, request_id: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": request_id}


# ---------------------------------------------------------------------------------------------
# Event builders
# ---------------------------------------------------------------------------------------------


def _message_start(model: str, *, input_tokens: int, cache_read: int = 0, cache_creation: int = 0) -> Event:
    return {
        "type": "message_start",
        "message": {
            "id": _fake_id("msg", model),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_creation_input_tokens": cache_creation,
                "cache_read_input_tokens": cache_read,
                "cache_creation": {"ephemeral_5m_input_tokens": cache_creation, "ephemeral_1h_input_tokens": 0},
                "output_tokens": 1,
                "service_tier": "standard",
            },
        },
    }


def _block_start(index: int, block: dict[str, Any]) -> Event:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> Event:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _block_stop(index: int) -> Event:
    return {"type": "content_block_stop", "index": index}


def _text_block(
    index: int, chunks: list[str], citations: list[dict[str, Any]] | None = None, *, ping: bool = False
) -> list[Event]:
    events = [_block_start(index, {"type": "text", "text": ""})]
    if ping:
        events.append({"type": "ping"})
    events += [_delta(index, {"type": "citations_delta", "citation": c}) for c in citations or []]
    events += [_delta(index, {"type": "text_delta", "text": t}) for t in chunks]
    events.append(_block_stop(index))
    return events


def _tool_block(index: int, block: dict[str, Any], fragments: list[str]) -> list[Event]:
    events = [_block_start(index, block)]
    events += [_delta(index, {"type": "input_json_delta", "partial_json": f}) for f in fragments]
    events.append(_block_stop(index))
    return events


def _message_end(stop_reason: str, output_tokens: int, **usage: Any) -> list[Event]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {**usage, "output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------

_TEXT_CHUNKS = [
    "Hello",
    "! I'm a fake",
    " Claude model",
    " answering from",
    " a local test server.",
    " This reply arrives",
    " in several small",
    " pieces so framing can be checked.",
]


def _sc_text(model: str, n_deltas: int | None = None) -> list[Event]:
    chunks = _TEXT_CHUNKS if n_deltas is None else [f"w{i} " for i in range(n_deltas)]
    return [
        _message_start(model, input_tokens=21, cache_read=1024),
        *_text_block(0, chunks, ping=True),
        *_message_end("end_turn", 2 * len(chunks) + 3),
    ]


def _sc_text_multibyte(model: str) -> list[Event]:
    chunks = [
        "Grüße aus Zürich",
        "! Café, naïve, façade — ",
        "こんにちは世界。",
        "中文测试：你好",
        " 🌍🚀 family: 👨‍👩",  # a ZWJ sequence split across two deltas (between code points)
        "‍👧‍👦 ",
        "Ελληνικά, русский, עברית",
        " ✓ done €½",
    ]
    return [
        _message_start(model, input_tokens=35, cache_read=0, cache_creation=0),
        *_text_block(0, chunks, ping=True),
        # newer API versions repeat the input counters in message_delta (identical values)
        *_message_end("end_turn", 64, input_tokens=35, cache_creation_input_tokens=0, cache_read_input_tokens=0),
    ]


_CITATION_CHAR: dict[str, Any] = {
    "type": "char_location",
    "cited_text": "The grass is green. ",
    "document_index": 0,
    "document_title": "Plain text document",
    "start_char_index": 0,
    "end_char_index": 20,
    "file_id": None,
}
_CITATION_PAGE: dict[str, Any] = {
    "type": "page_location",
    "cited_text": "The annual report covers the years 2019–2023.",
    "document_index": 1,
    "document_title": "Annual report (PDF)",
    "start_page_number": 2,
    "end_page_number": 3,
    "file_id": None,
}
_CITATION_BLOCK: dict[str, Any] = {
    "type": "content_block_location",
    "cited_text": "First item. Second item. Third item.",
    "document_index": 2,
    "document_title": "Custom content",
    "start_block_index": 0,
    "end_block_index": 3,
    "file_id": None,
}
_CITATION_SEARCH: dict[str, Any] = {
    "type": "search_result_location",
    "cited_text": "Prompt caching reduces latency for long prompts.",
    "search_result_index": 0,
    "source": "https://docs.example.com/caching",
    "title": "Caching guide",
    "start_block_index": 1,
    "end_block_index": 2,
}


def _web_citation(model: str) -> dict[str, Any]:
    return {
        "type": "web_search_result_location",
        "cited_text": "Tomorrow will be sunny with a high of 21°C in San Francisco.",
        "url": "https://weather.example.com/sf",
        "title": "San Francisco weather — Example Weather",
        "encrypted_index": _b64_blob(f"encidx|{model}", 64),
    }


def _sc_citations(model: str) -> list[Event]:
    return [
        _message_start(model, input_tokens=2048, cache_read=0),
        *_text_block(0, ["Based on the sources", " provided: "]),
        *_text_block(1, ["the grass", " is green"], [_CITATION_CHAR]),
        *_text_block(2, [", "]),
        *_text_block(3, ["the report covers", " 2019–2023"], [_CITATION_PAGE]),
        *_text_block(4, [", "]),
        *_text_block(5, ["the list has three", " items"], [_CITATION_BLOCK]),
        *_text_block(6, [", "]),
        *_text_block(7, ["caching reduces", " latency"], [_CITATION_SEARCH]),
        *_text_block(8, [", and "]),
        *_text_block(9, ["it will be sunny", " tomorrow"], [_web_citation(model), _CITATION_CHAR]),
        *_text_block(10, ["."]),
        *_message_end("end_turn", 97),
    ]


def _sc_citations_after(model: str) -> list[Event]:
    """Cited blocks whose ``citations_delta`` comes after their text (the mock provider's order), two
    citations on one block, and one between two text deltas of a block that keeps growing."""

    def block(index: int, parts: list[str | dict[str, Any]]) -> list[Event]:
        events = [_block_start(index, {"type": "text", "text": ""})]
        for part in parts:
            delta = (
                {"type": "text_delta", "text": part}
                if isinstance(part, str)
                else {"type": "citations_delta", "citation": part}
            )
            events.append(_delta(index, delta))
        return [*events, _block_stop(index)]

    return [
        _message_start(model, input_tokens=1536, cache_read=0),
        *block(0, ["According to the sources, "]),
        *block(1, ["the grass", " is green", _CITATION_CHAR]),
        *block(2, [" and "]),
        *block(3, ["the report covers", " 2019–2023", _CITATION_PAGE, _CITATION_BLOCK]),
        *block(4, ["; "]),
        *block(5, ["caching", _CITATION_SEARCH, " reduces latency", " for prompts that repeat"]),
        *block(6, [".\n"]),
        *_message_end("end_turn", 41),
    ]


def _sc_tools(model: str) -> list[Event]:
    weather = {
        "type": "tool_use",
        "id": _fake_id("toolu", model, 1),
        "name": "get_weather",
        "input": {},
        "caller": {"type": "direct"},
    }
    clock = {
        "type": "tool_use",
        "id": _fake_id("toolu", model, 2),
        "name": "get_time",
        "input": {},
        "caller": {"type": "direct"},
    }
    return [
        _message_start(model, input_tokens=412, cache_read=0),
        *_text_block(0, ["I'll check the weather", " and the time", " for you."]),
        *_tool_block(
            1,
            weather,
            ["", '{"location": "San', ' Francisco, CA"', ', "unit": "cel', 'sius", "days": [1,', " 2]}"],
        ),
        *_tool_block(2, clock, ["", '{"timezone', '": "America/New_York"', ', "verbose": false}']),
        *_message_end("tool_use", 156),
    ]


def _sc_thinking(model: str) -> list[Event]:
    thinking = [
        "The user asks for 27 × 453.",
        " 27 × 453 = 27 × 400 + 27 × 53",
        " = 10800 + 1431",
        " = 12231.",
    ]
    return [
        _message_start(model, input_tokens=58, cache_read=0),
        _block_start(0, {"type": "thinking", "thinking": ""}),
        {"type": "ping"},
        *[_delta(0, {"type": "thinking_delta", "thinking": t}) for t in thinking],
        _delta(0, {"type": "signature_delta", "signature": THINKING_SIGNATURE}),
        _block_stop(0),
        _block_start(1, {"type": "redacted_thinking", "data": REDACTED_THINKING_DATA}),
        _block_stop(1),
        *_text_block(2, ["27 × 453", " = **12,231**."]),
        *_message_end("end_turn", 312),
    ]


def _sc_server_tools(model: str) -> list[Event]:
    srv_id = _fake_id("srvtoolu", model, 1)
    search = {"type": "server_tool_use", "id": srv_id, "name": "web_search", "input": {}}
    results = {
        "type": "web_search_tool_result",
        "tool_use_id": srv_id,
        "content": [
            {
                "type": "web_search_result",
                "title": "San Francisco weather — Example Weather",
                "url": "https://weather.example.com/sf",
                "encrypted_content": _b64_blob(f"enc1|{model}", 190),
                "page_age": "April 30, 2025",
            },
            {
                "type": "web_search_result",
                "title": "Bay Area forecast",
                "url": "https://news.example.org/bay-area-forecast",
                "encrypted_content": _b64_blob(f"enc2|{model}", 160),
                "page_age": None,
            },
        ],
    }
    return [
        _message_start(model, input_tokens=2679, cache_read=0),
        *_text_block(0, ["I'll search for", " the forecast."]),
        *_tool_block(1, search, ["", '{"query": "san fran', "cisco weather", ' tomorrow"}']),
        _block_start(2, results),
        _block_stop(2),
        *_text_block(3, ["According to", " the results, "]),
        *_text_block(4, ["it will be sunny", " tomorrow"], [_web_citation(model)]),
        *_text_block(5, ["."]),
        *_message_end(
            "end_turn",
            510,
            input_tokens=10682,
            cache_creation_input_tokens=0,
            cache_read_input_tokens=0,
            server_tool_use={"web_search_requests": 1},
        ),
    ]


def _sc_unknown_event(model: str) -> list[Event]:
    return [
        _message_start(model, input_tokens=12, cache_read=0),
        _block_start(0, {"type": "text", "text": ""}),
        _delta(0, {"type": "text_delta", "text": "Hello"}),
        {"type": "future_event", "detail": {"x": 1}},
        _delta(0, {"type": "text_delta", "text": " from the future"}),
        _block_stop(0),
        _block_start(1, {"type": "future_block", "payload": "x"}),
        _block_stop(1),
        *_message_end("end_turn", 9),
    ]


def _sc_partial(model: str) -> list[Event]:
    # shared by fake-error-midstream and fake-cut-midstream (the ending differs)
    return [
        _message_start(model, input_tokens=14, cache_read=0),
        _block_start(0, {"type": "text", "text": ""}),
        _delta(0, {"type": "text_delta", "text": "This answer will"}),
        _delta(0, {"type": "text_delta", "text": " not be finished"}),
    ]


def _sc_error_midstream(model: str) -> list[Event]:
    return [
        *_sc_partial(model),
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    ]


def _sc_slow(model: str, n_deltas: int | None = None) -> list[Event]:
    n = SLOW_DELTAS if n_deltas is None else n_deltas
    return [
        _message_start(model, input_tokens=10, cache_read=0),
        *_text_block(0, [f"tick {i}. " for i in range(n)], ping=True),
        *_message_end("end_turn", 3 * n + 1),
    ]


def _sc_pause(model: str, n_deltas: int | None = None) -> list[Event]:
    """Text in ``n_deltas`` pieces with no ``ping`` event (the silence is the scenario's ``pause_s``)."""
    n = 6 if n_deltas is None else n_deltas
    return [
        _message_start(model, input_tokens=12, cache_read=0),
        *_text_block(0, [f"part {i}. " for i in range(n)]),
        *_message_end("end_turn", 3 * n + 1),
    ]


THINKING_SIGNATURE = _b64_blob("thinking-signature", 349)
ISSUED_SIGNATURES = frozenset({THINKING_SIGNATURE})
"""The signatures the fakes put on thinking blocks: a thinking block sent back must carry one of them, verbatim."""


def signature_problem(body: Any) -> str | None:
    """The API's refusal of a body whose assistant turn holds a thinking block with a signature the fakes never
    issued (the real API checks it; a gateway that re-encodes or loses one breaks multi-turn thinking), else None."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or message.get("role") != "assistant":
            continue
        for j, block in enumerate(content):
            thinking = isinstance(block, dict) and block.get("type") == "thinking"
            if thinking and block.get("signature") not in ISSUED_SIGNATURES:
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
    return None


REDACTED_THINKING_DATA = _b64_blob("redacted-thinking", 256)


@dataclass(frozen=True)
class Scenario:
    name: str  # base scenario name (without knobs)
    model: str  # the model string echoed in the message
    events: list[Event]
    ending: Literal["complete", "error", "cut"] = "complete"
    delta_interval: float = 0.0  # sleep before each content_block_delta
    pause_before: int = 0  # the delta (1-based) before which the upstream is silent for ``pause_s`` more; 0: none
    pause_s: float = 0.0

    def delay_before_delta(self, number: int) -> float:
        """How long the upstream is silent before its ``number``-th content_block_delta (1-based)."""
        return self.delta_interval + (self.pause_s if number == self.pause_before else 0.0)

    @property
    def paced(self) -> bool:
        return bool(self.delta_interval or self.pause_s)


_Builder = Callable[[str], list[Event]]
_KnobBuilder = Callable[[str, int | None], list[Event]]

_BUILDERS: dict[str, tuple[_Builder, Literal["complete", "error", "cut"], float]] = {
    "fake-text": (_sc_text, "complete", 0.0),
    "fake-text-multibyte": (_sc_text_multibyte, "complete", 0.0),
    "fake-citations": (_sc_citations, "complete", 0.0),
    "fake-citations-after": (_sc_citations_after, "complete", 0.0),
    "fake-tools": (_sc_tools, "complete", 0.0),
    "fake-thinking": (_sc_thinking, "complete", 0.0),
    "fake-server-tools": (_sc_server_tools, "complete", 0.0),
    "fake-unknown-event": (_sc_unknown_event, "complete", 0.0),
    "fake-error-midstream": (_sc_error_midstream, "error", 0.0),
    "fake-cut-midstream": (_sc_partial, "cut", 0.0),
    "fake-slow": (_sc_slow, "complete", SLOW_INTERVAL),
    "fake-pause": (_sc_pause, "complete", 0.0),
}
_KNOB_BUILDERS: dict[str, _KnobBuilder] = {"fake-text": _sc_text, "fake-slow": _sc_slow, "fake-pause": _sc_pause}
_KNOB_RE = re.compile(r"^(?P<base>fake-[a-z-]+?)-d(?P<n>\d{1,6})(?:-i(?P<ms>\d{1,6}))?(?:-p(?P<pause>\d{1,4}))?$")

#: Names of the scenarios that answer with HTTP 200 (SSE or JSON).
STREAM_SCENARIOS: tuple[str, ...] = tuple(_BUILDERS)

#: model -> (HTTP status, error.type, error.message)
STATUS_SCENARIOS: dict[str, tuple[int, str, str]] = {
    "fake-status-400": (400, "invalid_request_error", "messages: at least one message is required"),
    "fake-status-401": (401, "authentication_error", "invalid x-api-key"),
    "fake-status-429": (
        429,
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 50 requests per minute. "
        "For details, refer to: https://docs.claude.com/en/api/rate-limits.",
    ),
    "fake-status-529": (529, "overloaded_error", "Overloaded"),
    "fake-status-500": (500, "api_error", "Internal server error"),
    "fake-status-408": (408, "timeout_error", "Request timed out"),
}


def get_scenario(model: str) -> Scenario:
    """The streaming scenario for ``model`` (unknown names -> ``fake-text``).

    Knobs: ``fake-text-d200`` / ``fake-slow-d10`` set the number of text deltas; ``-i3000`` after it the
    interval before each delta in milliseconds (``fake-slow-d26-i3000``: a 75 s answer); ``-p70`` a silence of
    that many seconds before the middle delta (``fake-pause-d6-p70``: a thinking pause, and no ``ping`` event
    anywhere, as Bedrock sends none).
    """
    if model in _BUILDERS:
        builder, ending, interval = _BUILDERS[model]
        return Scenario(model, model, builder(model), ending, interval)
    m = _KNOB_RE.match(model)
    if m and m["base"] in _KNOB_BUILDERS:
        base, n = m["base"], int(m["n"])
        _, ending, interval = _BUILDERS[base]
        if m["ms"] is not None:
            interval = int(m["ms"]) / 1000
        pause = int(m["pause"]) if m["pause"] is not None else 0
        events = _KNOB_BUILDERS[base](model, n)
        return Scenario(base, model, events, ending, interval, pause_before=n // 2 + 1 if pause else 0, pause_s=pause)
    return Scenario("fake-text", model, _sc_text(model))


def sse_body(model: str) -> bytes:
    """The exact response body the fake streams for ``model`` (a cut stream stops early)."""
    return b"".join(encode_event(e) for e in get_scenario(model).events)


# ---------------------------------------------------------------------------------------------
# Accumulator (mirrors anthropic.lib.streaming MessageStream semantics)
# ---------------------------------------------------------------------------------------------


def accumulate(events: list[Event]) -> dict[str, Any] | None:
    """Fold raw stream events into the ``Message`` dict; ``None`` without a ``message_start``."""
    message: dict[str, Any] | None = None
    json_bufs: dict[int, str] = {}
    for event in events:
        etype = event["type"]
        if etype == "message_start":
            message = copy.deepcopy(event["message"])
            continue
        if message is None:
            continue
        content: list[dict[str, Any]] = message["content"]
        if etype == "content_block_start":
            content.append(copy.deepcopy(event["content_block"]))
        elif etype == "content_block_delta":
            block = content[event["index"]]
            delta = event["delta"]
            dtype = delta["type"]
            if dtype == "text_delta":
                block["text"] += delta["text"]
            elif dtype == "input_json_delta":
                json_bufs[event["index"]] = json_bufs.get(event["index"], "") + delta["partial_json"]
            elif dtype == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif dtype == "signature_delta":
                block["signature"] = delta["signature"]
            elif dtype == "citations_delta":
                block.setdefault("citations", []).append(copy.deepcopy(delta["citation"]))
        elif etype == "content_block_stop":
            buf = json_bufs.pop(event["index"], "")
            if buf:
                content[event["index"]]["input"] = json.loads(buf)
        elif etype == "message_delta":
            delta = event["delta"]
            message["stop_reason"] = delta.get("stop_reason")
            message["stop_sequence"] = delta.get("stop_sequence")
            message["stop_details"] = delta.get("stop_details")
            if delta.get("container") is not None:
                message["container"] = delta["container"]
            usage = message["usage"]
            for key, value in event["usage"].items():
                if value is not None:
                    usage[key] = copy.deepcopy(value)
    if message is not None:
        message.setdefault("stop_details", None)
        message.setdefault("container", None)
    return message


def final_message(model: str) -> dict[str, Any]:
    """The non-streaming ``Message`` body for ``model`` (what the stream accumulates to)."""
    message = accumulate(get_scenario(model).events)
    assert message is not None
    return message


# ---------------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    json: Any = None


@dataclass
class _Counters:
    disconnects: int = 0
    requests: list[RecordedRequest] = field(default_factory=list)


class FakeClaudeAPI(BackgroundServer):
    """The fake server. ``with FakeClaudeAPI() as fake: ...`` starts and stops it."""

    MODELS: tuple[dict[str, Any], ...] = (
        {
            "type": "model",
            "id": "claude-fake-sonnet-1",
            "display_name": "Claude Fake Sonnet 1",
            "created_at": "2025-05-14T00:00:00Z",
            "lifecycle": "active",
            "max_input_tokens": 200000,
            "max_tokens": 64000,
        },
        {
            "type": "model",
            "id": "claude-fake-haiku-1",
            "display_name": "Claude Fake Haiku 1",
            "created_at": "2024-10-22T00:00:00Z",
            "lifecycle": "active",
            "max_input_tokens": 200000,
            "max_tokens": 8192,
        },
    )

    thread_name = "fake-claude-api"

    def _new_state(self) -> _Counters:
        return _Counters()

    # -- public state -----------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._cond:
            return list(self._state.requests)

    # -- request handling ---------------------------------------------------------------------

    @staticmethod
    def _headers(request_id: str, **extra: str) -> dict[str, str]:
        reset = (datetime.now(UTC) + timedelta(seconds=1)).replace(microsecond=0)
        headers = {
            "request-id": request_id,
            "anthropic-organization-id": "00000000-0000-4000-8000-00000000fa4e",
            "anthropic-ratelimit-requests-limit": "4000",
            "anthropic-ratelimit-requests-remaining": "3999",
            "anthropic-ratelimit-requests-reset": reset.isoformat().replace("+00:00", "Z"),
            "anthropic-ratelimit-tokens-limit": "2000000",
            "anthropic-ratelimit-tokens-remaining": "2000000",
            "anthropic-ratelimit-tokens-reset": reset.isoformat().replace("+00:00", "Z"),
        }
        headers.update(extra)
        return headers

    def _json(self, status: int, payload: Any, request_id: str, **extra: str) -> web.Response:
        return web.Response(
            status=status,
            body=_compact(payload).encode(),
            content_type="application/json",
            headers=self._headers(request_id, **extra),
        )

    def _error(self, status: int, error_type: str, message: str, request_id: str, **extra: str) -> web.Response:
        return self._json(status, _error_envelope(error_type, message, request_id), request_id, **extra)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        parsed: Any = None
        if body:
            with contextlib.suppress(ValueError):
                parsed = json.loads(body)
        self._record(
            RecordedRequest(
                method=request.method,
                path=request.path,
                query=request.query_string,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
                json=parsed,
            )
        )
        request_id = f"req_fake_{uuid.uuid4().hex[:24]}"
        auth = request.headers.get("authorization", "")
        if not request.headers.get("x-api-key") and not auth.lower().startswith("bearer "):
            return self._error(401, "authentication_error", "x-api-key header is required", request_id)

        method, path = request.method, request.path.rstrip("/")
        if method == "POST" and path == "/v1/messages":
            return await self._messages(request, parsed, request_id)
        if method == "POST" and path == "/v1/messages/count_tokens":
            if not isinstance(parsed, dict):
                return self._error(400, "invalid_request_error", "body: invalid JSON", request_id)
            return self._json(200, {"input_tokens": len(body) // 4 + 3}, request_id)
        if method == "GET" and path == "/v1/models":
            data = list(self.MODELS)
            page = {"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]}
            return self._json(200, page, request_id)
        if method == "GET" and path.startswith("/v1/models/"):
            model_id = path.removeprefix("/v1/models/")
            for model in self.MODELS:
                if model["id"] == model_id:
                    return self._json(200, model, request_id)
            return self._error(404, "not_found_error", f"model: {model_id}", request_id)
        return self._error(404, "not_found_error", "Not found", request_id)

    async def _messages(self, request: web.Request, body: Any, request_id: str) -> web.StreamResponse:
        if not isinstance(body, dict):
            return self._error(400, "invalid_request_error", "body: invalid JSON", request_id)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return self._error(400, "invalid_request_error", "model: Field required", request_id)
        if model in STATUS_SCENARIOS:
            status, error_type, message = STATUS_SCENARIOS[model]
            extra: dict[str, str] = {}
            if status == 429:
                extra = {"retry-after": "7", "anthropic-ratelimit-requests-remaining": "0"}
            elif status == 529:
                extra = {"x-should-retry": "true"}
            return self._error(status, error_type, message, request_id, **extra)
        problem = signature_problem(body)
        if problem is not None:
            return self._error(400, "invalid_request_error", problem, request_id)
        scenario = get_scenario(model)
        if body.get("stream") is True:
            return await self._stream(request, scenario, request_id)
        return await self._non_stream(request, scenario, request_id)

    async def _stream(self, request: web.Request, scenario: Scenario, request_id: str) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers=self._headers(
                request_id, **{"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
            ),
        )
        return await self._send_sse(request, resp, scenario.events, scenario)

    async def _non_stream(self, request: web.Request, scenario: Scenario, request_id: str) -> web.StreamResponse:
        if scenario.ending == "error":
            return self._error(529, "overloaded_error", "Overloaded", request_id, **{"x-should-retry": "true"})
        if scenario.ending == "cut":
            self._abort(request)
            return web.Response(status=500)  # never reaches the client
        if not await self._pace_json(request, scenario):
            return web.Response(status=499)
        message = accumulate(scenario.events)
        return self._json(200, message, request_id)


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


def write_fixtures(directory: Path | str = DEFAULT_FIXTURE_DIR) -> list[Path]:
    """Write ``<scenario>.sse`` (exact streamed bytes) for every streaming scenario."""
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in STREAM_SCENARIOS:
        path = out_dir / f"{name}.sse"
        path.write_bytes(sse_body(name))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write-fixtures", nargs="?", const=str(DEFAULT_FIXTURE_DIR), metavar="DIR")
    parser.add_argument("--serve", action="store_true", help="run the fake until Ctrl-C and print its URL")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default: a free one)")
    args = parser.parse_args(argv)
    if args.write_fixtures:
        for path in write_fixtures(args.write_fixtures):
            print(path)
    if args.serve:
        fake = FakeClaudeAPI()
        fake.listen_port = args.port
        with fake:
            print(fake.base_url, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    if not args.write_fixtures and not args.serve:
        parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

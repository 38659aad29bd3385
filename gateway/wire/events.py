"""Canonical events of the Messages stream.

Two representations live here, for two jobs:

* Typed, frozen Structs for every event, block, delta and citation type, tagged by ``type`` as on the
  wire. The gateway builds these only where it *makes* an event (an ``error`` it synthesises, the mock
  provider, a translated provider stream); encoding one yields the client's ``data:`` payload.
* ``EventView`` — the small partial decode of a forwarded event (its ``type``, ``index``, block and
  delta kinds, usage). A ``Batch`` carries the views of one upstream read beside the exact ``data`` bytes
  that arrived, so an event that passes through unchanged is written to the client as those bytes,
  never re-serialised.

Unknown event, block and delta types are carried intact: the view decodes any ``type`` string, and the
raw bytes go through untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import msgspec

if TYPE_CHECKING:
    from ._views_c import ScannedViews

__all__ = [
    "COMPILED_VIEWS",
    "KNOWN_EVENTS",
    "MALFORMED",
    "AnyEvent",
    "Batch",
    "Block",
    "CharLocation",
    "Citation",
    "CitationsDelta",
    "ContentBlockDelta",
    "ContentBlockLocation",
    "ContentBlockStart",
    "ContentBlockStop",
    "Delta",
    "ErrorDetail",
    "ErrorEvent",
    "Event",
    "EventView",
    "InputJsonDelta",
    "MessageDelta",
    "MessageDeltaBody",
    "MessageStart",
    "MessageStop",
    "PageLocation",
    "Ping",
    "RedactedThinkingBlock",
    "SearchResultLocation",
    "ServerToolUseBlock",
    "SignatureDelta",
    "StartMessage",
    "TextBlock",
    "TextDelta",
    "ThinkingBlock",
    "ThinkingDelta",
    "ToolUseBlock",
    "Usage",
    "UsageView",
    "WebSearchResultLocation",
    "decode_view",
    "decode_views",
    "encode_event",
]


KNOWN_EVENTS = (
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
)
"""The event types of the Messages stream this gateway knows; any other type is carried through."""


class _Wire(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every typed wire object: frozen, keyword-only, tolerant of unknown fields."""


# --- usage -------------------------------------------------------------------------------------------


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts of one request; ``None`` means the provider did not report the field (not zero)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


# --- citations -----------------------------------------------------------------------------------------


class Citation(_Wire, tag_field="type", kw_only=True, frozen=True):
    cited_text: str


class CharLocation(Citation, tag="char_location", kw_only=True, frozen=True):
    document_index: int
    document_title: str | None = None
    start_char_index: int
    end_char_index: int
    file_id: str | None = None


class PageLocation(Citation, tag="page_location", kw_only=True, frozen=True):
    document_index: int
    document_title: str | None = None
    start_page_number: int
    end_page_number: int
    file_id: str | None = None


class ContentBlockLocation(Citation, tag="content_block_location", kw_only=True, frozen=True):
    document_index: int
    document_title: str | None = None
    start_block_index: int
    end_block_index: int
    file_id: str | None = None


class SearchResultLocation(Citation, tag="search_result_location", kw_only=True, frozen=True):
    search_result_index: int
    source: str
    title: str | None = None
    start_block_index: int
    end_block_index: int


class WebSearchResultLocation(Citation, tag="web_search_result_location", kw_only=True, frozen=True):
    url: str
    title: str | None = None
    encrypted_index: str


AnyCitation = CharLocation | PageLocation | ContentBlockLocation | SearchResultLocation | WebSearchResultLocation


# --- content blocks (as they appear in content_block_start) -------------------------------------------


class Block(_Wire, tag_field="type", kw_only=True, frozen=True):
    pass


class TextBlock(Block, tag="text", kw_only=True, frozen=True):
    text: str = ""


class ThinkingBlock(Block, tag="thinking", kw_only=True, frozen=True):
    thinking: str = ""
    signature: str = ""


class RedactedThinkingBlock(Block, tag="redacted_thinking", kw_only=True, frozen=True):
    data: str


class ToolUseBlock(Block, tag="tool_use", kw_only=True, frozen=True):
    id: str
    name: str
    input: dict[str, Any] = {}


class ServerToolUseBlock(Block, tag="server_tool_use", kw_only=True, frozen=True):
    id: str
    name: str
    input: dict[str, Any] = {}


AnyBlock = TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ServerToolUseBlock


# --- deltas ----------------------------------------------------------------------------------------------


class Delta(_Wire, tag_field="type", kw_only=True, frozen=True):
    pass


class TextDelta(Delta, tag="text_delta", kw_only=True, frozen=True):
    text: str


class InputJsonDelta(Delta, tag="input_json_delta", kw_only=True, frozen=True):
    partial_json: str


class ThinkingDelta(Delta, tag="thinking_delta", kw_only=True, frozen=True):
    thinking: str


class SignatureDelta(Delta, tag="signature_delta", kw_only=True, frozen=True):
    signature: str


class CitationsDelta(Delta, tag="citations_delta", kw_only=True, frozen=True):
    citation: AnyCitation


AnyDelta = TextDelta | InputJsonDelta | ThinkingDelta | SignatureDelta | CitationsDelta


# --- events ------------------------------------------------------------------------------------------------


class Event(_Wire, tag_field="type", kw_only=True, frozen=True):
    pass


class StartMessage(_Wire, kw_only=True, frozen=True):
    """The ``message`` of ``message_start``: a Message with no content yet."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[Any] = []
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: Usage = Usage(input_tokens=0, output_tokens=0)


class MessageStart(Event, tag="message_start", kw_only=True, frozen=True):
    message: StartMessage


class ContentBlockStart(Event, tag="content_block_start", kw_only=True, frozen=True):
    index: int
    content_block: AnyBlock


class ContentBlockDelta(Event, tag="content_block_delta", kw_only=True, frozen=True):
    index: int
    delta: AnyDelta


class ContentBlockStop(Event, tag="content_block_stop", kw_only=True, frozen=True):
    index: int


class MessageDeltaBody(_Wire, kw_only=True, frozen=True):
    stop_reason: str | None = None
    stop_sequence: str | None = None


class MessageDelta(Event, tag="message_delta", kw_only=True, frozen=True):
    delta: MessageDeltaBody
    usage: Usage


class MessageStop(Event, tag="message_stop", kw_only=True, frozen=True):
    pass


class Ping(Event, tag="ping", kw_only=True, frozen=True):
    pass


class ErrorDetail(_Wire, kw_only=True, frozen=True):
    type: str
    message: str


class ErrorEvent(Event, tag="error", kw_only=True, frozen=True):
    error: ErrorDetail


AnyEvent = (
    MessageStart
    | ContentBlockStart
    | ContentBlockDelta
    | ContentBlockStop
    | MessageDelta
    | MessageStop
    | Ping
    | ErrorEvent
)


# --- the partial view decoded from every forwarded event ------------------------------------------------
# gc=False: these hold no reference cycles, so the cyclic collector need not track the thousands a
# busy gateway allocates per second.


class UsageView(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Kind(msgspec.Struct, gc=False):
    type: str = ""


class _DeltaView(msgspec.Struct, gc=False):
    type: str = ""
    stop_reason: str | None = None  # message_delta's (the span's gen_ai.response.finish_reasons)


class _MessageView(msgspec.Struct, gc=False):
    usage: UsageView | None = None
    id: str = ""  # message_start's message id and model (the span's gen_ai.response.id and .model)
    model: str = ""


class _ErrorView(msgspec.Struct, gc=False):
    type: str = "api_error"
    message: str = ""


class EventView(msgspec.Struct, gc=False):
    """Just what validation and usage need of one event; every other field is skipped, not decoded."""

    type: str = ""
    index: int | None = None
    content_block: _Kind | None = None
    delta: _DeltaView | None = None
    message: _MessageView | None = None
    usage: UsageView | None = None
    error: _ErrorView | None = None


_decode_view = msgspec.json.Decoder(EventView).decode
_decode_views = msgspec.json.Decoder(list[EventView]).decode
_encode = msgspec.json.Encoder().encode
MALFORMED = EventView(type="")


def decode_view(data: bytes) -> EventView:
    """Partially decode one event's JSON; raises ``msgspec.DecodeError`` on malformed JSON."""
    return _decode_view(data)


# A delta's view depends only on its prefix (``{"type":"content_block_delta","index":N,"delta":{"type":"t",``),
# so the views of deltas are cached by it and shared: nobody mutates a view that has a type. Bounded: the
# keys are a stream's block indexes times its delta types, and a full cache only stops growing.
_VIEW_CACHE: dict[bytes, EventView] = {}
_VIEW_CACHE_SIZE = 4096

_scan_views: Callable[[bytes, dict[bytes, Any]], ScannedViews | None] | None
try:  # the deltas answered from the cache in C (gateway/wire/_views_c.c); msgspec decodes the rest
    from ._views_c import scan_views as _scan_views
except ImportError:  # pragma: no cover - no compiler where it was installed
    _scan_views = None
COMPILED_VIEWS = _scan_views is not None


def decode_views(datas: list[bytes], array: bytes | None = None) -> list[EventView]:
    """Partially decode many events in one call (``array``: the same data as one JSON array, if at hand);
    a malformed event becomes the shared untyped ``MALFORMED`` view. With ``datas``, there is exactly one view
    per data, whatever a data holds (nothing, or two values with a comma between them: each is then MALFORMED
    or its own view, decoded one by one)."""
    if array is None:
        array = b"[" + b",".join(datas) + b"]"
    views = _decode_array(array, datas)
    if datas and len(views) != len(datas):
        return [_decode_one(data) for data in datas]
    return views


def _decode_one(data: bytes) -> EventView:
    try:
        return _decode_view(data)
    except msgspec.DecodeError:
        return MALFORMED  # shared and never mutated: the validator rejects its empty type


def _decode_array(array: bytes, datas: list[bytes]) -> list[EventView]:
    if _scan_views is not None:
        scanned = _scan_views(array, _VIEW_CACHE)
        if scanned is not None:
            views, rest = scanned.views, scanned.rest  # each field read once (~10 ns a read on 3.11)
            if rest is None:
                return views  # every item a cached EventView
            try:
                decoded = _decode_views(rest)
            except msgspec.DecodeError:
                decoded = []  # a malformed event: the whole array below, event by event if need be
            misses = scanned.misses
            if len(decoded) == len(misses):
                cache = _VIEW_CACHE
                for (at, key), view in zip(misses, decoded, strict=True):
                    views[at] = view
                    if key is not None and len(cache) < _VIEW_CACHE_SIZE:
                        cache[key] = view
                return views
    try:
        return _decode_views(array)
    except msgspec.DecodeError:
        return [_decode_one(data) for data in datas]


class Batch:
    """The events completed by one upstream read, as they travel to the client.

    ``views[i]`` is the partial decode of event i and ``datas[i]`` its exact JSON bytes. ``raw``, when
    set, is the canonical SSE of the whole batch (``event: <type>\\ndata: <datas[i]>\\n\\n`` for each i) —
    usually the very bytes that arrived — so a batch that passes validation is written as one object,
    and ``datas`` is then only split out of it if something needs them one by one.
    """

    __slots__ = ("_datas", "raw", "views", "wire_span")

    def __init__(self, views: list[EventView], datas: list[bytes] | None, raw: bytes | None = None) -> None:
        if datas is None and raw is None:
            raise ValueError("a batch needs its data or its canonical bytes")
        self.views = views
        self._datas = datas
        self.raw = raw
        # (bytes read, how many of them are the batch's) when the provider's wire is not SSE (a Bedrock read's
        # event-stream frames): what a client of that same shape gets, byte for byte (``wire``)
        self.wire_span: tuple[bytes, int] | None = None

    @property
    def wire(self) -> bytes | None:
        """The provider's own bytes of the batch, when they are not SSE (sliced on first use: only a client of
        the provider's shape needs them)."""
        span = self.wire_span
        if span is None:
            return None
        read, used = span
        return read if used == len(read) else read[:used]

    @property
    def datas(self) -> list[bytes]:
        if self._datas is None:
            assert self.raw is not None
            self._datas = [line[6:] for line in self.raw.split(b"\n")[1::3]]
        return self._datas

    def __len__(self) -> int:
        return len(self.views)

    def __repr__(self) -> str:
        return f"Batch({[v.type for v in self.views]!r})"


def encode_event(event: Event) -> bytes:
    """Encode a typed event as its ``data:`` JSON payload."""
    return _encode(event)

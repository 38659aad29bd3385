"""The stream validator: a transition table over the canonical event sequence (docs/wire-formats.md §6.1).

States are the positions of a Messages stream; the table maps ``(state, event type)`` to the next
state. A pair missing from the table is a violation — reported, never forwarded. Event types the
table has never heard of are tolerated in every open state and change nothing (the API reserves the
right to add event types). Block events carry extra guards: dense indexes, the open block's index,
and delta kinds that agree with the block kind.
"""

from __future__ import annotations

import re
from enum import IntEnum

from gateway.wire.events import KNOWN_EVENTS, EventView

__all__ = ["KNOWN_EVENTS", "State", "StreamValidator", "Violation"]


class State(IntEnum):
    START = 0  # nothing yet: message_start must come first
    MESSAGE = 1  # between blocks
    BLOCK = 2  # inside block `open_index`
    DELTA = 3  # message_delta seen: only more message_delta, then message_stop
    DONE = 4  # message_stop seen: success, terminal
    FAILED = 5  # error seen (or a violation reported): terminal


_EVENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""What an event type this gateway does not know may look like to be carried through as an ``event:`` name."""


class Violation(Exception):
    """An upstream event that breaks the stream's invariants. ``rule`` is a short metric label."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message
        self.at = 0  # the position of the offending event in its batch (see check_all)


_S = State

# (state, event type) -> next state. Everything absent is a violation.
_TABLE: dict[tuple[State, str], State] = {
    (_S.START, "message_start"): _S.MESSAGE,
    (_S.MESSAGE, "content_block_start"): _S.BLOCK,
    (_S.MESSAGE, "message_delta"): _S.DELTA,
    (_S.BLOCK, "content_block_delta"): _S.BLOCK,
    (_S.BLOCK, "content_block_stop"): _S.MESSAGE,
    (_S.DELTA, "message_delta"): _S.DELTA,
    (_S.DELTA, "message_stop"): _S.DONE,
}
for _state in (_S.START, _S.MESSAGE, _S.BLOCK, _S.DELTA):
    _TABLE[(_state, "ping")] = _state
    _TABLE[(_state, "error")] = _S.FAILED
# The same table indexed by state first, for the per-event lookup.
_BY_STATE: tuple[dict[str, State], ...] = tuple(
    {etype: nxt for (state, etype), nxt in _TABLE.items() if state is s} for s in State
)

_RULES: dict[str, str] = {
    "message_start": "duplicate_message_start",
    "content_block_start": "block_out_of_place",
    "content_block_delta": "delta_outside_block",
    "content_block_stop": "stop_outside_block",
    "message_delta": "message_delta_out_of_place",
    "message_stop": "message_stop_out_of_place",
}

_TOOL_INPUT = frozenset({"input_json_delta"})
_NO_DELTAS: frozenset[str] = frozenset()
# Which deltas each known block kind accepts. Unknown block kinds, and unknown delta kinds, pass.
_DELTAS_FOR_BLOCK: dict[str, frozenset[str]] = {
    "text": frozenset({"text_delta", "citations_delta"}),
    "thinking": frozenset({"thinking_delta", "signature_delta"}),
    "tool_use": _TOOL_INPUT,
    "server_tool_use": _TOOL_INPUT,
    "mcp_tool_use": _TOOL_INPUT,
    "redacted_thinking": _NO_DELTAS,
    "web_search_tool_result": _NO_DELTAS,
    "web_fetch_tool_result": _NO_DELTAS,
    "code_execution_tool_result": _NO_DELTAS,
    "bash_code_execution_tool_result": _NO_DELTAS,
    "text_editor_code_execution_tool_result": _NO_DELTAS,
    "tool_search_tool_result": _NO_DELTAS,
    "mcp_tool_result": _NO_DELTAS,
    "container_upload": _NO_DELTAS,
}
_KNOWN_DELTAS = frozenset().union(*_DELTAS_FOR_BLOCK.values())
# Per block kind, the known deltas it must NOT receive (unknown kinds: none are forbidden).
_FORBIDDEN = {kind: _KNOWN_DELTAS - allowed for kind, allowed in _DELTAS_FOR_BLOCK.items()}
_NOTHING: frozenset[str] = frozenset()

MAX_BLOCKS = 10_000


class StreamValidator:
    """Checks one stream, event by event. ``check`` raises ``Violation``; ``finish`` checks the end."""

    __slots__ = ("block_kind", "forbidden", "next_index", "open_index", "state")

    def __init__(self) -> None:
        self.state = State.START
        self.next_index = 0
        self.open_index = -1
        self.block_kind = ""
        self.forbidden = _NOTHING

    @property
    def terminal(self) -> bool:
        return self.state >= State.DONE

    def check(self, view: EventView) -> None:
        state = self.state
        etype = view.type
        if state is State.BLOCK and etype == "content_block_delta":  # the hot path: one more delta
            if view.index != self.open_index:
                raise Violation("block_index", f"{etype} for index {view.index} while block {self.open_index} is open")
            delta = view.delta
            if delta is not None and delta.type in self.forbidden:
                raise Violation("delta_kind", f"{delta.type} on a {self.block_kind} block")
            return
        nxt = _BY_STATE[state].get(etype)
        if nxt is None:
            if state >= State.DONE:
                raise Violation("event_after_end", f"{etype or 'untyped'} event after the stream ended")
            if etype in _RULES:
                raise Violation(_RULES[etype], f"{etype} is not allowed in state {state.name.lower()}")
            if not etype:
                raise Violation("untyped_event", "event that is not a JSON object with a type")
            if not _EVENT_NAME.fullmatch(etype):  # it becomes the frame's `event:` line: no line break, no space
                raise Violation("event_name", f"event type {etype[:40]!r} cannot be an SSE event name")
            return  # an event type newer than this gateway: carried through, state unchanged
        if etype == "content_block_start":
            self._start_block(view)
        elif etype == "content_block_stop" and view.index != self.open_index:
            raise Violation("block_index", f"{etype} for index {view.index} while block {self.open_index} is open")
        self.state = nxt

    def check_all(self, views: list[EventView]) -> int:
        """Check a batch in order. Returns how many of its events may go out: all of them, or up to and
        including a terminal event. Raises ``Violation`` with ``at`` = the offending event's position.
        The common event (one more delta of the open block) is checked inline, without a call, and not again
        when the next view is the very same object (views are immutable once decoded, and the check of a delta
        changes no state)."""
        block = State.BLOCK
        passed = None  # the last view that passed inline: the same object again passes too (nothing changed)
        for i, view in enumerate(views):
            if view is passed:  # the partial decode's cache gives a block's deltas one shared view
                continue
            if (
                view.type == "content_block_delta"
                and self.state is block
                and view.index == self.open_index
                and (view.delta is None or view.delta.type not in self.forbidden)
            ):
                passed = view
                continue
            passed = None
            try:
                self.check(view)
            except Violation as violation:
                violation.at = i
                raise
            if self.state >= State.DONE:
                return i + 1
        return len(views)

    def _start_block(self, view: EventView) -> None:
        index = view.index
        if index != self.next_index:
            raise Violation("block_index", f"content_block_start index {index}, expected {self.next_index}")
        if index >= MAX_BLOCKS:
            raise Violation("too_many_blocks", f"more than {MAX_BLOCKS} content blocks")
        self.open_index = index
        self.next_index = index + 1
        self.block_kind = view.content_block.type if view.content_block is not None else ""
        self.forbidden = _FORBIDDEN.get(self.block_kind, _NOTHING)

    def finish(self) -> None:
        """The upstream ended. Anything but a finished or failed stream is a truncation."""
        if self.state < State.DONE:
            state = self.state.name.lower()
            raise Violation("truncated", f"upstream stream ended without message_stop (in state {state})")

    def fail(self) -> None:
        """Mark the stream failed (the gateway is ending it with an ``error`` event)."""
        self.state = State.FAILED

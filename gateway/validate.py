"""The stream validator: a transition table over the canonical event sequence (protocols.md §6).

States are the positions of a Messages stream; the table maps ``(state, event type)`` to the next
state. A pair missing from the table is a violation — reported, never forwarded. Event types the
table has never heard of are tolerated in every open state and change nothing (the API reserves the
right to add event types). Block events carry extra guards: dense indexes, the open block's index,
and delta kinds that agree with the block kind.
"""

from __future__ import annotations

from enum import Enum

from gateway.events import EventView

__all__ = ["KNOWN_EVENTS", "State", "StreamValidator", "Violation"]


class State(Enum):
    START = "start"  # nothing yet: message_start must come first
    MESSAGE = "message"  # between blocks
    BLOCK = "block"  # inside block `open_index`
    DELTA = "delta"  # message_delta seen: only more message_delta, then message_stop
    DONE = "done"  # message_stop seen: success, terminal
    FAILED = "failed"  # error seen (or a violation reported): terminal


class Violation(Exception):
    """An upstream event that breaks the stream's invariants. ``rule`` is a short metric label."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


_S = State
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

MAX_BLOCKS = 10_000


class StreamValidator:
    """Checks one stream, event by event. ``check`` raises ``Violation``; ``finish`` checks the end."""

    __slots__ = ("block_kind", "next_index", "open_index", "state")

    def __init__(self) -> None:
        self.state = State.START
        self.next_index = 0
        self.open_index = -1
        self.block_kind = ""

    @property
    def terminal(self) -> bool:
        return self.state is State.DONE or self.state is State.FAILED

    def check(self, view: EventView) -> None:
        state = self.state
        etype = view.type
        nxt = _TABLE.get((state, etype))
        if nxt is None:
            if state is State.DONE or state is State.FAILED:
                raise Violation("event_after_end", f"{etype or 'untyped'} event after the stream ended")
            if etype in _RULES:
                raise Violation(_RULES[etype], f"{etype} is not allowed in state {state.value}")
            if not etype:
                raise Violation("untyped_event", "event without a type")
            return  # an event type newer than this gateway: carried through, state unchanged
        if state is State.BLOCK or etype == "content_block_start":
            self._check_block(view, etype)
        self.state = nxt

    def _check_block(self, view: EventView, etype: str) -> None:
        index = view.index
        if etype == "content_block_start":
            if index != self.next_index:
                raise Violation("block_index", f"content_block_start index {index}, expected {self.next_index}")
            if index >= MAX_BLOCKS:
                raise Violation("too_many_blocks", f"more than {MAX_BLOCKS} content blocks")
            self.open_index = index
            self.next_index = index + 1
            self.block_kind = view.content_block.type if view.content_block is not None else ""
            return
        if etype == "ping" or etype == "error":
            return
        if index != self.open_index:
            raise Violation("block_index", f"{etype} for index {index} while block {self.open_index} is open")
        if etype == "content_block_delta":
            dkind = view.delta.type if view.delta is not None else ""
            allowed = _DELTAS_FOR_BLOCK.get(self.block_kind)
            if allowed is not None and dkind in _KNOWN_DELTAS and dkind not in allowed:
                raise Violation("delta_kind", f"{dkind} on a {self.block_kind} block")

    def finish(self) -> None:
        """The upstream ended. Anything but a finished or failed stream is a truncation."""
        if not self.terminal:
            raise Violation("truncated", f"upstream stream ended without message_stop (in state {self.state.value})")

    def fail(self) -> None:
        """Mark the stream failed (the gateway is ending it with an ``error`` event)."""
        self.state = State.FAILED

"""The validator: every (state, event) pair is either a legal transition or a reported violation."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.wire.events import EventView
from gateway.wire.validate import KNOWN_EVENTS, State, StreamValidator, Violation

LEGAL = {
    (State.START, "message_start"): State.MESSAGE,
    (State.MESSAGE, "content_block_start"): State.BLOCK,
    (State.MESSAGE, "message_delta"): State.DELTA,
    (State.BLOCK, "content_block_delta"): State.BLOCK,
    (State.BLOCK, "content_block_stop"): State.MESSAGE,
    (State.DELTA, "message_delta"): State.DELTA,
    (State.DELTA, "message_stop"): State.DONE,
}
OPEN = (State.START, State.MESSAGE, State.BLOCK, State.DELTA)
for s in OPEN:
    LEGAL[(s, "ping")] = s
    LEGAL[(s, "error")] = State.FAILED


def view(etype: str, **fields: object) -> EventView:
    return msgspec.json.decode(msgspec.json.encode({"type": etype, **fields}), type=EventView)


def validator_in(state: State) -> StreamValidator:
    """A validator driven into `state` by a legal prefix (block 0 of kind text open in BLOCK)."""
    v = StreamValidator()
    path = {
        State.START: [],
        State.MESSAGE: [view("message_start")],
        State.BLOCK: [view("message_start"), view("content_block_start", index=0, content_block={"type": "text"})],
        State.DELTA: [view("message_start"), view("message_delta", delta={}, usage={"output_tokens": 1})],
        State.DONE: [view("message_start"), view("message_delta"), view("message_stop")],
        State.FAILED: [view("error", error={"type": "api_error", "message": "x"})],
    }[state]
    for event in path:
        v.check(event)
    assert v.state is state
    return v


def well_formed(etype: str, state: State) -> EventView:
    """The event with the fields a legal occurrence would carry in `state`."""
    if etype == "content_block_start":
        return view(etype, index=0, content_block={"type": "text"})
    if etype in ("content_block_delta", "content_block_stop"):
        return view(etype, index=0, delta={"type": "text_delta"})
    return view(etype)


@pytest.mark.parametrize(("state", "etype"), list(itertools.product(State, (*KNOWN_EVENTS, "future_event"))))
def test_every_state_event_pair(state: State, etype: str) -> None:
    v = validator_in(state)
    event = well_formed(etype, state)
    expected = LEGAL.get((state, etype))
    if expected is not None:
        v.check(event)
        assert v.state is expected
    elif etype == "future_event" and state in OPEN:
        v.check(event)  # unknown types pass through and change nothing
        assert v.state is state
    else:
        with pytest.raises(Violation) as info:
            v.check(event)
        assert info.value.rule


EVENTS = st.sampled_from([*KNOWN_EVENTS, "future_event", ""])


@given(
    st.lists(
        st.tuples(
            EVENTS,
            st.integers(-1, 3),
            st.sampled_from(["text", "thinking", "tool_use", "x"]),
            st.sampled_from(
                ["text_delta", "thinking_delta", "input_json_delta", "signature_delta", "citations_delta", "new_delta"]
            ),
        ),
        max_size=30,
    )
)
def test_random_sequences_never_crash_and_stay_consistent(seq: list[tuple[str, int, str, str]]) -> None:
    v = StreamValidator()
    for etype, index, block, delta in seq:
        event = view(etype, index=index, content_block={"type": block}, delta={"type": delta})
        before = v.state
        try:
            v.check(event)
        except Violation:
            assert (before, etype) not in LEGAL or etype.startswith("content_block")
            return
        if (before, etype) in LEGAL:
            assert v.state is LEGAL[(before, etype)]
        else:
            assert v.state is before


def test_block_indexes_must_be_dense() -> None:
    v = validator_in(State.MESSAGE)
    with pytest.raises(Violation, match="expected 0"):
        v.check(view("content_block_start", index=1, content_block={"type": "text"}))


def test_delta_must_address_the_open_block() -> None:
    v = validator_in(State.BLOCK)
    with pytest.raises(Violation) as info:
        v.check(view("content_block_delta", index=1, delta={"type": "text_delta"}))
    assert info.value.rule == "block_index"


@pytest.mark.parametrize(
    ("block", "delta", "ok"),
    [
        ("text", "text_delta", True),
        ("text", "citations_delta", True),
        ("text", "input_json_delta", False),
        ("thinking", "signature_delta", True),
        ("thinking", "text_delta", False),
        ("tool_use", "input_json_delta", True),
        ("server_tool_use", "input_json_delta", True),
        ("tool_use", "thinking_delta", False),
        ("redacted_thinking", "thinking_delta", False),
        ("web_search_tool_result", "text_delta", False),
        ("text", "future_delta", True),
        ("future_block", "text_delta", True),
    ],
)
def test_delta_kind_agrees_with_block_kind(block: str, delta: str, ok: bool) -> None:
    v = validator_in(State.MESSAGE)
    v.check(view("content_block_start", index=0, content_block={"type": block}))
    event = view("content_block_delta", index=0, delta={"type": delta})
    if ok:
        v.check(event)
    else:
        with pytest.raises(Violation) as info:
            v.check(event)
        assert info.value.rule == "delta_kind"


@pytest.mark.parametrize("state", [State.START, State.MESSAGE, State.BLOCK, State.DELTA])
def test_finish_before_message_stop_is_truncation(state: State) -> None:
    with pytest.raises(Violation) as info:
        validator_in(state).finish()
    assert info.value.rule == "truncated"


@pytest.mark.parametrize("state", [State.DONE, State.FAILED])
def test_finish_after_terminal_is_fine(state: State) -> None:
    validator_in(state).finish()


def test_full_stream() -> None:
    v = StreamValidator()
    for event in [
        view("message_start"),
        view("ping"),
        view("content_block_start", index=0, content_block={"type": "thinking"}),
        view("content_block_delta", index=0, delta={"type": "thinking_delta"}),
        view("content_block_delta", index=0, delta={"type": "signature_delta"}),
        view("content_block_stop", index=0),
        view("content_block_start", index=1, content_block={"type": "redacted_thinking"}),
        view("content_block_stop", index=1),
        view("future_event"),
        view("content_block_start", index=2, content_block={"type": "tool_use"}),
        view("content_block_delta", index=2, delta={"type": "input_json_delta"}),
        view("content_block_stop", index=2),
        view("message_delta"),
        view("message_delta"),
        view("message_stop"),
    ]:
        v.check(event)
    assert v.state is State.DONE


@pytest.mark.parametrize("etype", ["co\ntent_block_stop", "x\rdata: {}", "two words", "a" * 65, "é"])
def test_an_unknown_type_that_cannot_be_an_event_name_is_a_violation(etype: str) -> None:
    """An unknown type is carried through as the frame's ``event:`` line: a line break in it would let a
    provider write SSE lines of its own into the client's stream (found by test_fuzz)."""
    v = validator_in(State.BLOCK)
    with pytest.raises(Violation) as info:
        v.check(view(etype))
    assert info.value.rule == "event_name"


@pytest.mark.parametrize("etype", ["future_event", "vertex.event", "ns:thing-2"])
def test_an_unknown_type_that_is_a_name_passes(etype: str) -> None:
    v = validator_in(State.BLOCK)
    v.check(view(etype))
    assert v.state is State.BLOCK


def test_a_shared_delta_view_is_checked_again_once_anything_else_came_between() -> None:
    """The partial decode's cache gives a block's deltas one shared view; a repeat of it right after it passed is
    not checked again, but after any other event (which may change the state) it is."""
    start = [view("message_start"), view("content_block_start", index=0, content_block={"type": "text"})]
    delta = view("content_block_delta", index=0, delta={"type": "text_delta"})
    stop = view("content_block_stop", index=0)
    v = StreamValidator()
    assert v.check_all([*start, delta, delta, delta]) == 5
    with pytest.raises(Violation) as info:
        v.check_all([delta, stop, delta])  # the same object, now for a block that is closed
    assert info.value.at == 2
    other = StreamValidator()
    with pytest.raises(Violation) as info:
        next_block = view("content_block_start", index=1, content_block={"type": "text"})
        other.check_all([*start, delta, stop, next_block, delta])
    assert info.value.at == 5  # block 0's delta while block 1 is open
    assert StreamValidator().check_all([*start, delta, view("ping"), delta, delta]) == 6

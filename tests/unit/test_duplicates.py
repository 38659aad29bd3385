"""A request body that gives ``model``, ``stream`` or ``max_tokens`` twice at its top level is refused: msgspec
keeps the last, a provider may keep the first. The C walk (gateway/wire/_views_c.c) is tested equal to the standard
library's reference on random bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire.errors import InvalidRequest
from gateway.wire.request import check_duplicates, duplicate_key_py, parse_count_tokens, parse_messages
from tests.edits import apply_edits, byte_edits

try:
    from gateway.wire._views_c import top_level_duplicate
except ImportError:  # pragma: no cover - no compiler here
    top_level_duplicate = None  # type: ignore[assignment]

needs_c = pytest.mark.skipif(top_level_duplicate is None, reason="gateway.wire._views_c is not built")
NAMES = (b"model", b"stream", b"max_tokens")


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"haiku","max_tokens":5,"messages":[],"model":"opus"}',
        b'{"model":"haiku","max_tokens":5,"messages":[],"stream":false,"stream":true}',
        b'{"model":"haiku","max_tokens":5,"max_tokens":100000,"messages":[]}',
        b'{"model":"haiku","max_tokens":5,"messages":[],"mod\\u0065l":"opus"}',  # the same key, escaped
        b' {"model" : "haiku" ,\n"max_tokens":5,"messages":[], "model":"opus"}',
    ],
)
def test_a_field_given_twice_is_refused(body: bytes) -> None:
    with pytest.raises(InvalidRequest, match="given more than once"):
        parse_messages(body)


def test_the_same_names_nested_or_in_strings_are_fine() -> None:
    body = json.dumps(
        {
            "model": "haiku",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": 'say "model" and "stream"'}],
            "tools": [{"name": "task", "input_schema": {"properties": {"model": {}, "stream": {}}}}],
            "metadata": {"model": "x", "max_tokens": 1},
        }
    ).encode()
    assert parse_messages(body).model == "haiku"
    assert parse_count_tokens(b'{"model":"m","messages":[],"x":{"model":1}}').model == "m"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\ {}[],:m', max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["model", "a", "stream"]), inner),
    max_leaves=10,
)


def build(pairs: list[tuple[str, Any]]) -> bytes:
    return ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}").encode()


@needs_c
@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["model", "stream", "max_tokens", "a", "mod\u0065l"]), JSON), max_size=6),
    byte_edits(b'{}[]",:\\ m', reach=120, most=2),
)
def test_the_c_walk_equals_the_reference(pairs: list[tuple[str, Any]], edits: list[tuple[int, str, int]]) -> None:
    body = apply_edits(build(pairs), edits)
    found = top_level_duplicate(body, NAMES)
    if found == b"\\":
        return  # an escaped key: the caller asks the reference
    reference = duplicate_key_py(body)
    if reference is not None:
        assert found == reference, body
    elif found is not None:
        # the C walk may name a duplicate in a body the reference cannot decode at all; msgspec refuses those
        with pytest.raises(ValueError):
            json.loads(body)


def test_check_duplicates_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.wire import request

    monkeypatch.setattr(request, "_top_level_duplicate", None)
    with pytest.raises(InvalidRequest):
        check_duplicates(b'{"model":"a","model":"b"}')
    check_duplicates(b'{"model":"a","x":{"model":"b"}}')

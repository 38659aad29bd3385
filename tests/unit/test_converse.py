"""Messages <-> Bedrock Converse: request translation, response translation, and the stream transcoder.

Streams are checked three ways: the frames are canonical SSE (``split_canonical``, compact raw-UTF-8
JSON whose ``type`` is the event name), the project's ``StreamValidator`` accepts the sequence, and the
real SDK accumulator folds the events (validated as ``RawMessageStreamEvent``) into the expected Message.
Converse-side shapes (fixtures and ``to_converse`` output) are validated against botocore's model.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any, cast

import botocore.loaders
import botocore.model
import botocore.validate
import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters._converse import ConverseTranscoder, ConverseUnsupported, from_converse_response, to_converse
from gateway.wire.events import decode_views
from gateway.wire.sse import split_canonical
from gateway.wire.validate import StreamValidator

FIXTURES = Path(__file__).parent.parent / "fixtures" / "converse"
MODEL = "claude-sonnet-4-5"
MSG_ID = "msg_bdrk_01XyZ"

_SERVICE = botocore.model.ServiceModel(
    botocore.loaders.Loader().load_service_model("bedrock-runtime", "service-2"), "bedrock-runtime"
)
_STREAM_OUTPUT = cast(botocore.model.StructureShape, _SERVICE.shape_for("ConverseStreamOutput"))
_EVENT_ADAPTER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)


# --- helpers ------------------------------------------------------------------------------------------


def botocore_errors(value: Any, shape_name: str) -> str:
    shape = _STREAM_OUTPUT.members.get(shape_name) or _SERVICE.shape_for(shape_name)  # an event, or any shape
    report = botocore.validate.ParamValidator().validate(value, shape)
    return report.generate_report() if report.has_errors() else ""


def load(name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return items


def transcode(items: list[dict[str, Any]], *, close: bool = True) -> bytes:
    t = ConverseTranscoder(model=MODEL, message_id=MSG_ID)
    out = b""
    for item in items:
        if "exception" in item:
            out += t.exception(item["exception"], item["payload"])
        else:
            out += t.feed(item["event"], item["payload"])
    return out + t.close() if close else out


def frames(raw: bytes) -> list[dict[str, Any]]:
    """Parse canonical frames strictly; every frame's data is compact JSON with raw UTF-8."""
    if not raw:
        return []
    split = split_canonical(raw)
    assert split is not None, raw
    out = []
    for part in raw.split(b"\n\n")[:-1]:
        event_line, data_line = part.split(b"\n")
        data = json.loads(data_line[6:])
        assert event_line == b"event: " + data["type"].encode()
        assert data_line[6:] == json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        out.append(data)
    return out


def validate(raw: bytes) -> list[dict[str, Any]]:
    """The frames, after the project's validator accepted the whole sequence (ending at its terminal event)."""
    split = split_canonical(raw)
    assert split is not None
    _, array, n = split
    validator = StreamValidator()
    assert validator.check_all(decode_views([], array)) == n
    validator.finish()
    return frames(raw)


def accumulate(events: list[dict[str, Any]]) -> Message:
    snapshot: Any = None
    json_bufs: dict[int, bytes] = {}
    for data in events:
        if data["type"] == "error":
            break
        event = _EVENT_ADAPTER.validate_python(data)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    return Message.model_validate(snapshot.model_dump())


def ev(event: str, **payload: Any) -> dict[str, Any]:
    return {"event": event, "payload": payload}


def delta(i: int, value: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return ev("contentBlockDelta", contentBlockIndex=i, delta=value, **extra)


def text(i: int, value: str) -> dict[str, Any]:
    return delta(i, {"text": value})


def stop(i: int) -> dict[str, Any]:
    return ev("contentBlockStop", contentBlockIndex=i)


START = ev("messageStart", role="assistant")
END_TURN = ev("messageStop", stopReason="end_turn")
META = ev("metadata", usage={"inputTokens": 5, "outputTokens": 7, "totalTokens": 12}, metrics={"latencyMs": 1})


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def block_starts(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(e["index"], e["content_block"]["type"]) for e in events if e["type"] == "content_block_start"]


# --- fixtures through the transcoder -----------------------------------------------------------------

SIG = load("reasoning")[3]["payload"]["delta"]["reasoningContent"]["signature"]
REDACTED = load("redacted")[4]["payload"]["delta"]["reasoningContent"]["redactedContent"]
EXPECTED: dict[str, dict[str, Any]] = {
    "text": {
        "content": [{"type": "text", "text": 'Hello, w\u00f6rld \U0001f600 \u2014 "quoted"\nnext line.'}],
        "stop_reason": "end_turn",
        "usage": (21, 14, 0, 0),
    },
    "tool_use": {
        "content": [
            {"type": "text", "text": "Let me check the weather."},
            {
                "type": "tool_use",
                "id": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q",
                "name": "get_weather",
                "input": {"location": "San Francisco, CA", "unit": "celsius"},
            },
        ],
        "stop_reason": "tool_use",
        "usage": (412, 87, 0, 0),
    },
    "reasoning": {
        "content": [
            {
                "type": "thinking",
                "thinking": "The user asks for 17 * 23. 17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.",
                "signature": SIG,
            },
            {"type": "text", "text": "17 \u00d7 23 = 391."},
        ],
        "stop_reason": "end_turn",
        "usage": (58, 96, 0, 0),
    },
    "redacted": {
        "content": [
            {"type": "thinking", "thinking": "Thinking about the request.", "signature": SIG},
            {"type": "redacted_thinking", "data": REDACTED},
            {"type": "text", "text": "Here is my answer."},
        ],
        "stop_reason": "end_turn",
        "usage": (90, 120, 0, 0),
    },
    "citations": {
        "content": [
            {"type": "text", "text": "According to the documents, "},
            {
                "type": "text",
                "text": "the grass is green",
                "citations": [
                    {
                        "type": "char_location",
                        "cited_text": "The grass is green. ",
                        "document_index": 0,
                        "document_title": "Nature facts",
                        "start_char_index": 0,
                        "end_char_index": 20,
                    },
                    {
                        "type": "char_location",
                        "cited_text": "The sky is blue.",
                        "document_index": 0,
                        "document_title": "Nature facts",
                        "start_char_index": 20,
                        "end_char_index": 36,
                    },
                ],
            },
            {"type": "text", "text": " and "},
            {
                "type": "text",
                "text": "revenue grew 4% in Q3",
                "citations": [
                    {
                        "type": "page_location",
                        "cited_text": "Revenue grew 4% in Q3.",
                        "document_index": 1,
                        "document_title": "Annual report",
                        "start_page_number": 2,
                        "end_page_number": 3,
                    }
                ],
            },
            {"type": "text", "text": "."},
        ],
        "stop_reason": "end_turn",
        "usage": (1630, 54, 0, 0),
    },
    "metadata_cache": {
        "content": [{"type": "text", "text": "Cached answer."}],
        "stop_reason": "max_tokens",
        "usage": (9, 4, 2048, 1024),
    },
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_streams_fold_to_the_expected_message(name: str) -> None:
    events = validate(transcode(load(name)))
    assert types(events)[0] == "message_start" and types(events)[-2:] == ["message_delta", "message_stop"]
    message = accumulate(events)
    expected = EXPECTED[name]
    assert message.id == MSG_ID and message.model == MODEL and message.role == "assistant"
    assert [block.model_dump(exclude_none=True) for block in message.content] == expected["content"]
    assert message.stop_reason == expected["stop_reason"]
    assert message.stop_sequence is None
    usage = message.usage
    assert (usage.input_tokens, usage.output_tokens) == expected["usage"][:2]
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == expected["usage"][2:]


@pytest.mark.parametrize("name", [*sorted(EXPECTED), "exception"])
def test_fixtures_follow_botocore_shapes(name: str) -> None:
    for item in load(name):
        if "exception" in item:
            assert item["exception"] in _STREAM_OUTPUT.members
            assert botocore_errors(item["payload"], item["exception"]) == ""
        else:
            assert botocore_errors(item["payload"], item["event"]) == "", item


def test_fixture_frames_are_exactly_canonical() -> None:
    raw = transcode(load("text"))
    assert raw.startswith(
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_bdrk_01XyZ","type":"message",'
        b'"role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,'
        b'"usage":{"input_tokens":0,"output_tokens":0}}}\n\n'
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":""}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"Hello"}}\n\n'
    )
    assert '"text":", wörld 😀"'.encode() in raw  # UTF-8 as is, not \u-escaped
    assert raw.endswith(
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
        b'"usage":{"output_tokens":14,"input_tokens":21,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}}'
        b'\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def test_exception_fixture_is_one_error_frame_and_nothing_after() -> None:
    t = ConverseTranscoder(model=MODEL, message_id=MSG_ID)
    items = load("exception")
    raw = b"".join(t.feed(i["event"], i["payload"]) for i in items[:-1])
    raw += t.exception(items[-1]["exception"], items[-1]["payload"])
    events = validate(raw)
    assert types(events) == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert events[-1]["error"] == {
        "type": "rate_limit_error",
        "message": "Too many tokens, please wait before trying again.",
    }
    assert t.feed("contentBlockDelta", items[1]["payload"]) == b""
    assert t.feed("messageStop", {"stopReason": "end_turn"}) == b""
    assert t.exception("internalServerException", {"message": "again"}) == b""
    assert t.close() == b""


# --- transcoder rules ----------------------------------------------------------------------------------


def test_indexes_are_dense_whatever_converse_uses() -> None:
    tool_start = ev("contentBlockStart", contentBlockIndex=7, start={"toolUse": {"toolUseId": "t1", "name": "f"}})
    items = [
        START,
        text(3, "a"),
        stop(3),
        tool_start,
        delta(7, {"toolUse": {"input": "{}"}}),
        stop(7),
        text(8, "b"),
        stop(8),
        END_TURN,
        META,
    ]
    events = validate(transcode(items))
    assert block_starts(events) == [(0, "text"), (1, "tool_use"), (2, "text")]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2]


def test_a_delta_for_a_new_index_closes_the_open_block_first() -> None:
    items = [START, text(0, "a"), text(1, "b"), text(0, "c"), END_TURN, META]  # no stops; index 0 reused
    events = validate(transcode(items))
    assert block_starts(events) == [(0, "text"), (1, "text"), (2, "text")]
    assert [b.text for b in accumulate(events).content if b.type == "text"] == ["a", "b", "c"]


def test_one_citations_delta_per_citation() -> None:
    events = validate(transcode(load("citations")))
    citation_deltas = [
        e for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "citations_delta"
    ]
    assert len(citation_deltas) == 3
    assert all(
        set(e["delta"]) == {"type", "citation"} and isinstance(e["delta"]["citation"], dict) for e in citation_deltas
    )
    assert [e["index"] for e in citation_deltas] == [1, 1, 3]


def test_a_citation_without_text_opens_a_text_block() -> None:
    citation = {
        "sourceContent": [{"text": "x"}],
        "location": {"documentChunk": {"documentIndex": 2, "start": 1, "end": 3}},
    }
    items = [START, delta(0, {"citation": citation}), stop(0), END_TURN, META]
    (block,) = accumulate(validate(transcode(items))).content
    assert block.type == "text" and block.text == ""
    assert block.citations is not None
    assert block.citations[0].model_dump(exclude_none=True) == {
        "type": "content_block_location",
        "cited_text": "x",
        "document_index": 2,
        "start_block_index": 1,
        "end_block_index": 3,
    }


@pytest.mark.parametrize(
    ("citation", "expected"),
    [
        (
            {
                "title": "Result",
                "source": "https://example.com/a",
                "sourceContent": [{"text": "one "}, {"text": "two"}],
                "location": {"searchResultLocation": {"searchResultIndex": 1, "start": 0, "end": 2}},
            },
            {
                "type": "search_result_location",
                "cited_text": "one two",
                "search_result_index": 1,
                "source": "https://example.com/a",
                "title": "Result",
                "start_block_index": 0,
                "end_block_index": 2,
            },
        ),
        (
            {
                "title": "Page",
                "sourceContent": [{"text": "quoted"}],
                "location": {"web": {"url": "https://example.com/p", "domain": "example.com"}},
            },
            {
                "type": "web_search_result_location",
                "cited_text": "quoted",
                "url": "https://example.com/p",
                "title": "Page",
                "encrypted_index": "",
            },
        ),
    ],
)
def test_other_citation_locations(citation: dict[str, Any], expected: dict[str, Any]) -> None:
    assert botocore_errors({"contentBlockIndex": 0, "delta": {"citation": citation}}, "contentBlockDelta") == ""
    items = [START, text(0, "t"), delta(0, {"citation": citation})]
    events = validate(transcode([*items, stop(0), END_TURN, META]))
    assert events[3]["delta"] == {"type": "citations_delta", "citation": expected}
    accumulate(events)  # the SDK accepts it


def test_unknown_citation_location_is_ignored() -> None:
    future = {"sourceContent": [{"text": "x"}], "location": {"hologram": {"start": 1}}}
    items = [START, text(0, "t"), delta(0, {"citation": future})]
    events = validate(transcode([*items, stop(0), END_TURN, META]))
    assert "citations_delta" not in [e.get("delta", {}).get("type") for e in events]


def test_signature_is_byte_exact_sent_once_after_the_last_thinking_delta() -> None:
    signature = 'Eq8+/=\u00e9\u2028\\"x' + "A" * 300
    items = [
        START,
        delta(0, {"reasoningContent": {"text": "a"}}),
        delta(0, {"reasoningContent": {"signature": signature[:100]}}),
        delta(0, {"reasoningContent": {"text": "b"}}),
        delta(0, {"reasoningContent": {"signature": signature[100:]}}),
        stop(0),
        END_TURN,
        META,
    ]
    events = validate(transcode(items))
    kinds = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert kinds == ["thinking_delta", "thinking_delta", "signature_delta"]
    assert events[4]["delta"]["signature"] == signature and events[5]["type"] == "content_block_stop"
    (block,) = accumulate(events).content
    assert block.type == "thinking" and block.thinking == "ab" and block.signature == signature


def test_redacted_content_is_its_own_block_closing_the_open_thinking_block() -> None:
    blob = base64.b64encode(b"\x00secret\xff").decode()
    items = [
        START,
        delta(0, {"reasoningContent": {"text": "hm"}}),
        delta(0, {"reasoningContent": {"signature": "sig"}}),
        delta(0, {"reasoningContent": {"redactedContent": blob}}),
        delta(0, {"reasoningContent": {"text": "more"}}),
        stop(0),
        END_TURN,
        META,
    ]
    events = validate(transcode(items))
    assert block_starts(events) == [(0, "thinking"), (1, "redacted_thinking"), (2, "thinking")]
    assert events[4] == {"type": "content_block_stop", "index": 0}
    assert events[5]["content_block"] == {"type": "redacted_thinking", "data": blob}
    assert events[6] == {"type": "content_block_stop", "index": 1}
    content = accumulate(events).content
    assert [b.type for b in content] == ["thinking", "redacted_thinking", "thinking"]


def test_redacted_content_as_bytes_is_base64_encoded() -> None:
    items = [
        START,
        delta(0, {"reasoningContent": {"redactedContent": b"\x01\x02"}}),
    ]
    events = validate(transcode([*items, stop(0), END_TURN, META]))
    assert events[1]["content_block"]["data"] == "AQI="


def test_server_tool_use_start() -> None:
    start = {"toolUse": {"toolUseId": "srv_1", "name": "web_search", "type": "server_tool_use"}}
    assert botocore_errors({"contentBlockIndex": 0, "start": start}, "contentBlockStart") == ""
    items = [START, ev("contentBlockStart", contentBlockIndex=0, start=start)]
    items.append(delta(0, {"toolUse": {"input": '{"query":"x"}'}}))
    events = validate(transcode([*items, stop(0), END_TURN, META]))
    assert events[1]["content_block"] == {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}}
    assert events[2]["delta"] == {"type": "input_json_delta", "partial_json": '{"query":"x"}'}


def test_blocks_messages_cannot_carry_are_skipped_whole() -> None:
    items = [
        START,
        text(0, "a"),
        ev("contentBlockStart", contentBlockIndex=1, start={"toolResult": {"toolUseId": "t", "status": "success"}}),
        delta(1, {"toolResult": [{"text": "result"}]}),
        stop(1),
        ev("contentBlockStart", contentBlockIndex=2, start={"image": {"format": "png"}}),
        delta(2, {"image": {"source": {"bytes": "AAAA"}}}),
        stop(2),
        text(3, "b"),
        stop(3),
        END_TURN,
        META,
    ]
    for item in items:
        assert botocore_errors(item["payload"], item["event"]) == ""
    events = validate(transcode(items))
    assert block_starts(events) == [(0, "text"), (1, "text")]


def test_tool_input_delta_without_a_start_is_ignored() -> None:
    items = [START, delta(0, {"toolUse": {"input": "{}"}}), END_TURN, META]
    assert block_starts(validate(transcode(items))) == []


@pytest.mark.parametrize(
    ("converse", "anthropic"),
    [
        ("end_turn", "end_turn"),
        ("tool_use", "tool_use"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("model_context_window_exceeded", "model_context_window_exceeded"),
        ("guardrail_intervened", "refusal"),
        ("content_filtered", "refusal"),
        ("malformed_model_output", "end_turn"),
        ("malformed_tool_use", "end_turn"),
        ("some_future_reason", "end_turn"),
    ],
)
def test_stop_reason_mapping(converse: str, anthropic: str) -> None:
    events = validate(transcode([START, text(0, "x"), stop(0), ev("messageStop", stopReason=converse), META]))
    assert events[-2]["delta"] == {"stop_reason": anthropic, "stop_sequence": None}
    assert accumulate(events).stop_reason == anthropic  # a value the SDK's StopReason literal accepts
    response = {"output": {"message": {"role": "assistant", "content": []}}, "stopReason": converse}
    assert from_converse_response(response, model=MODEL, message_id=MSG_ID)["stop_reason"] == anthropic


def test_every_botocore_stop_reason_is_mapped_into_anthropics_set() -> None:
    anthropic_set = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
    anthropic_set.add("model_context_window_exceeded")
    for reason in cast(botocore.model.StringShape, _SERVICE.shape_for("StopReason")).enum:
        events = frames(transcode([START, ev("messageStop", stopReason=reason), META]))
        assert events[-2]["delta"]["stop_reason"] in anthropic_set


@pytest.mark.parametrize(
    "fields", [{"stop_sequence": "</answer>"}, {"delta": {"stop_sequence": "</answer>"}}], ids=["top", "delta"]
)
def test_stop_sequence_from_additional_response_fields(fields: dict[str, Any]) -> None:
    message_stop = ev("messageStop", stopReason="stop_sequence", additionalModelResponseFields=fields)
    assert botocore_errors(message_stop["payload"], "messageStop") == ""
    events = validate(transcode([START, text(0, "x"), stop(0), message_stop, META]))
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "</answer>"}
    assert accumulate(events).stop_sequence == "</answer>"


def test_metadata_before_message_stop_is_held() -> None:
    t = ConverseTranscoder(model=MODEL, message_id=MSG_ID)
    raw = t.feed("messageStart", {"role": "assistant"}) + t.feed("contentBlockDelta", text(0, "x")["payload"])
    assert t.feed("metadata", META["payload"]) == b""
    raw += t.feed("messageStop", {"stopReason": "end_turn"})
    events = validate(raw)
    assert types(events)[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[-2]["usage"]["output_tokens"] == 7
    assert t.close() == b""


def test_close_after_message_stop_without_metadata_is_an_error_not_message_stop() -> None:
    events = validate(transcode([START, text(0, "x"), stop(0), END_TURN]))
    assert types(events)[-1] == "error" and "message_stop" not in types(events)
    assert events[-1]["error"]["type"] == "api_error"
    assert "ended early" in events[-1]["error"]["message"]


@pytest.mark.parametrize(
    "items",
    [[], [START], [START, text(0, "cut mid-blo")], [START, text(0, "x"), stop(0)], [START, META]],
    ids=["nothing", "start-only", "mid-block", "between-blocks", "metadata-without-stop"],
)
def test_every_early_end_is_one_error_frame(items: list[dict[str, Any]]) -> None:
    events = validate(transcode(items))
    assert types(events)[-1] == "error"
    assert "message_stop" not in types(events) and "message_delta" not in types(events)


def test_split_metadata_usage_missing_fields_are_zero() -> None:
    meta = ev("metadata", usage={"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}, metrics={"latencyMs": 9})
    events = validate(transcode([START, text(0, "x"), END_TURN, meta]))
    assert events[-2]["usage"] == {
        "output_tokens": 2,
        "input_tokens": 3,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }


def test_input_tokens_that_include_cache_traffic_are_made_exclusive() -> None:
    usage = {"inputTokens": 3010, "outputTokens": 5, "totalTokens": 3015, "cacheReadInputTokens": 3000}
    events = frames(transcode([START, END_TURN, ev("metadata", usage=usage, metrics={"latencyMs": 1})]))
    assert events[-2]["usage"]["input_tokens"] == 10 and events[-2]["usage"]["cache_read_input_tokens"] == 3000


@pytest.mark.parametrize(
    ("name", "error_type"),
    [
        ("throttlingException", "rate_limit_error"),
        ("serviceUnavailableException", "overloaded_error"),
        ("validationException", "invalid_request_error"),
        ("internalServerException", "api_error"),
        ("modelStreamErrorException", "api_error"),
        ("modelTimeoutException", "timeout_error"),
        ("someNewException", "api_error"),
    ],
)
def test_exception_mapping(name: str, error_type: str) -> None:
    t = ConverseTranscoder(model=MODEL, message_id=MSG_ID)
    head = t.feed("messageStart", {"role": "assistant"}) + t.feed("contentBlockDelta", text(0, "x")["payload"])
    tail = t.exception(name, {"message": "upstream said no"})
    assert frames(tail) == [{"type": "error", "error": {"type": error_type, "message": "upstream said no"}}]
    validate(head + tail)
    assert t.feed("contentBlockStop", {"contentBlockIndex": 0}) == b"" and t.close() == b""


def test_unknown_events_and_fields_are_ignored() -> None:
    items = [
        ev("messageStart", role="assistant", p="abcdefgh"),
        ev("somethingNew", x=1),
        delta(0, {"text": "a"}, p="abc"),
        delta(0, {"hologram": {"x": 1}}),
        stop(0),
        END_TURN,
        META,
        ev("metadata", usage={"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}),
    ]
    events = validate(transcode(items))
    assert accumulate(events).content[0].model_dump(exclude_none=True) == {"type": "text", "text": "a"}


def test_events_before_message_start_get_one_synthesized() -> None:
    events = validate(transcode([text(0, "x"), START, stop(0), END_TURN, META]))
    assert types(events).count("message_start") == 1 and types(events)[0] == "message_start"


# Any sequence of plausible Converse events gives a stream the validator accepts, closed by close().
_INDEX = st.integers(0, 3)
_DELTAS = st.sampled_from(
    [
        {"reasoningContent": {"text": "t"}},
        {"reasoningContent": {"signature": "s"}},
        {"reasoningContent": {"redactedContent": "AA=="}},
        {"toolUse": {"input": "{}"}},
        {"citation": {"location": {"documentChar": {}}}},
        {"image": {}},
    ]
)
_STARTS = st.sampled_from([{"toolUse": {"toolUseId": "t", "name": "n"}}, {"image": {"format": "png"}}])
_EVENT = st.one_of(
    st.builds(text, _INDEX, st.text(max_size=5)),
    st.builds(delta, _INDEX, _DELTAS),
    st.builds(lambda i, start: ev("contentBlockStart", contentBlockIndex=i, start=start), _INDEX, _STARTS),
    st.builds(stop, _INDEX),
    st.sampled_from(
        [
            START,
            META,
            END_TURN,
            ev("messageStop", stopReason="content_filtered"),
            {"exception": "throttlingException", "payload": {"message": "slow down"}},
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_EVENT, max_size=25))
def test_any_event_sequence_gives_a_valid_stream(items: list[dict[str, Any]]) -> None:
    events = validate(transcode(items))
    assert types(events)[-1] in ("message_stop", "error")
    assert types(events).count("message_start") == (types(events)[0] == "message_start")


# --- request translation ---------------------------------------------------------------------------


def conv(body: dict[str, Any], betas: list[str] | None = None) -> dict[str, Any]:
    """``to_converse`` output, checked against botocore's ConverseStreamRequest and ConverseRequest."""
    original = copy.deepcopy(body)
    out = to_converse(body, betas=betas)
    assert body == original  # the input is not mutated
    json.dumps(out)  # JSON-serialisable
    assert "modelId" not in out
    assert botocore_errors({"modelId": "m", **out}, "ConverseStreamRequest") == ""
    assert botocore_errors({"modelId": "m", **out}, "ConverseRequest") == ""
    return out


def req(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1024, "messages": list(messages), **extra}


def user(*content: Any) -> dict[str, Any]:
    """A user turn: one string stays a string; otherwise strings become text blocks."""
    if len(content) == 1 and isinstance(content[0], str):
        return {"role": "user", "content": content[0]}
    return {"role": "user", "content": [{"type": "text", "text": c} if isinstance(c, str) else c for c in content]}


def assistant(*content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": list(content)}


EPHEMERAL = {"type": "ephemeral"}
CACHE = {"cachePoint": {"type": "default"}}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()


def test_minimal_request() -> None:
    assert conv(req(user("Hello"), stream=True)) == {
        "messages": [{"role": "user", "content": [{"text": "Hello"}]}],
        "inferenceConfig": {"maxTokens": 1024},
    }


def test_system_string_and_blocks_with_cache_points() -> None:
    assert conv(req(user("q"), system="Be brief."))["system"] == [{"text": "Be brief."}]
    system = [
        {"type": "text", "text": "Long shared context.", "cache_control": EPHEMERAL},
        {"type": "text", "text": "Tail.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        {"type": "text", "text": "Uncached."},
    ]
    assert conv(req(user("q"), system=system))["system"] == [
        {"text": "Long shared context."},
        CACHE,
        {"text": "Tail."},
        {"cachePoint": {"type": "default", "ttl": "1h"}},
        {"text": "Uncached."},
    ]


def test_consecutive_turns_of_one_role_are_merged() -> None:
    out = conv(req(user("a"), user("b"), assistant({"type": "text", "text": "c"})))
    assert out["messages"] == [
        {"role": "user", "content": [{"text": "a"}, {"text": "b"}]},
        {"role": "assistant", "content": [{"text": "c"}]},
    ]


def test_cache_control_on_blocks_and_top_level() -> None:
    out = conv(req(user({"type": "text", "text": "a", "cache_control": EPHEMERAL}, {"type": "text", "text": "b"})))
    assert out["messages"][0]["content"] == [{"text": "a"}, CACHE, {"text": "b"}]
    auto = conv(req(user("a"), cache_control={"type": "ephemeral", "ttl": "5m"}))
    assert auto["messages"][0]["content"] == [{"text": "a"}, {"cachePoint": {"type": "default", "ttl": "5m"}}]
    already = conv(req(user({"type": "text", "text": "a", "cache_control": EPHEMERAL}), cache_control=EPHEMERAL))
    assert already["messages"][0]["content"] == [{"text": "a"}, CACHE]


@pytest.mark.parametrize("media", ["image/jpeg", "image/png", "image/gif", "image/webp"])
def test_image(media: str) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": media, "data": PNG}}
    out = conv(req(user(image, "What is this?")))
    assert out["messages"][0]["content"] == [
        {"image": {"format": media.split("/")[1], "source": {"bytes": PNG}}},
        {"text": "What is this?"},
    ]


def test_documents_with_citations_context_and_names() -> None:
    pdf = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
        "title": "Q3 report.pdf (final) / v2!",
        "context": "Internal numbers",
        "citations": {"enabled": True},
        "cache_control": EPHEMERAL,
    }
    txt = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "The grass is green."}}
    chunks = {
        "type": "document",
        "source": {"type": "content", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        "title": "Q3 report.pdf (final) / v2!",
        "citations": {"enabled": False},
    }
    content = conv(req(user(pdf, txt, chunks, "Summarise")))["messages"][0]["content"]
    assert content == [
        {
            "document": {
                "format": "pdf",
                "source": {"bytes": PDF},
                "name": "Q3 report pdf (final) v2",
                "context": "Internal numbers",
                "citations": {"enabled": True},
            }
        },
        CACHE,
        {"document": {"format": "txt", "source": {"text": "The grass is green."}, "name": "document-2"}},
        {
            "document": {
                "source": {"content": [{"text": "one"}, {"text": "two"}]},
                "name": "Q3 report pdf (final) v2 (2)",
            }
        },
        {"text": "Summarise"},
    ]


def test_document_string_content_and_nested_cache_control() -> None:
    doc = {
        "type": "document",
        "source": {"type": "content", "content": [{"type": "text", "text": "x", "cache_control": EPHEMERAL}]},
    }
    assert conv(req(user(doc)))["messages"][0]["content"] == [
        {"document": {"source": {"content": [{"text": "x"}]}, "name": "document-1"}},
        CACHE,
    ]


def test_search_result() -> None:
    block = {
        "type": "search_result",
        "source": "https://example.com/a",
        "title": "A",
        "content": [{"type": "text", "text": "alpha"}, {"type": "text", "text": "beta"}],
        "citations": {"enabled": True},
    }
    assert conv(req(user(block)))["messages"][0]["content"] == [
        {
            "searchResult": {
                "source": "https://example.com/a",
                "title": "A",
                "content": [{"text": "alpha"}, {"text": "beta"}],
                "citations": {"enabled": True},
            }
        }
    ]


WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        ({"type": "auto"}, {"auto": {}}),
        ({"type": "any", "disable_parallel_tool_use": False}, {"any": {}}),
        ({"type": "tool", "name": "get_weather"}, {"tool": {"name": "get_weather"}}),
    ],
)
def test_tools_and_tool_choice(choice: dict[str, Any] | None, expected: dict[str, Any] | None) -> None:
    tools = [WEATHER, {**WEATHER, "name": "other", "type": "custom", "strict": True, "cache_control": EPHEMERAL}]
    out = conv(req(user("q"), tools=tools, tool_choice=choice))
    assert out["toolConfig"]["tools"] == [
        {
            "toolSpec": {
                "name": "get_weather",
                "inputSchema": {"json": WEATHER["input_schema"]},
                "description": "Weather for a city",
            }
        },
        {
            "toolSpec": {
                "name": "other",
                "inputSchema": {"json": WEATHER["input_schema"]},
                "description": "Weather for a city",
                "strict": True,
            }
        },
        CACHE,
    ]
    assert out["toolConfig"].get("toolChoice") == expected


def test_tool_choice_auto_without_tools_is_dropped() -> None:
    assert "toolConfig" not in conv(req(user("q"), tool_choice={"type": "auto"}))


def test_tool_use_and_tool_result_history() -> None:
    body = req(
        user("Weather in Paris?"),
        assistant(
            {"type": "text", "text": "Checking."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris"},
                "caller": {"type": "direct"},
            },
        ),
        user(
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C", "is_error": False},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "is_error": True,
                "content": [{"type": "text", "text": "boom"}],
            },
            {
                "type": "tool_result",
                "tool_use_id": "toolu_3",
                "content": [
                    {"type": "text", "text": "see image", "cache_control": EPHEMERAL},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                ],
            },
            {"type": "tool_result", "tool_use_id": "toolu_4", "cache_control": EPHEMERAL},
        ),
        tools=[WEATHER],
    )
    messages = conv(body)["messages"]
    assert messages[1]["content"] == [
        {"text": "Checking."},
        {"toolUse": {"toolUseId": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}},
    ]
    assert messages[2]["content"] == [
        {"toolResult": {"toolUseId": "toolu_1", "content": [{"text": "18C"}]}},
        {"toolResult": {"toolUseId": "toolu_2", "content": [{"text": "boom"}], "status": "error"}},
        {
            "toolResult": {
                "toolUseId": "toolu_3",
                "content": [{"text": "see image"}, {"image": {"format": "png", "source": {"bytes": PNG}}}],
            }
        },
        CACHE,
        {"toolResult": {"toolUseId": "toolu_4", "content": []}},
        CACHE,
    ]


def test_tool_result_with_document_and_search_result() -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [
            {"type": "search_result", "source": "s", "title": "t", "content": [{"type": "text", "text": "x"}]},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}, "title": "D"},
        ],
    }
    (block,) = conv(req(user(result), tools=[WEATHER]))["messages"][0]["content"]
    assert block["toolResult"]["content"] == [
        {"searchResult": {"source": "s", "title": "t", "content": [{"text": "x"}]}},
        {"document": {"format": "txt", "source": {"text": "d"}, "name": "D"}},
    ]


def test_thinking_and_redacted_thinking_in_history() -> None:
    body = req(
        user("q"),
        assistant(
            {"type": "thinking", "thinking": "Let me think.", "signature": SIG},
            {"type": "redacted_thinking", "data": REDACTED},
            {"type": "text", "text": "Answer."},
        ),
        user("next"),
        thinking={"type": "enabled", "budget_tokens": 2048},
    )
    out = conv(body)
    assert out["messages"][1]["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "Let me think.", "signature": SIG}}},
        {"reasoningContent": {"redactedContent": REDACTED}},
        {"text": "Answer."},
    ]
    assert out["additionalModelRequestFields"] == {"thinking": {"type": "enabled", "budget_tokens": 2048}}


def test_cited_text_in_history_becomes_citations_content() -> None:
    char = {
        "type": "char_location",
        "cited_text": "The grass is green.",
        "document_index": 0,
        "document_title": "Facts",
        "start_char_index": 0,
        "end_char_index": 19,
    }
    page = {"type": "page_location", "cited_text": "p", "document_index": 1, "document_title": None}
    page |= {"start_page_number": 2, "end_page_number": 3}
    search = {"type": "search_result_location", "cited_text": "s", "search_result_index": 0, "source": "src"}
    search |= {"title": "T", "start_block_index": 0, "end_block_index": 1}
    block = {"type": "text", "text": "Grass is green.", "citations": [char, page, search]}
    (converted,) = conv(req(user("q"), assistant(block)))["messages"][1]["content"]
    assert converted == {
        "citationsContent": {
            "content": [{"text": "Grass is green."}],
            "citations": [
                {
                    "location": {"documentChar": {"documentIndex": 0, "start": 0, "end": 19}},
                    "title": "Facts",
                    "sourceContent": [{"text": "The grass is green."}],
                },
                {
                    "location": {"documentPage": {"documentIndex": 1, "start": 2, "end": 3}},
                    "sourceContent": [{"text": "p"}],
                },
                {
                    "location": {"searchResultLocation": {"searchResultIndex": 0, "start": 0, "end": 1}},
                    "title": "T",
                    "source": "src",
                    "sourceContent": [{"text": "s"}],
                },
            ],
        }
    }


def test_inference_parameters_betas_and_metadata() -> None:
    body = req(
        user("q"),
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        stop_sequences=["</answer>", "STOP"],
        metadata={"user_id": "user-1234@example.com"},
        service_tier="auto",
        stream=False,
    )
    out = conv(body, betas=["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"])
    assert out["inferenceConfig"] == {
        "maxTokens": 1024,
        "temperature": 0.2,
        "topP": 0.9,
        "stopSequences": ["</answer>", "STOP"],
    }
    assert out["additionalModelRequestFields"] == {
        "top_k": 40,
        "anthropic_beta": ["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"],
    }
    assert out["additionalModelResponseFieldPaths"] == ["/stop_sequence", "/delta/stop_sequence"]
    assert out["requestMetadata"] == {"user_id": "user-1234@example.com"}


def test_metadata_user_id_converse_refuses_is_dropped() -> None:
    assert "requestMetadata" not in conv(req(user("q"), metadata={"user_id": "h\u00e9llo<script>"}))


def test_output_config() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    out = conv(req(user("q"), output_config={"effort": "high", "format": {"type": "json_schema", "schema": schema}}))
    assert out["outputConfig"]["effort"] == "high"
    text_format = out["outputConfig"]["textFormat"]
    assert text_format["type"] == "json_schema"
    assert json.loads(text_format["structure"]["jsonSchema"]["schema"]) == schema


def in_user(block: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [user(block)]}


def in_assistant(block: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [user("q"), assistant(block)]}


def text_block(**extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": "x", **extra}


_IMAGE_URL = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
_IMAGE_BMP = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": PNG}}
_DOC_URL = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
_DOC_FILE = {"type": "document", "source": {"type": "file", "file_id": "file_1"}}
_DOC_IMAGE = {"type": "document", "source": {"type": "content", "content": [_IMAGE_BMP]}}
_SERVER_TOOL_USE = {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}
_TOOL_REFERENCE = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "tool_reference", "tool_name": "x"}]}
_PROGRAMMATIC = {"type": "tool_use", "id": "t", "name": "n", "input": {}, "caller": {"type": "code_execution_20250825"}}
_CHAR = {"type": "char_location", "cited_text": "x", "document_index": 0, "start_char_index": 0, "end_char_index": 1}
_CITED_RESULT = {"type": "tool_result", "tool_use_id": "t", "content": [text_block(citations=[_CHAR])]}
_NO_PARALLEL = {"type": "auto", "disable_parallel_tool_use": True}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tool_choice": {"type": "none"}, "tools": [WEATHER]}, "tool_choice: type 'none'"),
        ({"tool_choice": _NO_PARALLEL, "tools": [WEATHER]}, "tool_choice.disable_parallel_tool_use"),
        ({"tool_choice": {"type": "any"}}, "tool_choice: type 'any' without tools"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"tools": [{**WEATHER, "input_examples": [{"city": "x"}]}]}, "tools[0].input_examples"),
        (in_user(_IMAGE_URL), "messages[0].content[0].source: image source type 'url'"),
        (in_user(_IMAGE_BMP), "messages[0].content[0].source.media_type: image media type 'image/bmp'"),
        (in_user(_DOC_URL), "messages[0].content[0].source: document source type 'url'"),
        (in_user(_DOC_FILE), "messages[0].content[0].source: document source type 'file'"),
        (in_user(_DOC_IMAGE), "messages[0].content[0].source.content[0].type: block type 'image' here"),
        (in_user(text_block(bogus=1)), "messages[0].content[0].bogus: this field"),
        (in_user(_CITED_RESULT), "messages[0].content[0].content[0].citations: citations on text here"),
        (in_user(_TOOL_REFERENCE), "messages[0].content[0].content[0].type: block type 'tool_reference'"),
        (in_user(text_block(cache_control={"type": "persistent"})), "messages[0].content[0].cache_control"),
        (in_user(text_block(cache_control={"type": "ephemeral", "ttl": "2h"})), "content[0].cache_control.ttl"),
        (in_assistant(_SERVER_TOOL_USE), "messages[1].content[0].type: block type 'server_tool_use'"),
        (in_assistant(_PROGRAMMATIC), "messages[1].content[0].caller"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role: role 'system'"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"system": [{"type": "image", "source": {}}]}, "system[0].type"),
        ({"container": "container_1"}, "container: this field"),
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
        ({"context_management": {"edits": []}}, "context_management"),
        ({"inference_geo": "us"}, "inference_geo"),
        ({"output_config": {"format": {"type": "regex"}}}, "output_config.format.type"),
        ({"metadata": {"user_id": "u", "tier": "gold"}}, "metadata.tier"),
    ],
)
def test_unsupported_constructs_are_rejected_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConverseUnsupported) as info:
        to_converse({**req(user("q")), **change})
    message = str(info.value)
    assert field in message and message.endswith("cannot be expressed through Bedrock Converse")


def test_tool_choice_none_message_is_exact() -> None:
    with pytest.raises(
        ConverseUnsupported, match=r"^tool_choice: type 'none' cannot be expressed through Bedrock Converse$"
    ):
        to_converse(req(user("q"), tools=[WEATHER], tool_choice={"type": "none"}))


# --- non-streaming response -------------------------------------------------------------------------


def response(*content: dict[str, Any], stop_reason: str = "end_turn", **usage: int) -> dict[str, Any]:
    resp = {
        "output": {"message": {"role": "assistant", "content": list(content)}},
        "stopReason": stop_reason,
        "usage": {"inputTokens": 10, "outputTokens": 20, "totalTokens": 30 + sum(usage.values()), **usage},
        "metrics": {"latencyMs": 100},
    }
    return resp


def message_of(resp: dict[str, Any]) -> dict[str, Any]:
    out = from_converse_response(resp, model=MODEL, message_id=MSG_ID)
    Message.model_validate(out)  # the SDK accepts it
    return out


def test_response_text_with_citations() -> None:
    cited = {
        "citationsContent": {
            "content": [{"text": "the grass "}, {"text": "is green"}],
            "citations": [
                {
                    "title": "Facts",
                    "sourceContent": [{"text": "The grass is green."}],
                    "location": {"documentChar": {"documentIndex": 0, "start": 0, "end": 19}},
                },
                {"sourceContent": [{"text": "?"}], "location": {"hologram": {}}},
            ],
        }
    }
    out = message_of(response({"text": "According to the document, "}, cited, cacheReadInputTokens=5))
    assert out["content"] == [
        {"type": "text", "text": "According to the document, "},
        {
            "type": "text",
            "text": "the grass is green",
            "citations": [
                {
                    "type": "char_location",
                    "cited_text": "The grass is green.",
                    "document_index": 0,
                    "document_title": "Facts",
                    "start_char_index": 0,
                    "end_char_index": 19,
                }
            ],
        },
    ]
    assert out["id"] == MSG_ID and out["model"] == MODEL and out["type"] == "message" and out["role"] == "assistant"
    assert out["stop_reason"] == "end_turn" and out["stop_sequence"] is None
    assert out["usage"] == {
        "output_tokens": 20,
        "input_tokens": 10,
        "cache_read_input_tokens": 5,
        "cache_creation_input_tokens": 0,
    }


def test_response_tool_use() -> None:
    tool = {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather", "input": {"city": "Paris"}}}
    out = message_of(
        response(
            {"text": "Checking."},
            tool,
            {"image": {"format": "png", "source": {"bytes": "AA=="}}},
            stop_reason="tool_use",
        )
    )
    assert out["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "tooluse_1", "name": "get_weather", "input": {"city": "Paris"}},
    ]
    assert out["stop_reason"] == "tool_use"


def test_response_reasoning() -> None:
    out = message_of(
        response(
            {"reasoningContent": {"reasoningText": {"text": "Hmm.", "signature": SIG}}},
            {"reasoningContent": {"redactedContent": REDACTED}},
            {"text": "Done."},
            stop_reason="stop_sequence",
        )
        | {"additionalModelResponseFields": {"stop_sequence": "END"}}
    )
    assert out["content"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": SIG},
        {"type": "redacted_thinking", "data": REDACTED},
        {"type": "text", "text": "Done."},
    ]
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", "END")


def test_response_fixture_shapes_follow_botocore() -> None:
    resp = response(
        {"text": "a"},
        {"reasoningContent": {"reasoningText": {"text": "Hmm.", "signature": SIG}}},
        {"toolUse": {"toolUseId": "t", "name": "n", "input": {}}},
    )
    # ConverseResponse is an output shape; ParamValidator still checks members, unions and types.
    assert botocore_errors(resp, "ConverseResponse") == ""

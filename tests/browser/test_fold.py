"""The playground's fold (``gateway/http/web/fold.js``) unit-tested in the browser against the recorded Claude API
streams in ``tests/fixtures/claude``: what it folds equals the ``Message`` the SDK's accumulator builds
from the same events, whatever the chunking and line endings; broken streams end incomplete."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningGateway
from tests.fakes.claude_api import final_message

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "claude"
INCOMPLETE = {"fake-error-midstream", "fake-cut-midstream"}
COMPLETE = sorted(p.stem for p in FIXTURES.glob("*.sse") if p.stem not in INCOMPLETE)

FOLD = """async ({chunks, titles}) => {
  const m = await import('/ui/fold.js');
  const answer = m.newAnswer();
  const parser = new m.SSEParser();
  const changes = [];
  const feed = (events) => { for (const {data} of events) changes.push(m.foldEvent(answer, JSON.parse(data))); };
  for (const chunk of chunks) feed(parser.push(chunk));
  feed(parser.finish());
  m.finish(answer);
  return {
    status: answer.status, error: answer.error, usage: answer.usage, stopReason: answer.stopReason,
    blocks: answer.blocks.map((b) => ({type: b.type, text: b.text, thinking: b.thinking, signature: b.signature,
      input: b.input, start: b.start, markers: b.markers, done: b.done, cited: m.citedText(b)})),
    citations: answer.citations,
    locations: answer.citations.map(m.citationLocation),
    sources: answer.citations.map((c) => m.citationSource(c, titles)),
    changes,
  };
}"""


@pytest.fixture
def fold_page(page: Any, ui_gateway: RunningGateway) -> Any:
    page.goto(f"{ui_gateway.url}/healthz")  # any same-origin page: the module is imported from /ui/
    return page


def fold(page: Any, text: str, chunks: list[int] | None = None, titles: list[str] | None = None) -> dict[str, Any]:
    pieces: list[str] = []
    if chunks is None:
        pieces = [text]
    else:
        at = 0
        for size in chunks:
            pieces.append(text[at : at + size])
            at += size
        pieces.append(text[at:])
    result: dict[str, Any] = page.evaluate(FOLD, {"chunks": pieces, "titles": titles or []})
    return result


def random_chunks(text: str, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes, total = [], 0
    while total < len(text):
        size = rng.choice([1, 1, 2, 3, 7, 16, 64, 300])
        sizes.append(size)
        total += size
    return sizes


def strip(citation: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in citation.items() if k not in ("blockIndex", "offset")}


@pytest.mark.parametrize("scenario", COMPLETE)
def test_fold_equals_the_sdk_final_message(scenario: str, fold_page: Any) -> None:
    text = (FIXTURES / f"{scenario}.sse").read_text("utf-8")
    got = fold(fold_page, text)
    want = final_message(scenario)
    assert got["status"] == "complete", got["error"]
    assert got["stopReason"] == want["stop_reason"]
    for field in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        assert got["usage"][field] == want["usage"][field], field
    assert len(got["blocks"]) == len(want["content"])
    for index, (block, content) in enumerate(zip(got["blocks"], want["content"], strict=True)):
        assert block["type"] == content["type"]
        assert block["done"] is True
        if content["type"] == "text":
            assert block["text"] == content["text"]
            mine = [strip(c) for c in got["citations"] if c["blockIndex"] == index]
            assert mine == content.get("citations", [])
            numbers = [i + 1 for i, c in enumerate(got["citations"]) if c["blockIndex"] == index]
            assert [m["n"] for m in block["markers"]] == numbers
            # shown: the text, its markers after its last word, then the whitespace it ends with
            cited = block["cited"]
            assert cited["head"] + cited["last"] + cited["tail"] == content["text"]
            assert cited["markers"] == numbers
            if numbers:
                assert cited["head"] + cited["last"] == content["text"].rstrip()
                assert cited["last"] == (content["text"].split() or [""])[-1]
            else:
                assert (cited["last"], cited["tail"]) == ("", "")
        elif content["type"] == "thinking":
            assert (block["thinking"], block["signature"]) == (content["thinking"], content["signature"])
        elif content["type"] in ("tool_use", "server_tool_use"):
            assert block["input"] == content["input"]
        else:
            assert {k: v for k, v in block["start"].items()} == content
    numbers = [m["n"] for b in got["blocks"] for m in b["markers"]]
    assert sorted(numbers) == list(range(1, len(got["citations"]) + 1))


@pytest.mark.parametrize("scenario", COMPLETE)
def test_fold_is_the_same_for_any_chunking_and_line_ending(scenario: str, fold_page: Any) -> None:
    text = (FIXTURES / f"{scenario}.sse").read_text("utf-8")
    whole = fold(fold_page, text)
    for seed in range(3):
        assert fold(fold_page, text, random_chunks(text, seed)) == whole
    crlf = text.replace("\n", "\r\n")
    chunked = fold(fold_page, crlf, random_chunks(crlf, 7))  # \r and \n of one line end land in different chunks
    assert chunked == whole
    assert fold(fold_page, text.replace("\n", "\r")) == whole


def expected_offsets(text: str) -> list[tuple[int, int]]:
    """(block index, length of that block's text so far) at each citations_delta, walking the events."""
    lengths: dict[int, int] = {}
    out = []
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if event["type"] == "content_block_start":
            lengths[event["index"]] = len(event["content_block"].get("text", ""))
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
            lengths[event["index"]] += len(event["delta"]["text"])
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "citations_delta":
            out.append((event["index"], lengths[event["index"]]))
    return out


def test_citation_markers_sit_where_the_citation_arrived(fold_page: Any) -> None:
    text = (FIXTURES / "fake-citations.sse").read_text("utf-8")
    got = fold(fold_page, text, titles=["Weather report"])
    want = expected_offsets(text)
    assert [(c["blockIndex"], c["offset"]) for c in got["citations"]] == want
    assert [(i, m["offset"]) for i, b in enumerate(got["blocks"]) for m in b["markers"]] == want
    for block in got["blocks"]:
        if block["markers"]:  # the API sends these citations before the text: shown after it all the same
            assert block["cited"]["head"] + block["cited"]["last"] == block["text"].rstrip()
    char = next(i for i, c in enumerate(got["citations"]) if c["type"] == "char_location")
    c = got["citations"][char]
    assert got["locations"][char] == f"characters {c['start_char_index']}\u2013{c['end_char_index']}"
    if c["document_index"] == 0:
        assert got["sources"][char]["title"] == "Weather report"  # the title the user typed wins
    web = next(i for i, c in enumerate(got["citations"]) if c["type"] == "web_search_result_location")
    assert got["locations"][web] == got["citations"][web]["url"]


def test_error_event_leaves_the_answer_incomplete(fold_page: Any) -> None:
    got = fold(fold_page, (FIXTURES / "fake-error-midstream.sse").read_text("utf-8"))
    assert got["status"] == "incomplete"
    assert got["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    assert got["blocks"][0]["text"] == "This answer will not be finished"
    assert got["blocks"][0]["done"] is False


def test_a_stream_cut_before_message_stop_is_incomplete(fold_page: Any) -> None:
    got = fold(fold_page, (FIXTURES / "fake-cut-midstream.sse").read_text("utf-8"))
    assert got["status"] == "incomplete"
    assert got["error"]["type"] == "stream_ended"


def sse(*events: dict[str, Any]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


START = {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 5, "output_tokens": 1}}}
TEXT0 = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}


@pytest.mark.parametrize(
    ("events", "error"),
    [
        (
            [START, {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}],
            "not open",
        ),
        ([START, TEXT0, TEXT0], "twice"),
        ([START, TEXT0, {"type": "message_stop"}], "still open"),
        ([START, START], "a second message_start"),
        (
            [START, TEXT0, {"type": "content_block_stop", "index": 0}, {"type": "content_block_stop", "index": 0}],
            "not open",
        ),
    ],
)
def test_out_of_order_events_make_the_answer_incomplete(
    events: list[dict[str, Any]], error: str, fold_page: Any
) -> None:
    got = fold(fold_page, sse(*events))
    assert got["status"] == "incomplete"
    assert got["error"]["type"] == "invalid_stream"
    assert error in got["error"]["message"]


def test_an_error_before_any_answer_is_a_refusal_not_an_incomplete_answer(fold_page: Any) -> None:
    """An ``error`` before ``message_start`` (a refusal: the page folds an HTTP error the same way) is "refused";
    once the answer has started, the same error leaves it "incomplete"."""
    error = {"type": "error", "error": {"type": "billing_error", "message": "key 'k' has spent $1.00 of its $1"}}
    got = fold(fold_page, sse(error))
    assert got["status"] == "refused" and got["error"] == error["error"]
    assert fold(fold_page, sse({"type": "ping"}, error))["status"] == "refused"
    assert fold(fold_page, sse(START, error))["status"] == "incomplete"
    assert fold(fold_page, sse(START, TEXT0, error))["status"] == "incomplete"


def test_no_answer_and_no_error_is_a_failure_not_an_incomplete_answer(fold_page: Any) -> None:
    """A stream that breaks or ends before ``message_start`` had no answer to be incomplete: "failed"."""
    got = fold(fold_page, sse(TEXT0))
    assert got["status"] == "failed"
    assert (
        got["error"]["type"] == "invalid_stream"
        and "content_block_start before message_start" in got["error"]["message"]
    )
    got = fold(fold_page, "")
    assert got["status"] == "failed" and got["error"] == {
        "type": "stream_ended",
        "message": "the stream ended before any answer",
    }
    assert fold(fold_page, sse(START))["status"] == "incomplete"  # started: then it is incomplete


def test_usage_overwrites_and_pings_and_unknown_events_change_nothing(fold_page: Any) -> None:
    events = [
        START,
        {"type": "ping"},
        TEXT0,
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "brand_new_event", "x": 1},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "future_delta", "y": 2}},
        {"type": "message_delta", "delta": {"stop_reason": None}, "usage": {"output_tokens": 3}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 7, "input_tokens": 6},
        },
        {"type": "message_stop"},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": "late"}},
    ]
    got = fold(fold_page, sse(*events))
    assert got["status"] == "complete"
    assert got["usage"]["output_tokens"] == 7  # the last cumulative count, not 1 + 3 + 7
    assert got["usage"]["input_tokens"] == 6
    assert got["stopReason"] == "end_turn"
    assert [b["text"] for b in got["blocks"]] == ["Hi"]
    assert {} in got["changes"]  # ping and the unknown event: nothing changed


def test_sse_parser_multiline_data_comments_and_a_last_frame_without_its_blank_line(fold_page: Any) -> None:
    result = fold_page.evaluate(
        """async () => {
          const m = await import('/ui/fold.js');
          const p = new m.SSEParser();
          const text = ': comment\\nevent: a\\ndata: {\\"x\\":\\ndata:1}\\n\\nevent:b\\ndata:2\\r\\n\\r\\ndata: 3';
          const out = [...p.push(text), ...p.finish()];
          return out;
        }"""
    )
    assert result == [{"event": "a", "data": '{"x":\n1}'}, {"event": "b", "data": "2"}]


STEPS = """async ({text}) => {
  const m = await import('/ui/fold.js');
  const answer = m.newAnswer();
  const out = [];
  for (const {data} of new m.SSEParser().push(text)) {
    m.foldEvent(answer, JSON.parse(data));
    out.push(answer.blocks.map((b) => b.type === 'text' ? {text: b.text, cited: m.citedText(b)} : null));
  }
  return out;
}"""


@pytest.mark.parametrize("scenario", ["fake-citations", "fake-citations-after"])
def test_markers_stay_at_the_end_of_a_block_as_it_grows(fold_page: Any, scenario: str) -> None:
    """After every event: each cited block shows its text whole, then all its markers so far (in arrival
    order), then its trailing whitespace — for citations before, after and between the text deltas."""
    text = (FIXTURES / f"{scenario}.sse").read_text("utf-8")
    steps = fold_page.evaluate(STEPS, {"text": text})
    grew_after_a_marker = 0
    seen: dict[int, tuple[int, str]] = {}
    for blocks in steps:
        for index, block in enumerate(blocks):
            if not block or not block["cited"]["markers"]:
                continue
            cited = block["cited"]
            assert cited["head"] + cited["last"] + cited["tail"] == block["text"]
            assert cited["head"] + cited["last"] == block["text"].rstrip()
            assert cited["tail"].strip() == ""
            before = seen.get(index)
            if before and before[0] == len(cited["markers"]) and before[1] != block["text"]:
                grew_after_a_marker += 1
            seen[index] = (len(cited["markers"]), block["text"])
    assert grew_after_a_marker  # the scenarios do grow a block that already has its marker


def test_only_citations_are_reported_as_changing_the_sources(fold_page: Any) -> None:
    text = (FIXTURES / "fake-citations.sse").read_text("utf-8")
    got = fold(fold_page, text)
    flagged = [c for c in got["changes"] if c.get("citation")]
    assert len(flagged) == len(got["citations"]) > 0
    assert all("block" in c for c in flagged)

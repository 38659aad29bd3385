"""Tests for the mock provider's answer: event shape, SDK fold, exact delta counts, real citations."""

from __future__ import annotations

import base64
import copy
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:  # the repo need not be installed for this unit test
    sys.path.insert(0, _ROOT)

from adapters._mock_answer import estimate_input_tokens, mock_events, mock_message  # noqa: E402

EVENT_TYPES = {
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
}
DELTA_FOR_BLOCK = {
    "text": {"text_delta", "citations_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
}
CITATION_FIELDS = {
    "char_location": {
        "cited_text",
        "document_index",
        "document_title",
        "start_char_index",
        "end_char_index",
        "file_id",
    },
    "page_location": {
        "cited_text",
        "document_index",
        "document_title",
        "start_page_number",
        "end_page_number",
        "file_id",
    },
    "content_block_location": {
        "cited_text",
        "document_index",
        "document_title",
        "start_block_index",
        "end_block_index",
        "file_id",
    },
    "search_result_location": {
        "cited_text",
        "search_result_index",
        "source",
        "title",
        "start_block_index",
        "end_block_index",
    },
}


# --------------------------------------------------------------------------- helpers


def user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def req(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 1024, "messages": list(messages), **extra}


def text_doc(data: str, title: str | None = None, cite: bool = True) -> dict[str, Any]:
    source = {"type": "text", "media_type": "text/plain", "data": data}
    block: dict[str, Any] = {"type": "document", "source": source}
    if title is not None:
        block["title"] = title
    if cite:
        block["citations"] = {"enabled": True}
    return block


def sdk_fold(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Accumulate with the real Anthropic SDK accumulator and dump to a plain dict."""
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in copy.deepcopy(events):
        ev: RawMessageStreamEvent = event  # type: ignore[assignment]  # accumulator accepts raw dicts
        snapshot = accumulate_event(event=ev, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return snapshot.to_dict()


def citations(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for b in message["content"] if b["type"] == "text" for c in b.get("citations", [])]


def text_deltas(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["delta"]["text"] for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    ]


def check_stream(events: list[dict[str, Any]]) -> None:
    """Canonical ordering, dense indexes, delta/block agreement, one citation per citations_delta."""
    assert all(e["type"] in EVENT_TYPES for e in events)
    assert events[0]["type"] == "message_start"
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    assert sum(e["type"] == "message_start" for e in events) == 1
    open_block: tuple[int, str] | None = None
    next_index = 0
    for e in events[1:-2]:
        if e["type"] == "content_block_start":
            assert open_block is None and e["index"] == next_index
            open_block = (e["index"], e["content_block"]["type"])
            next_index += 1
        elif e["type"] == "content_block_delta":
            assert open_block is not None and e["index"] == open_block[0]
            assert e["delta"]["type"] in DELTA_FOR_BLOCK[open_block[1]]
            if e["delta"]["type"] == "citations_delta":
                cite = e["delta"]["citation"]
                assert isinstance(cite, dict) and set(cite) - {"type"} == CITATION_FIELDS[cite["type"]]
        else:
            assert e["type"] == "content_block_stop" and open_block is not None
            assert e["index"] == open_block[0]
            open_block = None
    assert open_block is None and next_index >= 1
    final = events[-2]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"]["output_tokens"] >= 1
    json.dumps(events)  # JSON-ready


def make_pdf(pages: list[str]) -> bytes:
    """A minimal valid uncompressed PDF: one Helvetica text line per page, correct xref table."""
    n = len(pages)
    font_id = 3 + 2 * n
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {n} >>"]
    for i, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 {font_id} 0 R >> >> /Contents {4 + 2 * i} 0 R >>"
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, obj in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n{obj}\nendobj\n".encode("latin-1"))
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for off in offsets:
        out.write(f"{off:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def pdf_doc(pages: list[str], title: str | None = None) -> dict[str, Any]:
    data = base64.b64encode(make_pdf(pages)).decode()
    block: dict[str, Any] = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": data},
        "citations": {"enabled": True},
    }
    if title is not None:
        block["title"] = title
    return block


# --------------------------------------------------------------------------- plain answers


def test_plain_answer_shape_and_sdk_fold() -> None:
    body = req(user({"type": "text", "text": "What is the capital of France?"}))
    events = mock_events(body)
    check_stream(events)
    start = events[0]["message"]
    assert start["model"] == "mock:claude-test"
    assert start["id"] == "msg_mock_0001" and start["content"] == []
    assert start["stop_reason"] is None and start["stop_sequence"] is None
    assert start["usage"] == {
        "input_tokens": estimate_input_tokens(body),
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    message = mock_message(body)
    assert sdk_fold(events) == message
    assert [b["type"] for b in message["content"]] == ["text"]
    text = message["content"][0]["text"]
    assert text.startswith("This is a mock reply from messages-gateway to: What is the capital of France")
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["output_tokens"] == len(text.split())
    assert len(text_deltas(events)) == 12


@settings(max_examples=60, deadline=None)
@given(deltas=st.integers(1, 300), prompt=st.text(max_size=200))
def test_exact_delta_count(deltas: int, prompt: str) -> None:
    body = req(user({"type": "text", "text": prompt}))
    events = mock_events(body, deltas=deltas)
    check_stream(events)
    chunks = text_deltas(events)
    assert len(chunks) == deltas
    assert all(chunk.strip() for chunk in chunks)
    assert sdk_fold(events) == mock_message(body, deltas=deltas)
    assert events[-2]["usage"]["output_tokens"] == len("".join(chunks).split())


@pytest.mark.parametrize("deltas", [1, 2, 7, 12, 50, 300])
def test_exact_delta_count_string_content(deltas: int) -> None:
    body = req({"role": "user", "content": "hi"}, system="be brief")
    assert len(text_deltas(mock_events(body, deltas=deltas))) == deltas


def test_snippet_is_last_user_message_first_80_chars() -> None:
    long = "word " * 40
    body = req(
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": [{"type": "text", "text": long}]},
    )
    text = mock_message(body, deltas=1)["content"][0]["text"]
    assert "first question" not in text
    assert text.startswith("This is a mock reply from messages-gateway to: " + long.strip()[:79])


def test_deterministic_and_message_id() -> None:
    body = req(user(text_doc("One thing. Another thing.")), thinking={"type": "enabled", "budget_tokens": 2048})
    assert mock_events(body) == mock_events(copy.deepcopy(body))
    assert mock_message(body, message_id="msg_x")["id"] == "msg_x"
    assert mock_events(body, deltas=5) != mock_events(body, deltas=30)


def test_mock_model_prefix_not_doubled() -> None:
    assert mock_message(req(user({"type": "text", "text": "x"})))["model"] == "mock:claude-test"
    body = {"model": "mock:anything", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    assert mock_message(body)["model"] == "mock:anything"


# --------------------------------------------------------------------------- thinking


@pytest.mark.parametrize("thinking", [{"type": "enabled", "budget_tokens": 2048}, {"type": "adaptive"}])
def test_thinking_block_first(thinking: dict[str, Any]) -> None:
    body = req(user({"type": "text", "text": "think about it"}), thinking=thinking)
    events = mock_events(body, deltas=4)
    check_stream(events)
    message = mock_message(body, deltas=4)
    assert sdk_fold(events) == message
    assert [b["type"] for b in message["content"]] == ["thinking", "text"]
    block = message["content"][0]
    assert block["thinking"] and base64.b64decode(block["signature"])
    sig = [e for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "signature_delta"]
    assert len(sig) == 1
    # the signature delta is the last delta of the thinking block
    assert events[events.index(sig[0]) + 1] == {"type": "content_block_stop", "index": 0}
    assert len(text_deltas(events)) == 4


def test_thinking_display_omitted_has_only_signature() -> None:
    body = req(user({"type": "text", "text": "x"}), thinking={"type": "adaptive", "display": "omitted"})
    events = mock_events(body)
    check_stream(events)
    block = mock_message(body)["content"][0]
    assert block["type"] == "thinking" and block["thinking"] == "" and block["signature"]
    assert sdk_fold(events) == mock_message(body)


@pytest.mark.parametrize("thinking", [None, {"type": "disabled"}])
def test_no_thinking_unless_asked(thinking: dict[str, Any] | None) -> None:
    body = req(user({"type": "text", "text": "hi"}))
    if thinking is not None:
        body["thinking"] = thinking
    assert [b["type"] for b in mock_message(body)["content"]] == ["text"]


# --------------------------------------------------------------------------- citations


def test_char_location_citations() -> None:
    data = "Grass is green.  The sky is blue!\n\nWater is wet? Yes"
    body = req(user(text_doc(data, title="Colours"), {"type": "text", "text": "Colours?"}))
    events = mock_events(body)
    check_stream(events)
    message = mock_message(body)
    assert sdk_fold(events) == message
    cites = citations(message)
    assert 1 <= len(cites) <= 2
    for c in cites:
        assert c["type"] == "char_location"
        assert data[c["start_char_index"] : c["end_char_index"]] == c["cited_text"]
        assert c["document_index"] == 0 and c["document_title"] == "Colours" and c["file_id"] is None
    assert cites[0]["cited_text"] == "Grass is green."
    # as the API shapes a cited answer: an uncited intro, one block per cited claim (its sentence, no newline)
    # with uncited connecting blocks between them, an uncited closing; together one paragraph
    blocks = message["content"]
    assert ["citations" in b for b in blocks] == [False, *[True, False] * (len(cites) - 1), True, False]
    for block in blocks:
        assert "\n" not in block["text"]
        if "citations" in block:
            assert len(block["citations"]) == 1
            assert block["text"] == " ".join(block["citations"][0]["cited_text"].split())
    assert "".join(b["text"] for b in blocks).startswith("Here is what the sources say. Grass is green. ")


def test_citations_delta_follows_text_deltas() -> None:
    events = mock_events(req(user(text_doc("Alpha beta gamma. Delta epsilon."))))
    kinds: dict[int, list[str]] = {}
    for e in events:
        if e["type"] == "content_block_delta":
            kinds.setdefault(e["index"], []).append(e["delta"]["type"])
    cited = [k for k in kinds.values() if "citations_delta" in k]
    assert cited
    for k in cited:
        assert k[-1] == "citations_delta" and k.count("citations_delta") == 1
        assert set(k[:-1]) == {"text_delta"}


sentence_words = st.text(
    alphabet=st.sampled_from([*"abcxyzÀéßñ中文日本語😀", " ", " ", "\t", "\n", "\u00a0", "\u3000", "."]),
    min_size=1,
    max_size=30,
).filter(lambda s: any(ch.isalnum() for ch in s))


@settings(max_examples=80, deadline=None)
@given(
    sentences=st.lists(
        st.tuples(sentence_words, st.sampled_from([". ", "! ", "? ", ".\n\n", ".  \n"])),
        min_size=2,
        max_size=8,
    ),
    prefix=st.sampled_from(["", " ", "\n", "  \n\n"]),
)
def test_char_offsets_slice_to_cited_text(sentences: list[tuple[str, str]], prefix: str) -> None:
    data = prefix + "".join(words + end for words, end in sentences)
    body = req(user(text_doc(data)))
    message = mock_message(body)
    assert sdk_fold(mock_events(body)) == message
    cites = citations(message)
    assert cites
    for c in cites:
        assert data[c["start_char_index"] : c["end_char_index"]] == c["cited_text"]
        assert c["cited_text"] == c["cited_text"].strip() and c["cited_text"]


def test_pdf_page_location() -> None:
    pdf = pdf_doc(["Sentence one. Sentence two.", "Page two starts. Page two ends."], title="Report")
    body = req(user(pdf, {"type": "text", "text": "Summarise"}))
    events = mock_events(body)
    check_stream(events)
    message = mock_message(body)
    assert sdk_fold(events) == message

    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(make_pdf(["Sentence one. Sentence two.", "Page two starts. Page two ends."])))
    page_texts = [p.extract_text() for p in reader.pages]
    cites = citations(message)
    assert {c["start_page_number"] for c in cites} == {1, 2}
    for c in cites:
        assert c["type"] == "page_location" and c["document_title"] == "Report" and c["file_id"] is None
        assert c["end_page_number"] == c["start_page_number"] + 1
        assert c["cited_text"] in page_texts[c["start_page_number"] - 1]
    assert cites[0]["cited_text"] == "Sentence one."
    assert cites[-1]["cited_text"] == "Page two ends."


def test_broken_pdf_falls_back_to_plain_answer() -> None:
    block = {
        "type": "document",
        "source": {
            "type": "base64",
            "media_type": "application/pdf",
            "data": base64.b64encode(b"nope").decode(),
        },
        "citations": {"enabled": True},
    }
    events = mock_events(req(user(block)), deltas=9)
    check_stream(events)
    assert len(text_deltas(events)) == 9
    assert not citations(mock_message(req(user(block))))


def test_content_block_location() -> None:
    doc: dict[str, Any] = {
        "type": "document",
        "title": "Custom",
        "citations": {"enabled": True},
        "source": {
            "type": "content",
            "content": [
                {"type": "text", "text": "First block."},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}},
                {"type": "text", "text": "Third block."},
            ],
        },
    }
    body = req(user(doc))
    message = mock_message(body)
    assert sdk_fold(mock_events(body)) == message
    cites = citations(message)
    assert [(c["start_block_index"], c["end_block_index"], c["cited_text"]) for c in cites] == [
        (0, 1, "First block."),
        (2, 3, "Third block."),
    ]
    assert all(c["type"] == "content_block_location" and c["document_title"] == "Custom" for c in cites)

    doc["source"]["content"] = "Just a string."
    cites = citations(mock_message(body))
    assert [(c["start_block_index"], c["end_block_index"], c["cited_text"]) for c in cites] == [
        (0, 1, "Just a string.")
    ]


def search_result(source: str, texts: list[str], cite: bool = True) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "search_result",
        "source": source,
        "title": f"Title of {source}",
        "content": [{"type": "text", "text": t} for t in texts],
    }
    if cite:
        block["citations"] = {"enabled": True}
    return block


def test_search_result_indices() -> None:
    body = req(
        user(text_doc("A doc sentence.", cite=False), search_result("https://a", ["A one."], cite=False)),
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "s", "input": {}}]},
        user(
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [search_result("https://b", ["B one.", "B two."])],
            },
            search_result("https://c", ["C one."]),
        ),
    )
    message = mock_message(body)
    assert sdk_fold(mock_events(body)) == message
    cites = citations(message)
    got = [(c["search_result_index"], c["source"], c["start_block_index"], c["cited_text"]) for c in cites]
    assert got == [
        (1, "https://b", 0, "B one."),
        (1, "https://b", 1, "B two."),
        (2, "https://c", 0, "C one."),
    ]
    for c in cites:
        assert c["type"] == "search_result_location" and c["title"] == f"Title of {c['source']}"
        assert c["end_block_index"] == c["start_block_index"] + 1


def test_document_index_counts_across_messages() -> None:
    body = req(
        user(text_doc("Uncited document.", cite=False), {"type": "text", "text": "hello"}),
        {"role": "assistant", "content": "ok"},
        user(text_doc("Second doc first. Second doc last.", title="Two"), text_doc("Plain.", cite=False)),
        {"role": "assistant", "content": [{"type": "text", "text": "fine"}]},
        user(text_doc("Fourth doc sentence.")),
    )
    cites = citations(mock_message(body))
    assert [(c["document_index"], c["document_title"], c["cited_text"]) for c in cites] == [
        (1, "Two", "Second doc first."),
        (1, "Two", "Second doc last."),
        (3, None, "Fourth doc sentence."),
    ]


def test_citation_cap_and_thinking_with_citations() -> None:
    docs = [text_doc(f"Doc {i} first. Doc {i} last.") for i in range(10)]
    body = req(user(*docs), thinking={"type": "adaptive"})
    events = mock_events(body, deltas=40)
    check_stream(events)
    message = mock_message(body, deltas=40)
    assert sdk_fold(events) == message
    assert message["content"][0]["type"] == "thinking"
    cites = citations(message)
    assert len(cites) == 6
    assert [c["document_index"] for c in cites] == list(range(6))
    assert abs(len(text_deltas(events)) - 40) <= 10  # approximate with citations


def test_citations_disabled_means_plain_answer() -> None:
    body = req(user(text_doc("Some text here.", cite=False)))
    message = mock_message(body, deltas=3)
    assert not citations(message) and len(message["content"]) == 1


# --------------------------------------------------------------------------- input tokens


def test_estimate_input_tokens() -> None:
    small = req(user({"type": "text", "text": "hi"}))
    assert estimate_input_tokens(small) == 1
    text = req(user({"type": "text", "text": "x" * 400}), system="y" * 40)
    assert estimate_input_tokens(text) == 110
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 10_000}}
    assert estimate_input_tokens(req(user(image))) == estimate_input_tokens(req(user(dict(image))))
    assert 100 < estimate_input_tokens(req(user(image))) < 10_000
    assert estimate_input_tokens(req(user(pdf_doc(["One."])))) > 100
    assert estimate_input_tokens({"model": "m", "messages": []}) == 1

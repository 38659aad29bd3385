"""The playground in real headless Chromium against a real gateway: documents attached, an answer streamed
from the paced mock provider with citation markers arriving while the text still streams, hover previews,
the source panel, usage equal to the stream's, and the incomplete state of a stream that fails."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.browser.conftest import ARTIFACTS
from tests.conftest import RunningGateway, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI, final_message
from tests.unit.test_mock_answer import make_pdf

SOLAR = "Solar panels convert sunlight into electricity. They work best facing south. Output falls on cloudy days."
WIND = "Wind turbines need steady wind.\n\nOffshore farms produce more energy.\n\nTurbines are serviced every year."
REPORT_PAGES = ["The annual report covers the years 2019 to 2023.", "Revenue grew every single year."]

OBSERVE = """() => {
  window.__marks = [];
  const state = document.getElementById('state');
  const blocks = document.getElementById('blocks');
  new MutationObserver((records) => {
    for (const r of records) for (const node of r.addedNodes) {
      if (node.nodeType === 1 && node.classList.contains('cite')) {
        window.__marks.push({n: Number(node.dataset.n), state: state.dataset.state,
                             textLength: blocks.textContent.replace(/\\[\\d+\\]/g, '').length, at: performance.now()});
      }
    }
  }).observe(blocks, {childList: true, subtree: true});
}"""

MARKERS = """() => [...document.querySelectorAll('#blocks .cite')].map((b) => {
  const block = b.closest('.block');
  const range = document.createRange();
  range.setStart(block, 0);
  range.setEndBefore(b);
  const before = range.toString().replace(/\\[\\d+\\]/g, '');
  return {n: Number(b.dataset.n), before, label: b.getAttribute('aria-label')};
})"""

LAYOUT = """() => [...document.querySelectorAll("#blocks [data-type='text']")].map((block) => {
  // Measured on the page as laid out: where the block's last visible character is and where its markers
  // are (whatever elements hold them).
  const walker = document.createTreeWalker(block, NodeFilter.SHOW_TEXT,
    {acceptNode: (n) => n.parentElement.closest('.cite') ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
  let last = null;
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const i = n.data.search(/\\S\\s*$/);
    if (i >= 0) last = {node: n, i};
  }
  const box = (r) => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom});
  let char = null;
  if (last) {
    const range = document.createRange();
    range.setStart(last.node, last.i);
    range.setEnd(last.node, last.i + 1);
    const rects = range.getClientRects();
    char = box(rects[rects.length - 1]);
  }
  const marks = [...block.querySelectorAll('.cite')].map(
    (b) => ({n: Number(b.dataset.n), ...box(b.getBoundingClientRect())}));
  return {index: Number(block.dataset.index), text: block.textContent.replace(/\\[\\d+\\]/g, ''), char, marks};
})"""


LINES = """() => {
  // the lines the answer's text takes on the page (markers, raised, left out)
  const tops = new Set();
  const walker = document.createTreeWalker(document.getElementById('blocks'), NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest('.cite') || !n.data.trim()) continue;
    const range = document.createRange();
    range.selectNodeContents(n);
    for (const r of range.getClientRects()) tops.add(Math.round(r.top));
  }
  return tops.size;
}"""


def assert_markers_beside_their_claims(page: Any) -> list[dict[str, Any]]:
    """Every cited text block, as rendered: its markers on the line of its last character, the first right
    after it and each next right after the one before (no text, no line break between)."""
    blocks = [b for b in page.evaluate(LAYOUT) if b["marks"]]
    assert blocks
    for block in blocks:
        char = block["char"]
        assert char is not None, block
        previous_right = char["right"]
        for mark in block["marks"]:
            assert mark["top"] < char["bottom"] and mark["bottom"] > char["top"], ("not on its line", block)
            assert -1 <= mark["left"] - previous_right <= 6, ("not next to its sentence", block)
            previous_right = mark["right"]
    return blocks


def open_playground(page: Any, gw: RunningGateway, key: str = "ui-key") -> None:
    page.goto(f"{gw.url}/playground")
    page.fill("#key", key)
    page.dispatch_event("#key", "change")
    page.wait_for_selector("#model option[value='claude-paced']", state="attached")


def ask(page: Any, model: str, until: str = "complete") -> None:
    """Send the form as it is to ``model`` and wait for the answer's state (a CSS alternative list is fine)."""
    page.select_option("#model", model)
    page.click("#send")
    page.wait_for_selector(", ".join(f"#state[data-state='{state}']" for state in until.split("|")))


def attach_documents(page: Any, tmp_path: Any) -> None:
    page.click("#documents li button[name=remove]")  # the sample document
    page.click("#add-document")
    doc = page.locator("#documents li").nth(0)
    doc.locator("[name=title]").fill("Solar notes")
    doc.locator("[name=text]").fill(SOLAR)
    page.click("#add-document")
    doc = page.locator("#documents li").nth(1)
    doc.locator("[name=title]").fill("Wind FAQ")
    doc.locator("[name=kind]").select_option("content")
    doc.locator("[name=text]").fill(WIND)
    pdf = tmp_path / "Annual report.pdf"
    pdf.write_bytes(make_pdf(REPORT_PAGES))
    page.set_input_files("#upload", str(pdf))
    page.wait_for_selector("#documents li:nth-child(3)")
    assert page.locator("#documents li").nth(2).locator("[name=title]").input_value() == "Annual report"


def replay(gw: RunningGateway, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The same request again, outside the browser (the mock is deterministic): the events the page saw."""
    with httpx.stream("POST", f"{gw.url}/v1/messages", json=body, headers={"x-api-key": "ui-key"}) as resp:
        assert resp.status_code == 200
        text = resp.read().decode()
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_answer_streams_with_markers_in_order_hover_sources_and_usage(
    page: Any, ui_gateway: RunningGateway, tmp_path: Any
) -> None:
    open_playground(page, ui_gateway)
    page.select_option("#model", "claude-paced")
    attach_documents(page, tmp_path)
    page.fill("#question", "What do the sources say about energy?")
    page.evaluate(OBSERVE)
    with page.expect_request("**/v1/messages") as sent:
        page.click("#send")
    body = json.loads(sent.value.post_data)
    assert body["stream"] is True and body["model"] == "claude-paced"
    assert sent.value.headers["x-api-key"] == "ui-key"
    docs = [b for b in body["messages"][0]["content"] if b["type"] == "document"]
    assert [d["title"] for d in docs] == ["Solar notes", "Wind FAQ", "Annual report"]
    assert [d["source"]["type"] for d in docs] == ["text", "content", "base64"]
    assert all(d["citations"] == {"enabled": True} for d in docs)

    page.wait_for_selector("#state[data-state='complete']", timeout=30_000)
    events = replay(ui_gateway, body)
    citations = [
        e["delta"]["citation"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "citations_delta"
    ]
    assert len(citations) >= 3

    # markers arrived one by one, in order, while the answer was still streaming
    marks = page.evaluate("window.__marks")
    assert [m["n"] for m in marks] == list(range(1, len(citations) + 1))
    final_length = len(page.evaluate("document.getElementById('blocks').textContent.replace(/\\[\\d+\\]/g, '')"))
    assert marks[0]["state"] == "streaming"
    assert marks[0]["textLength"] < final_length
    assert any(m["state"] == "streaming" and m["textLength"] < final_length for m in marks[1:])
    assert len({m["at"] for m in marks}) > 1  # not all at once (a loaded machine may coalesce a few reads)

    # each marker sits right after the sentence it supports: in the text and on the page, on its line
    markers = page.evaluate(MARKERS)
    for marker, citation in zip(markers, citations, strict=True):
        assert " ".join(citation["cited_text"].split()) in " ".join(marker["before"].split())
        assert marker["before"].rstrip().endswith(" ".join(citation["cited_text"].split()))
    cited = assert_markers_beside_their_claims(page)
    assert [m["n"] for b in cited for m in b["marks"]] == list(range(1, len(citations) + 1))
    # one paragraph of claims: no line of its own for any sentence or marker
    answer = page.evaluate("document.getElementById('blocks').textContent")
    assert "\n" not in answer and answer.startswith("Here is what the sources say. ")
    lines = page.evaluate(LINES)
    assert lines < len(citations) + 2  # claims share lines (as a list, intro, claims and closing took one each)

    # hovering a marker previews its cited text and location; the source panel highlights its document
    for n, where in ((1, "characters "), (3, "block "), (len(citations), "page ")):
        page.hover(f"#blocks .cite[data-n='{n}']")
        tip = page.locator("#tip")
        tip.wait_for(state="visible")
        assert " ".join(citations[n - 1]["cited_text"].split()) in " ".join(tip.inner_text().split())
        assert where in tip.inner_text()
        assert page.locator("#sources li.active").count() == 1
    page.mouse.move(0, 0)
    page.locator("#tip").wait_for(state="hidden")

    # the source panel: the titles supplied, in order of first citation
    titles = page.locator("#sources .source-title").all_inner_texts()
    assert titles == ["Solar notes", "Wind FAQ", "Annual report"]

    # usage equal to the stream's: input and cache from message_start, output from the last message_delta
    start = events[0]["message"]["usage"]
    delta = [e for e in events if e["type"] == "message_delta"][-1]
    shown = {
        f: page.inner_text(f"[data-usage='{f}']")
        for f in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    }
    assert shown == {
        "input_tokens": str(start["input_tokens"]),
        "output_tokens": str(delta["usage"]["output_tokens"]),
        "cache_read_input_tokens": str(start["cache_read_input_tokens"]),
        "cache_creation_input_tokens": str(start["cache_creation_input_tokens"]),
    }
    assert page.inner_text("#stop-reason") == delta["delta"]["stop_reason"]
    assert page.inner_text("#ttft").endswith(" s") and page.inner_text("#total").endswith(" s")
    assert float(page.inner_text("#ttft")[:-2]) <= float(page.inner_text("#total")[:-2])
    text = "".join(
        e["delta"]["text"] for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )
    assert page.evaluate("document.getElementById('blocks').textContent.replace(/\\[\\d+\\]/g, '')") == text
    assert page.is_hidden("#failure")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.hover("#blocks .cite[data-n='1']")
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)


REMOVED = """() => {
  window.__removed = 0;
  new MutationObserver((records) => {
    for (const r of records) for (const node of r.removedNodes) {
      if (node.nodeType === 1 && (node.classList.contains('cite') || node.querySelector('.cite'))) window.__removed++;
    }
  }).observe(document.getElementById('blocks'), {childList: true, subtree: true});
}"""


@pytest.mark.parametrize(
    ("model", "scenario"),
    [("claude-cites-before", "fake-citations"), ("claude-cites-after", "fake-citations-after")],
)
def test_markers_sit_beside_their_claims_whichever_order_the_stream_uses(
    page: Any, ui_gateway: RunningGateway, model: str, scenario: str
) -> None:
    """The API's own order (each citations_delta before its block's text, one block with two), the mock's
    (after the text, two on one block) and a citation between two text deltas of a block that keeps growing:
    every marker lands right after its claim's last character, on the same line, and none is rebuilt."""
    open_playground(page, ui_gateway)
    page.evaluate(REMOVED)
    ask(page, model)
    want = final_message(scenario)["content"]
    blocks = assert_markers_beside_their_claims(page)
    cited = [i for i, c in enumerate(want) if c.get("citations")]
    assert [b["index"] for b in blocks] == cited
    for block in blocks:
        content = want[block["index"]]
        assert block["text"] == content["text"]
        assert len(block["marks"]) == len(content["citations"])
    assert any(len(b["marks"]) == 2 for b in blocks)  # two citations on one block
    assert page.evaluate("window.__removed") == 0
    numbers = [m["n"] for b in blocks for m in b["marks"]]
    assert numbers == list(range(1, len(numbers) + 1))
    if scenario == "fake-citations-after":  # the trailing newline of the last block comes after its text
        assert page.evaluate("document.getElementById('blocks').textContent").endswith(".\n")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"playground-{scenario}.png"), full_page=True)


def test_keyboard_focus_on_a_marker_shows_its_preview(page: Any, ui_gateway: RunningGateway) -> None:
    open_playground(page, ui_gateway)
    ask(page, "claude-fast")
    page.focus("#blocks .cite[data-n='1']")
    assert page.is_visible("#tip")
    assert "Gateway notes" in page.inner_text("#tip")  # the sample document's title
    page.keyboard.press("Escape")
    assert page.is_hidden("#tip")


def test_mid_stream_error_shows_the_answer_incomplete(page: Any, ui_gateway: RunningGateway) -> None:
    open_playground(page, ui_gateway)
    ask(page, "claude-flaky", "incomplete")
    assert "Incomplete" in page.inner_text("#state")
    assert "Complete (" not in page.inner_text("#state")
    assert page.inner_text("#failure") == "overloaded_error: Overloaded"
    assert page.is_visible("#failure")
    assert "This answer will not be finished" in page.inner_text("#blocks")
    assert "incomplete" in (page.get_attribute("#blocks", "class") or "")
    assert page.get_attribute("#blocks .block", "data-done") == "false"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground-error.png"), full_page=True)


def test_error_before_the_stream_is_shown_refused_with_its_type(page: Any, ui_gateway: RunningGateway) -> None:
    """An error before any answer is a refusal, with the error: not an "Incomplete" answer."""
    open_playground(page, ui_gateway)
    page.fill("#key", "wrong-key")
    ask(page, "claude-fast", "refused|incomplete")
    assert page.get_attribute("#state", "data-state") == "refused"
    failure = page.inner_text("#failure")
    assert failure.startswith("authentication_error: ")
    assert page.inner_text("#state") == f"Refused: {failure.removeprefix('authentication_error: ')}"
    assert "Incomplete" not in page.inner_text("#state")
    assert "incomplete" not in (page.get_attribute("#blocks", "class") or "")


BUDGET = """
auth: {{keys: [{{name: frugal, key: sk-frugal, limits: {{budget: {{usd: 0.000001, per: day}}}}}}]}}
providers:
  upstream: {{kind: anthropic, api_key: provider-key, base_url: "{url}"}}
models:
  claude-priced: {{targets: [{{provider: upstream, model: fake-text}}]}}
  claude-paced: {{targets: [{{provider: upstream, model: fake-slow}}]}}
pricing:
  "fake-*": {{input: 3, output: 15}}
"""


def test_a_budget_refusal_says_refused_with_the_error(page: Any, fake_claude: FakeClaudeAPI) -> None:
    """A key over its budget: the gateway's 429 billing_error arrives before any answer, and the page says
    "Refused" with the error's type and message; the answer before it had been complete."""
    with run_gateway(BUDGET.format(url=fake_claude.base_url)) as gw:
        open_playground(page, gw, "sk-frugal")
        ask(page, "claude-priced")  # spends the budget
        ask(page, "claude-priced", "refused|incomplete")
        assert page.get_attribute("#state", "data-state") == "refused"
        state, failure = page.inner_text("#state"), page.inner_text("#failure")
        assert state.startswith("Refused: key 'frugal' has spent $") and "budget" in state
        assert failure.startswith("billing_error: key 'frugal' has spent $")
        assert page.inner_text("#blocks") == ""  # nothing of the earlier answer is left looking cut
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "playground-refused.png"), full_page=True)


def test_stopping_before_any_answer_is_no_answer_not_an_incomplete_one(page: Any, ui_gateway: RunningGateway) -> None:
    open_playground(page, ui_gateway)
    page.route("**/v1/messages", lambda route: None)  # held: the request never answers
    ask(page, "claude-fast", "waiting")
    page.click("#stop")
    page.wait_for_selector("#state[data-state='failed']")
    assert page.inner_text("#state").startswith("No answer")
    assert page.inner_text("#failure") == "stream_ended: stopped by you"


def test_thinking_renders_collapsed_and_tool_input_once_complete(page: Any, ui_gateway: RunningGateway) -> None:
    open_playground(page, ui_gateway)
    page.check("#thinking")
    ask(page, "claude-fast")
    thinking = page.locator("#blocks details.thinking")
    assert thinking.count() == 1
    assert thinking.get_attribute("open") is None  # collapsed
    assert not page.is_visible("#blocks .thinking-text")
    thinking.locator("summary").click()
    assert "The user asked about" in page.inner_text("#blocks .thinking-text")

    page.uncheck("#thinking")
    ask(page, "claude-tools")
    tool = page.locator("#blocks .block.tool").first
    assert tool.get_attribute("data-done") == "true"
    shown = json.loads(tool.locator("pre").inner_text())
    from tests.fakes.claude_api import final_message

    want = next(b for b in final_message("fake-tools")["content"] if b["type"] == "tool_use")["input"]
    assert shown == want


def test_models_come_from_the_api_with_the_key(page: Any, ui_gateway: RunningGateway) -> None:
    page.goto(f"{ui_gateway.url}/playground")
    page.wait_for_selector("#models-error:not([hidden])")
    assert "authentication_error" in page.inner_text("#models-error")
    open_playground(page, ui_gateway)
    options = page.locator("#model option").evaluate_all("(os) => os.map((o) => o.value)")
    listed = httpx.get(f"{ui_gateway.url}/v1/models", headers={"x-api-key": "ui-key"}).json()["data"]
    assert options == [m["id"] for m in listed]


@pytest.mark.parametrize("width", [360, 768])
def test_usable_on_a_narrow_screen(page: Any, ui_gateway: RunningGateway, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 800})
    open_playground(page, ui_gateway)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    ask(page, "claude-fast")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    for selector in ("#key", "#model", "#question", "#send"):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width


def test_every_control_has_a_label(page: Any, ui_gateway: RunningGateway) -> None:
    open_playground(page, ui_gateway)
    unlabeled = page.evaluate(
        """() => [...document.querySelectorAll('input, select, textarea, button')]
             .filter((el) => !el.closest('template') && el.type !== 'hidden')
             .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label'))
             .filter((el) => !el.textContent.trim())
             .map((el) => el.id || el.name || el.outerHTML.slice(0, 60))"""
    )
    assert unlabeled == []


CONTRAST = """() => {
  const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const low = [];
  for (const el of document.querySelectorAll('body *')) {
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.data.trim());
    if (!own || !el.checkVisibility() || el.closest(':disabled')) continue;
    const fg = lum(rgb(getComputedStyle(el).color)), bg = lum(background(el));
    const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
    if (ratio < 4.5) low.push(`${el.tagName}.${el.className}: ${ratio.toFixed(2)}`);
  }
  return low;
}"""


@pytest.mark.parametrize("model", ["claude-fast", "claude-flaky"])
def test_text_contrast_is_at_least_4_5_to_1(page: Any, ui_gateway: RunningGateway, model: str) -> None:
    open_playground(page, ui_gateway)
    ask(page, model, "complete|incomplete")
    if model == "claude-fast":
        page.hover("#blocks .cite[data-n='1']")  # the preview's colours too
    assert page.evaluate(CONTRAST) == []
    page.goto(f"{ui_gateway.url}/status")
    page.fill("#key", "ui-key")
    page.dispatch_event("#key", "change")
    page.wait_for_selector("section.alias")
    assert page.evaluate(CONTRAST) == []


def test_the_whole_flow_works_from_the_keyboard(page: Any, ui_gateway: RunningGateway) -> None:
    page.goto(f"{ui_gateway.url}/playground")
    page.keyboard.press("Tab")  # the skip link first
    assert page.evaluate("document.activeElement.className") == "skip"
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "key"
    page.keyboard.type("ui-key")
    page.keyboard.press("Tab")  # change event: the models load
    page.wait_for_selector("#model option[value='claude-fast']", state="attached")
    assert page.evaluate("document.activeElement.id") == "model"
    page.select_option("#model", "claude-fast")
    page.focus("#question")
    page.keyboard.press("Control+End")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "send"
    page.keyboard.press("Enter")
    page.wait_for_selector("#state[data-state='complete']")
    assert page.locator("#blocks .cite").count() >= 1


def test_stop_leaves_the_partial_answer_marked_incomplete(page: Any, ui_gateway: RunningGateway) -> None:
    open_playground(page, ui_gateway)
    ask(page, "claude-paced", "streaming")
    page.wait_for_function("() => document.getElementById('blocks').textContent.length > 0")
    page.click("#stop")
    page.wait_for_selector("#state[data-state='incomplete']")
    assert page.inner_text("#failure") == "stream_ended: stopped by you"
    assert page.is_enabled("#send") and page.is_disabled("#stop")
    page.wait_for_timeout(300)  # nothing more arrives after the stop
    assert page.get_attribute("#state", "data-state") == "incomplete"


def test_an_uploaded_text_file_becomes_a_plain_text_document(
    page: Any, ui_gateway: RunningGateway, tmp_path: Any
) -> None:
    open_playground(page, ui_gateway)
    notes = tmp_path / "Field notes.txt"
    notes.write_text(SOLAR, encoding="utf-8")
    page.set_input_files("#upload", str(notes))
    item = page.locator("#documents li").nth(1)
    item.wait_for()
    assert item.locator("[name=title]").input_value() == "Field notes"
    assert item.locator("[name=kind]").input_value() == "text"
    assert item.locator("[name=text]").input_value() == SOLAR
    page.select_option("#model", "claude-fast")
    with page.expect_request("**/v1/messages") as sent:
        page.click("#send")
    docs = [b for b in json.loads(sent.value.post_data)["messages"][0]["content"] if b["type"] == "document"]
    assert docs[1] == {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": SOLAR},
        "citations": {"enabled": True},
        "title": "Field notes",
    }
    page.wait_for_selector("#state[data-state='complete']")

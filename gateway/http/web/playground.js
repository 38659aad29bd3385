// The playground: documents + a question -> POST /v1/messages (stream: true) -> the answer folded per
// block (fold.js) and rendered as it arrives, with numbered citation markers, a source panel and usage.
// Model text is only ever set as textContent: nothing from the stream becomes markup.

import {
  SSEParser,
  USAGE_FIELDS,
  citationLocation,
  citationSource,
  finish,
  foldEvent,
  newAnswer,
  citedText,
} from "./fold.js";

const $ = (id) => document.getElementById(id);
const form = $("ask");
const els = {
  key: $("key"),
  model: $("model"),
  modelsError: $("models-error"),
  maxTokens: $("max-tokens"),
  thinking: $("thinking"),
  documents: $("documents"),
  question: $("question"),
  send: $("send"),
  stop: $("stop"),
  state: $("state"),
  blocks: $("blocks"),
  failure: $("failure"),
  tip: $("tip"),
  sources: $("sources"),
  noSources: $("no-sources"),
  stopReason: $("stop-reason"),
  ttft: $("ttft"),
  total: $("total"),
};

let current = null; // {answer, titles, controller, blockEls}

function headers() {
  const h = { "content-type": "application/json", "anthropic-version": "2023-06-01" };
  const key = els.key.value.trim();
  if (key) h["x-api-key"] = key;
  return h;
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.error) return { type: body.error.type, message: body.error.message };
  } catch (e) {
    /* not the error envelope */
  }
  return { type: `http_${response.status}`, message: response.statusText || "request failed" };
}

// --- models ----------------------------------------------------------------------------------

async function loadModels() {
  els.modelsError.hidden = true;
  const chosen = els.model.value;
  const models = [];
  let after = null;
  try {
    for (let page = 0; page < 50; page++) {
      const query = new URLSearchParams({ limit: "100" });
      if (after) query.set("after_id", after);
      const response = await fetch(`/v1/models?${query}`, { headers: headers() });
      if (!response.ok) {
        const error = await errorText(response);
        throw new Error(`${error.type}: ${error.message}`);
      }
      const body = await response.json();
      models.push(...body.data);
      if (!body.has_more || !body.last_id) break;
      after = body.last_id;
    }
  } catch (e) {
    els.modelsError.textContent = `Could not list the models: ${e.message}`;
    els.modelsError.hidden = false;
    return;
  }
  els.model.replaceChildren(
    ...models.map((m) => {
      const option = new Option(m.display_name && m.display_name !== m.id ? `${m.id} — ${m.display_name}` : m.id, m.id);
      return option;
    }),
  );
  if (models.some((m) => m.id === chosen)) els.model.value = chosen;
}

// --- documents -------------------------------------------------------------------------------

let documentCount = 0;

function addDocument({ title = "", kind = "text", text = "", pdf = null } = {}) {
  const item = $("document-template").content.firstElementChild.cloneNode(true);
  documentCount += 1;
  item.querySelector("[name=title]").value = title || `Document ${documentCount}`;
  item.querySelector("[name=kind]").value = kind;
  item.querySelector("[name=text]").value = text;
  item.pdf = pdf; // base64, for kind "pdf"
  item.querySelector("[name=kind]").addEventListener("change", () => showKind(item));
  item.querySelector("[name=remove]").addEventListener("click", () => {
    item.remove();
    numberDocuments();
  });
  els.documents.append(item);
  showKind(item);
  numberDocuments();
  return item;
}

function numberDocuments() {
  [...els.documents.children].forEach((item, i) => {
    item.querySelector("[name=remove]").setAttribute("aria-label", `Remove document ${i + 1}`);
  });
}

function showKind(item) {
  const pdf = item.querySelector("[name=kind]").value === "pdf";
  const note = item.querySelector("[data-pdf]");
  item.querySelector("[name=text]").closest("label").hidden = pdf;
  note.hidden = !pdf;
  note.textContent = item.pdf ? `PDF attached (${Math.round((item.pdf.length * 3) / 4 / 1024)} KiB)` : "Upload a PDF file to attach it.";
}

function base64Of(buffer) {
  const bytes = new Uint8Array(buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

async function uploadFiles(files) {
  for (const file of files) {
    const title = file.name.replace(/\.[^.]+$/, "");
    if (file.type === "application/pdf" || /\.pdf$/i.test(file.name)) {
      addDocument({ title, kind: "pdf", pdf: base64Of(await file.arrayBuffer()) });
    } else {
      addDocument({ title, kind: "text", text: await file.text() });
    }
  }
}

function collectDocuments() {
  const docs = [];
  const titles = [];
  for (const item of els.documents.children) {
    const title = item.querySelector("[name=title]").value.trim();
    const kind = item.querySelector("[name=kind]").value;
    const text = item.querySelector("[name=text]").value;
    let source;
    if (kind === "pdf") {
      if (!item.pdf) continue;
      source = { type: "base64", media_type: "application/pdf", data: item.pdf };
    } else if (kind === "content") {
      const paragraphs = text.split(/\n\s*\n/).map((p) => p.trim()).filter(Boolean);
      if (!paragraphs.length) continue;
      source = { type: "content", content: paragraphs.map((p) => ({ type: "text", text: p })) };
    } else {
      if (!text.trim()) continue;
      source = { type: "text", media_type: "text/plain", data: text };
    }
    const doc = { type: "document", source, citations: { enabled: true } };
    if (title) doc.title = title;
    docs.push(doc);
    titles.push(title);
  }
  return { docs, titles };
}

// --- rendering -------------------------------------------------------------------------------

function setState(state, text) {
  els.state.dataset.state = state;
  els.state.textContent = text;
}

function seconds(from, to) {
  return from === null || to === null ? "–" : `${((to - from) / 1000).toFixed(2)} s`;
}

function renderUsage(answer) {
  for (const field of USAGE_FIELDS) {
    const value = answer.usage[field];
    document.querySelector(`[data-usage="${field}"]`).textContent = value === null ? "–" : String(value);
  }
  els.stopReason.textContent = answer.stopReason || "–";
}

function renderTimes(answer) {
  els.ttft.textContent = seconds(answer.startedAt, answer.firstTokenAt);
  els.total.textContent = seconds(answer.startedAt, answer.endedAt);
}

function marker(n) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "cite";
  button.dataset.n = String(n);
  button.textContent = `[${n}]`;
  const citation = current.answer.citations[n - 1];
  const source = citationSource(citation, current.titles);
  button.setAttribute("aria-label", `Citation ${n}: ${source.title}, ${citationLocation(citation)}`);
  button.setAttribute("aria-describedby", "tip");
  return button;
}

function blockElement(index, block) {
  let el = current.blockEls[index];
  if (!el) {
    if (block.type === "thinking" || block.type === "redacted_thinking") {
      el = document.createElement("details");
      el.className = "block thinking";
      const summary = document.createElement("summary");
      summary.textContent = block.type === "thinking" ? "Thinking" : "Thinking (redacted)";
      const body = document.createElement("div");
      body.className = "thinking-text";
      el.append(summary, body);
    } else if (block.type === "text") {
      el = document.createElement("span"); // text blocks flow together: one paragraph of claims
      el.className = "block text";
    } else {
      el = document.createElement("div");
      el.className = "block tool";
      const title = document.createElement("div");
      title.className = "tool-title";
      const pre = document.createElement("pre");
      el.append(title, pre);
    }
    el.dataset.index = String(index);
    el.dataset.type = block.type;
    // Blocks are shown in index order, whatever order they start in.
    const next = [...els.blocks.children].find((c) => Number(c.dataset.index) > index);
    els.blocks.insertBefore(el, next || null);
    current.blockEls[index] = el;
  }
  return el;
}

function renderBlock(index) {
  const block = current.answer.blocks[index];
  const el = blockElement(index, block);
  el.dataset.done = String(block.done);
  if (block.type === "text") {
    // [head][last word + markers, kept on one line][trailing whitespace]: the markers sit right after the
    // claim's last word, whichever order its text and citations came in; they are only ever appended, so a
    // marker the reader is hovering is never rebuilt.
    const { head, last, markers, tail } = citedText(block);
    if (!el.firstChild) {
      const end = document.createElement("span");
      end.className = "claim-end";
      end.append(document.createTextNode(""));
      el.append(document.createTextNode(""), end, document.createTextNode(""));
    }
    const [headNode, end, tailNode] = el.childNodes;
    headNode.data = head;
    end.firstChild.data = last;
    tailNode.data = tail;
    for (const n of markers.slice(end.childNodes.length - 1)) end.append(marker(n));
  } else if (block.type === "thinking") {
    el.querySelector(".thinking-text").textContent = block.thinking;
  } else if (block.type === "redacted_thinking") {
    el.querySelector(".thinking-text").textContent = "The provider redacted this reasoning.";
  } else {
    const name = block.start.name ? ` ${block.start.name}` : "";
    el.querySelector(".tool-title").textContent = `${block.type}${name}${block.done ? "" : " (receiving…)"}`;
    const shown = block.done ? (block.input ?? block.start) : null;
    el.querySelector("pre").textContent = shown === null ? "" : JSON.stringify(shown, null, 2);
  }
}

function renderSources() {
  const seen = new Map();
  for (const [i, citation] of current.answer.citations.entries()) {
    const source = citationSource(citation, current.titles);
    if (!seen.has(source.key)) seen.set(source.key, { source, numbers: [] });
    seen.get(source.key).numbers.push(i + 1);
  }
  els.sources.replaceChildren(
    ...[...seen.values()].map(({ source, numbers }) => {
      const li = document.createElement("li");
      li.dataset.key = source.key;
      const title = document.createElement("span");
      title.className = "source-title";
      title.textContent = source.title;
      const refs = document.createElement("span");
      refs.className = "source-refs";
      refs.textContent = ` cited as ${numbers.map((n) => `[${n}]`).join(" ")}`;
      li.append(title, refs);
      return li;
    }),
  );
  els.noSources.hidden = seen.size > 0;
}

function showFailure(error) {
  els.failure.replaceChildren();
  const strong = document.createElement("strong");
  strong.textContent = error.type;
  els.failure.append(strong, document.createTextNode(`: ${error.message}`));
  els.failure.hidden = false;
}

// "Incomplete" only for an answer that started and stopped short; an error before any answer is a refusal.
function renderEnd(answer) {
  if (answer.status === "complete") {
    setState("complete", `Complete (${answer.stopReason || "no stop reason"}).`);
  } else if (answer.status === "incomplete") {
    setState("incomplete", "Incomplete: the answer stopped before it was finished.");
    showFailure(answer.error);
    els.blocks.classList.add("incomplete");
  } else if (answer.status === "refused") {
    setState("refused", `Refused: ${answer.error.message}`);
    showFailure(answer.error);
  } else if (answer.status === "failed") {
    setState("failed", "No answer: the request ended before an answer started.");
    showFailure(answer.error);
  }
}

// --- the tooltip -----------------------------------------------------------------------------

function showTip(button) {
  const n = Number(button.dataset.n);
  const citation = current && current.answer.citations[n - 1];
  if (!citation) return;
  const source = citationSource(citation, current.titles);
  const head = document.createElement("div");
  head.className = "tip-head";
  head.textContent = `[${n}] ${source.title} · ${citationLocation(citation)}`;
  const quote = document.createElement("blockquote");
  quote.className = "tip-quote";
  quote.textContent = citation.cited_text || "";
  els.tip.replaceChildren(head, quote);
  els.tip.hidden = false;
  const box = button.getBoundingClientRect();
  const host = els.tip.offsetParent ? els.tip.offsetParent.getBoundingClientRect() : { left: 0, top: 0 };
  els.tip.style.left = `${Math.max(0, box.left - host.left)}px`;
  els.tip.style.top = `${box.bottom - host.top + 6}px`;
  for (const li of els.sources.children) li.classList.toggle("active", li.dataset.key === source.key);
}

function hideTip() {
  els.tip.hidden = true;
  for (const li of els.sources.children) li.classList.remove("active");
}

els.blocks.addEventListener("mouseover", (e) => {
  const button = e.target.closest(".cite");
  if (button) showTip(button);
});
els.blocks.addEventListener("mouseout", (e) => {
  if (e.target.closest(".cite")) hideTip();
});
els.blocks.addEventListener("focusin", (e) => {
  const button = e.target.closest(".cite");
  if (button) showTip(button);
});
els.blocks.addEventListener("focusout", hideTip);
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") hideTip();
});

// --- asking ----------------------------------------------------------------------------------

function apply(change, answer) {
  if (change.block !== undefined) renderBlock(change.block);
  if (change.citation) renderSources(); // only a new citation changes the source panel
  if (change.usage) renderUsage(answer);
  if (change.status && answer.status === "streaming") setState("streaming", "Streaming…");
  renderTimes(answer);
  if (change.error || answer.status === "complete") renderEnd(answer);
}

async function ask(event) {
  event.preventDefault();
  if (current && current.controller) current.controller.abort();
  const { docs, titles } = collectDocuments();
  const question = els.question.value.trim();
  if (!els.model.value) {
    setState("failed", "Pick a model alias first (Reload lists them).");
    return;
  }
  if (!question) {
    setState("failed", "Type a question first.");
    return;
  }
  const body = {
    model: els.model.value,
    max_tokens: Math.max(1, Number(els.maxTokens.value) || 1024),
    stream: true,
    messages: [{ role: "user", content: [...docs, { type: "text", text: question }] }],
  };
  if (els.thinking.checked) {
    body.thinking = { type: "enabled", budget_tokens: Math.max(1024, Math.floor(body.max_tokens / 2)) };
    if (body.max_tokens <= body.thinking.budget_tokens) body.max_tokens = body.thinking.budget_tokens + 1024;
  }
  const controller = new AbortController();
  const answer = newAnswer(performance.now());
  current = { answer, titles, controller, blockEls: [] };
  els.blocks.replaceChildren();
  els.blocks.classList.remove("incomplete");
  els.failure.hidden = true;
  hideTip();
  renderSources();
  renderUsage(answer);
  renderTimes(answer);
  setState("waiting", "Waiting for the first event…");
  els.send.disabled = true;
  els.stop.disabled = false;
  // A newer question replaces this one on screen: from then on this answer renders nothing.
  const show = (change) => current && current.answer === answer && apply(change, answer);
  try {
    const response = await fetch("/v1/messages", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      const error = await errorText(response);
      show(foldEvent(answer, { type: "error", error }, performance.now()));
      return;
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new SSEParser();
    for (;;) {
      const { value, done } = await reader.read();
      const events = done ? parser.finish() : parser.push(value);
      for (const { data } of events) {
        let parsed;
        try {
          parsed = JSON.parse(data);
        } catch (e) {
          parsed = { type: "error", error: { type: "invalid_stream", message: "an event that is not JSON" } };
        }
        show(foldEvent(answer, parsed, performance.now()));
      }
      if (done) break;
    }
    show(finish(answer, performance.now()));
  } catch (e) {
    const reason = e.name === "AbortError" ? "stopped by you" : `the connection failed: ${e.message}`;
    show(finish(answer, performance.now(), reason));
  } finally {
    if (current && current.answer === answer) {
      current.controller = null;
      els.send.disabled = false;
      els.stop.disabled = true;
    }
  }
}

form.addEventListener("submit", ask);
els.stop.addEventListener("click", () => current && current.controller && current.controller.abort());
$("reload-models").addEventListener("click", loadModels);
$("add-document").addEventListener("click", () => addDocument().querySelector("[name=text]").focus());
$("upload").addEventListener("change", async (e) => {
  await uploadFiles(e.target.files);
  e.target.value = "";
});
els.key.addEventListener("change", loadModels);

addDocument({
  title: "Gateway notes",
  text:
    "The gateway speaks the Messages API in its own shape. Clients change only their base URL. " +
    "Streams keep every citation as its own event.",
});
loadModels();

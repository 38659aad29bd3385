// The Messages stream, folded per content block exactly as the protocol defines it. No DOM here: the
// playground renders what this returns, and the tests drive it with recorded streams.
//
//   message_start        the message; input and cache token counts (and the first output count)
//   content_block_start  allocates block `index` (text, thinking, tool_use, server tool blocks ...)
//   content_block_delta  text_delta appends; citations_delta pushes one citation and gives the block a
//                        numbered marker (recording the offset of the block's text it arrived at; the page
//                        shows markers at the end of the block's text: citedText); thinking_delta /
//                        signature_delta / input_json_delta accumulate
//   content_block_stop   finalises the block (a tool_use block's input JSON is parsed here)
//   message_delta        stop_reason; usage fields overwrite (cumulative counts, never added)
//   message_stop         the answer is complete
//   ping                 ignored
//   error                the answer is incomplete: kept as it is, marked with the error; before message_start
//                        (or as the HTTP error the page folds in the same way) the request was refused
// Anything else out of order (a delta for a block never started, events after the end) also makes the
// answer incomplete, with an `invalid_stream` error: a broken stream never looks finished.
//
// How an answer ends (`status`): "complete" (message_stop), "incomplete" (it had started — message_start — and
// stopped short), "refused" (an error arrived before any answer: the gateway's or the provider's refusal) or
// "failed" (no answer and no error from either: a stream that broke, ended or was stopped before message_start).

export const USAGE_FIELDS = [
  "input_tokens",
  "cache_creation_input_tokens",
  "cache_read_input_tokens",
  "output_tokens",
];

export function newAnswer(now = 0) {
  return {
    status: "waiting", // waiting -> (refused | failed) or streaming -> complete | incomplete
    message: null,
    blocks: [],
    citations: [], // every citation in arrival order; marker n is citations[n - 1]
    usage: Object.fromEntries(USAGE_FIELDS.map((f) => [f, null])),
    stopReason: null,
    error: null,
    startedAt: now,
    firstTokenAt: null,
    endedAt: null,
  };
}

function ended(answer) {
  return ["complete", "incomplete", "refused", "failed"].includes(answer.status);
}

// `reported`: the error came from the other side (an `error` event, an HTTP error), not from how the stream went.
function fail(answer, type, message, now, reported = false) {
  if (ended(answer)) return { error: true };
  answer.status = answer.message ? "incomplete" : reported ? "refused" : "failed";
  answer.error = { type, message };
  answer.endedAt = now;
  return { error: true };
}

function takeUsage(answer, usage) {
  if (!usage || typeof usage !== "object") return;
  for (const field of USAGE_FIELDS) {
    if (typeof usage[field] === "number") answer.usage[field] = usage[field];
  }
}

function newBlock(start) {
  const block = {
    type: start.type,
    text: typeof start.text === "string" ? start.text : "",
    markers: [], // {n, offset}: citation n sits at this offset of `text`
    thinking: typeof start.thinking === "string" ? start.thinking : "",
    signature: typeof start.signature === "string" ? start.signature : "",
    partialJson: "",
    input: start.input ?? null,
    start, // the content_block as it started (server tool results arrive whole here)
    done: false,
  };
  return block;
}

function addCitation(answer, block, index, citation) {
  const n = answer.citations.push({ ...citation, blockIndex: index, offset: block.text.length });
  block.markers.push({ n, offset: block.text.length });
  return n;
}

// Folds one parsed event (`{type, ...}`) into `answer`; returns what changed: {block: index} (plus
// citation: true when a citation was added), {usage: true}, {status: true}, {error: true}, or {} when
// nothing did (ping, unknown events).
export function foldEvent(answer, event, now = 0) {
  const type = event && event.type;
  if (type === "ping") return {};
  if (type === "error") {
    const error = event.error || {};
    return fail(answer, error.type || "api_error", error.message || "the provider reported an error", now, true);
  }
  if (ended(answer)) {
    return {}; // nothing after the end changes the answer
  }
  if (type === "message_start") {
    if (answer.message) return fail(answer, "invalid_stream", "a second message_start", now);
    answer.message = event.message || {};
    answer.status = "streaming";
    takeUsage(answer, answer.message.usage);
    return { usage: true, status: true };
  }
  if (!answer.message) {
    if (typeof type === "string" && !KNOWN.has(type)) return {};
    return fail(answer, "invalid_stream", `${type} before message_start`, now);
  }
  switch (type) {
    case "content_block_start": {
      const index = event.index;
      if (!Number.isInteger(index) || answer.blocks[index]) {
        return fail(answer, "invalid_stream", `content_block_start for index ${index} twice or invalid`, now);
      }
      const block = newBlock(event.content_block || {});
      answer.blocks[index] = block;
      const citations = (event.content_block && event.content_block.citations) || [];
      for (const citation of citations) addCitation(answer, block, index, citation);
      return citations.length ? { block: index, citation: true } : { block: index };
    }
    case "content_block_delta": {
      const index = event.index;
      const block = answer.blocks[index];
      if (!block || block.done) {
        return fail(answer, "invalid_stream", `content_block_delta for block ${index}, which is not open`, now);
      }
      const delta = event.delta || {};
      switch (delta.type) {
        case "text_delta":
          block.text += delta.text;
          if (answer.firstTokenAt === null) answer.firstTokenAt = now;
          break;
        case "citations_delta":
          addCitation(answer, block, index, delta.citation || {});
          return { block: index, citation: true };
        case "thinking_delta":
          block.thinking += delta.thinking;
          if (answer.firstTokenAt === null) answer.firstTokenAt = now;
          break;
        case "signature_delta":
          block.signature += delta.signature;
          break;
        case "input_json_delta":
          block.partialJson += delta.partial_json;
          if (answer.firstTokenAt === null) answer.firstTokenAt = now;
          break;
        default:
          return {}; // a delta type this page does not know: nothing to show
      }
      return { block: index };
    }
    case "content_block_stop": {
      const index = event.index;
      const block = answer.blocks[index];
      if (!block || block.done) {
        return fail(answer, "invalid_stream", `content_block_stop for block ${index}, which is not open`, now);
      }
      block.done = true;
      if (block.partialJson) {
        try {
          block.input = JSON.parse(block.partialJson);
        } catch (e) {
          return fail(answer, "invalid_stream", `block ${index}: its input is not valid JSON`, now);
        }
      } else if (block.input === null && (block.type === "tool_use" || block.type === "server_tool_use")) {
        block.input = {};
      }
      return { block: index };
    }
    case "message_delta": {
      if (event.delta && "stop_reason" in event.delta) answer.stopReason = event.delta.stop_reason;
      takeUsage(answer, event.usage);
      return { usage: true };
    }
    case "message_stop": {
      const open = answer.blocks.findIndex((b) => b && !b.done);
      if (open >= 0) return fail(answer, "invalid_stream", `message_stop with block ${open} still open`, now);
      answer.status = "complete";
      answer.endedAt = now;
      return { status: true };
    }
    default:
      return {}; // an event type added to the protocol later: ignored, as the SDKs do
  }
}

const KNOWN = new Set([
  "message_start",
  "content_block_start",
  "content_block_delta",
  "content_block_stop",
  "message_delta",
  "message_stop",
]);

// The byte stream ended (or the connection broke): whatever was not finished is incomplete (or, not started,
// failed).
export function finish(answer, now = 0, reason = null) {
  if (ended(answer)) return {};
  const why = reason ?? (answer.message ? "the stream ended before message_stop" : "the stream ended before any answer");
  return fail(answer, "stream_ended", why, now);
}

// How a text block is shown: its text, then its citation markers, then the whitespace the text ends with —
// {head, last, markers, tail}, where `last` is the text's last word, which the page keeps on one line with
// the markers. A cited text block is one claim (the API gives each cited claim a text block of its own,
// between uncited connecting blocks), so its markers belong at the end of its text, whether the
// citations_delta came before the text (as the API's own streams send it), after it, or between two of
// its text deltas; they stay there while the block's text grows. A block without citations is all `head`.
export function citedText(block) {
  const markers = block.markers.map((m) => m.n);
  if (!markers.length) return { head: block.text, last: "", markers, tail: "" };
  const text = block.text.replace(/\s+$/, "");
  const last = /\S*$/.exec(text)[0];
  return { head: text.slice(0, text.length - last.length), last, markers, tail: block.text.slice(text.length) };
}

function range(word, start, endExclusive) {
  if (typeof start !== "number") return "";
  const last = typeof endExclusive === "number" ? endExclusive - 1 : start;
  return last > start ? `${word}s ${start}–${last}` : `${word} ${start}`;
}

// Where a citation points, in words: characters, pages or content blocks (end indexes are exclusive).
export function citationLocation(citation) {
  switch (citation.type) {
    case "char_location":
      return `characters ${citation.start_char_index}–${citation.end_char_index}`;
    case "page_location":
      return range("page", citation.start_page_number, citation.end_page_number);
    case "content_block_location":
    case "search_result_location":
      return range("block", citation.start_block_index, citation.end_block_index);
    case "web_search_result_location":
      return citation.url || "web result";
    default:
      return citation.type || "";
  }
}

// Which source a citation belongs to: {key, index, title} (documents by document_index, search results
// by search_result_index, web results by URL); `titles` are the titles the user gave the documents.
export function citationSource(citation, titles = []) {
  if (typeof citation.document_index === "number") {
    const i = citation.document_index;
    return { key: `doc:${i}`, index: i, title: titles[i] || citation.document_title || `Document ${i + 1}` };
  }
  if (typeof citation.search_result_index === "number") {
    const i = citation.search_result_index;
    return { key: `search:${i}`, index: i, title: citation.title || citation.source || `Search result ${i + 1}` };
  }
  return { key: `web:${citation.url || ""}`, index: null, title: citation.title || citation.url || "Source" };
}

// Server-sent events, incrementally: push text as it arrives, get back complete events {event, data}.
// Lines end with \n, \r\n or \r; several data lines join with \n; comments (":") are skipped.
export class SSEParser {
  constructor() {
    this.buffer = "";
    this.event = "";
    this.data = [];
  }

  push(text) {
    this.buffer += text;
    const out = [];
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (!match) break;
      // A lone \r at the very end may be the first half of \r\n: wait for the next chunk.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      this.line(line, out);
    }
    return out;
  }

  finish() {
    // A \r held back at the very end was a whole line ending after all. Whatever is left is a frame
    // without its blank line, which is not dispatched (as EventSource does).
    const out = this.buffer.endsWith("\r") ? this.push("\n") : [];
    this.buffer = "";
    this.event = "";
    this.data = [];
    return out;
  }

  line(line, out) {
    if (line === "") {
      if (this.data.length) out.push({ event: this.event || "message", data: this.data.join("\n") });
      this.event = "";
      this.data = [];
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
  }
}

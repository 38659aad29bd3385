// The status page: GET /v1/gateway/status (routes, breaker state and recent failures, success rate, time to first
// event, streams in flight, request outcomes and token totals from the metrics registry; each team's and key's
// budget, spend and refusals), redrawn every 2 s. With a client key the document's scope is "key": the aliases it
// may use, their health, its own usage today, its own limits and its team's budget.

const $ = (id) => document.getElementById(id);
const TOKEN_TYPES = [
  ["input", "Input"],
  ["output", "Output"],
  ["cache_read", "Cache read"],
  ["cache_creation", "Cache write"],
];
let timer = null;
let lastUpdated = null; // when the status was last read (the time shown)
const NO_COST = "\u2014"; // an unpriced cost: unknown, not $0

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

function percent(rate) {
  return typeof rate === "number" ? `${(rate * 100).toFixed(1)} %` : "–";
}

function millis(seconds) {
  return typeof seconds === "number" ? `${(seconds * 1000).toFixed(0)} ms` : "–";
}

function stateText(target) {
  if (target.state === "open") return `cooling down (${target.cooldown_remaining_s.toFixed(1)} s left)`;
  if (target.state === "half_open") return "probing";
  return "healthy";
}

function tokensText(tokens) {
  return TOKEN_TYPES.map(([key, label]) => `${label} ${tokens[key] ?? 0}`).join(" · ");
}

function failuresText(target) {
  const recent = target.recent_failures ?? 0;
  const window = target.failure_window_s ?? 0;
  return `${recent} in the last ${window} s · ${target.failures ?? 0} in all`;
}

function requestsText(requests) {
  const entries = Object.entries(requests || {});
  return entries.length ? entries.map(([outcome, n]) => `${outcome} ${n}`).join(" · ") : "none yet";
}

function aliasSection(alias) {
  const section = el("section", null, { class: "panel alias", "data-alias": alias.alias });
  const id = `alias-${alias.alias.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  section.setAttribute("aria-labelledby", id);
  section.append(el("h2", alias.alias, { id }));
  section.append(el("p", `Strategy: ${alias.strategy} · requests: ${requestsText(alias.requests)}`, { class: "help" }));
  section.append(el("p", `Tokens: ${tokensText(alias.tokens)}`, { class: "help", "data-tokens": "" }));
  const table = el("table");
  table.append(el("caption", `Targets of ${alias.alias}`, { class: "visually-hidden" }));
  const head = el("tr");
  for (const title of ["Provider", "Model", "State", "Failures", "Success rate", "Time to first event", "In flight", "Requests", "Tokens"]) {
    head.append(el("th", title, { scope: "col" }));
  }
  const thead = el("thead");
  thead.append(head);
  table.append(thead);
  const body = el("tbody");
  for (const target of alias.targets) {
    const row = el("tr", null, { "data-state": target.state });
    const provider = alias.strategy === "weighted" && target.weight !== undefined ? `${target.provider} (weight ${target.weight})` : target.provider;
    row.append(
      el("th", provider, { scope: "row" }),
      el("td", target.model || "(client's model)"),
      el("td", stateText(target), { class: `state-${target.state}` }),
      el("td", failuresText(target), { "data-cell": "failures", "data-recent": target.recent_failures ?? 0 }),
      el("td", percent(target.success_rate)),
      el("td", millis(target.ttft_ewma_s)),
      el("td", target.inflight),
      el("td", requestsText(target.requests)),
      el("td", tokensText(target.tokens)),
    );
    body.append(row);
  }
  table.append(body);
  const scroll = el("div", null, { class: "scroll" });
  scroll.append(table);
  section.append(scroll);
  return section;
}

function keyStateText(target) {
  if (target.state === "unavailable") return `cooling down (${target.cooldown_remaining_s.toFixed(1)} s left)`;
  if (target.state === "throttled") return `throttled (${target.throttled_remaining_s.toFixed(1)} s left)`;
  return target.state;
}

function keyAliasSection(alias) {
  // scope "key": no provider, no upstream model, nobody else's traffic — the alias's health and this key's usage
  const section = el("section", null, { class: "panel alias", "data-alias": alias.alias, "data-state": alias.state });
  const id = `alias-${alias.alias.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  section.setAttribute("aria-labelledby", id);
  section.append(el("h2", alias.alias, { id }));
  section.append(el("p", `State: ${alias.state} · your requests today: ${alias.today.requests}`, { class: "help" }));
  section.append(el("p", `Your tokens today: ${tokensText(alias.today.tokens)}`, { class: "help", "data-tokens": "" }));
  const table = el("table");
  table.append(el("caption", `Targets of ${alias.alias}`, { class: "visually-hidden" }));
  const head = el("tr");
  for (const title of ["Target", "State"]) head.append(el("th", title, { scope: "col" }));
  const thead = el("thead");
  thead.append(head);
  table.append(thead);
  const body = el("tbody");
  alias.targets.forEach((target, i) => {
    const row = el("tr", null, { "data-state": target.state });
    row.append(el("th", `${i + 1}`, { scope: "row" }), el("td", keyStateText(target), { class: `state-${target.state}` }));
    body.append(row);
  });
  table.append(body);
  section.append(table);
  return section;
}

async function refresh() {
  const headers = {};
  const key = $("key").value.trim();
  if (key) headers["x-api-key"] = key;
  try {
    const response = await fetch("/v1/gateway/status", { headers });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? `${body.error.type}: ${body.error.message}` : response.statusText);
    const own = body.scope === "key";
    const totals = Object.fromEntries(TOKEN_TYPES.map(([key]) => [key, 0]));
    for (const alias of body.aliases) {
      const tokens = own ? alias.today.tokens : alias.tokens;
      for (const [key] of TOKEN_TYPES) totals[key] += tokens[key] || 0;
    }
    $("totals-title").textContent = own ? `Your tokens today (key ${body.key}), all aliases` : "Tokens, all aliases";
    $("totals").replaceChildren(
      ...TOKEN_TYPES.flatMap(([key, label]) => [el("dt", label), el("dd", totals[key], { "data-total": key })]),
    );
    $("aliases").replaceChildren(...body.aliases.map(own ? keyAliasSection : aliasSection));
    limitsView(body.limits, own);
    $("status-error").hidden = true;
    const worker = body.worker && body.worker.workers > 1 ? ` · health from worker ${body.worker.pid} of ${body.worker.workers}` : "";
    lastUpdated = new Date().toLocaleTimeString();
    $("updated").textContent = `Updated ${lastUpdated}${worker}`;
    await refreshUsage(headers);
  } catch (e) {
    $("status-error").textContent = `Could not read the status: ${e.message}`;
    $("status-error").hidden = false;
    // not "Loading…" beside an error: the page says what it last managed to read, if anything
    $("updated").textContent = lastUpdated ? `Last updated ${lastUpdated}; the latest refresh failed` : "Not loaded";
  }
}

// --- Budgets, limits and refusals (the status document's "limits"): per team and per key, the budget and the
// spend of its current window (the limiter's count), the rate limits, and the refusals by limit since the
// answering process started.

// Dollars with the precision a budget of `scale` needs (as the gateway's own refusals print them).
function usd(amount, scale) {
  if (scale >= 1) return `$${amount.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })}`;
  const digits = Math.min(8, Math.max(2, 1 - Math.floor(Math.log10(scale))));
  return `$${amount.toFixed(digits)}`;
}

function budgetText(budget) {
  if (!budget) return "none";
  return `${budget.usd >= 1 ? `$${budget.usd}` : usd(budget.usd, budget.usd)} per ${budget.per}`;
}

function spentText(budget) {
  if (!budget) return NO_COST;
  if (budget.spent_usd === null) return "unknown (the limits store cannot be read)";
  return `${usd(budget.spent_usd, budget.usd)} (${((budget.spent_usd / budget.usd) * 100).toFixed(1)} %)`;
}

const RATE_NAMES = [
  ["requests_per_minute", "requests/min"],
  ["tokens_per_minute", "tokens/min"],
  ["max_inflight", "in flight"],
];

function ratesText(rates) {
  const shown = RATE_NAMES.filter(([name]) => rates && rates[name] !== undefined).map(([name, label]) => `${rates[name]} ${label}`);
  return shown.length ? shown.join(" · ") : "none";
}

function refusalsText(refusals) {
  if (refusals === undefined) return "(not shown)";
  const entries = Object.entries(refusals);
  return entries.length ? entries.map(([limit, n]) => `${limit} ${n}`).join(" · ") : "none";
}

function limitsTable(table, caption, entries, label) {
  const head = el("tr");
  for (const title of [caption, "Budget", "Spent this window", "Resets", "Rate limits", "Refusals"]) head.append(el("th", title, { scope: "col" }));
  const thead = el("thead");
  thead.append(head);
  const body = el("tbody");
  for (const entry of entries) {
    const row = el("tr", null, { "data-name": entry.name });
    const reset = entry.budget ? entry.budget.resets_at.replace("T", " ").replace(/:00Z$/, " UTC") : NO_COST;
    row.append(
      el("th", label(entry), { scope: "row" }),
      el("td", budgetText(entry.budget), { "data-cell": "budget" }),
      el("td", spentText(entry.budget), { "data-cell": "spent" }),
      el("td", reset, { "data-cell": "resets" }),
      el("td", ratesText(entry.rate_limits), { "data-cell": "rates" }),
      el("td", refusalsText(entry.refusals), { "data-cell": "refusals" }),
    );
    body.append(row);
  }
  table.replaceChildren(el("caption", entries.length ? `Per ${caption.toLowerCase()}` : `Per ${caption.toLowerCase()}: none`), thead, body);
}

function limitsView(limits, own) {
  const section = $("limits");
  section.hidden = !limits;
  if (!limits) return;
  const keyLabel = (k) => (k.name ? (k.team ? `${k.name} (team ${k.team})` : k.name) : "(open gateway)");
  limitsTable($("limits-teams"), own ? "Your team" : "Team", limits.teams, (t) => t.name);
  limitsTable($("limits-keys"), own ? "Your key" : "Key", limits.keys, keyLabel);
  const since = limits.refusals_since.replace("T", " ").replace("Z", " UTC");
  $("limits-note").textContent =
    `Refusals since ${since}, counted by the process that answered (each worker counts its own). ` +
    "Spend is the budget's current window, as the gateway counts it to admit requests.";
}

// --- Usage: the ledger's reports (GET /v1/organizations/usage_report/messages), per team and key, today and
// this month, and a bar per day of the last 30 days, drawn here as SVG.

const DAY = 86_400_000;
const SVG = "http://www.w3.org/2000/svg";

function isoDay(ms) {
  return new Date(ms).toISOString().slice(0, 10) + "T00:00:00Z";
}

async function report(params, headers) {
  const query = new URLSearchParams();
  for (const [name, value] of params) query.append(name, value);
  const response = await fetch(`/v1/organizations/usage_report/messages?${query}`, { headers });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? `${body.error.type}: ${body.error.message}` : response.statusText);
  return body;
}

function sums(buckets, field) {
  const out = new Map();
  for (const bucket of buckets) {
    for (const r of bucket.results) {
      const name = r[field] || "(none)";
      const s = out.get(name) || { input: 0, output: 0, cost: null, requests: 0 };
      s.input += r.uncached_input_tokens + r.cache_read_input_tokens + r.cache_creation.ephemeral_5m_input_tokens;
      s.output += r.output_tokens;
      if (typeof r.cost_usd === "number") s.cost = (s.cost ?? 0) + r.cost_usd; // null: nothing of it had a price
      s.requests += r.requests;
      out.set(name, s);
    }
  }
  return out;
}

function usageTable(table, caption, today, month) {
  const head = el("tr");
  for (const title of [caption, "Requests today", "Tokens today", "Cost today", "Requests this month", "Tokens this month", "Cost this month"]) {
    head.append(el("th", title, { scope: "col" }));
  }
  const thead = el("thead");
  thead.append(head);
  const body = el("tbody");
  const zero = { input: 0, output: 0, cost: null, requests: 0 };
  const cost = (c) => (c === null ? NO_COST : `$${c.toFixed(4)}`);
  for (const name of [...month.keys()].sort()) {
    const t = today.get(name) || zero;
    const m = month.get(name);
    const row = el("tr", null, { "data-name": name });
    row.append(
      el("th", name, { scope: "row" }),
      el("td", t.requests, { "data-cell": "requests-today" }),
      el("td", t.input + t.output, { "data-cell": "tokens-today" }),
      el("td", cost(t.cost), { "data-cell": "cost-today" }),
      el("td", m.requests, { "data-cell": "requests-month" }),
      el("td", m.input + m.output, { "data-cell": "tokens-month" }),
      el("td", cost(m.cost), { "data-cell": "cost-month" }),
    );
    body.append(row);
  }
  table.replaceChildren(el("caption", `Per ${caption.toLowerCase()}`), thead, body);
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  if (text !== null) node.textContent = String(text);
  return node;
}

// A tick step of 1, 2 or 5 times a power of ten giving about `count` ticks up to `most` (whole tokens).
function tickStep(most, count = 4) {
  const raw = Math.max(most, 1) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const n = raw / magnitude;
  return Math.max(1, (n <= 1 ? 1 : n <= 2 ? 2 : n <= 5 ? 5 : 10) * magnitude);
}

function compact(n) {
  if (n >= 1e9) return `${+(n / 1e9).toFixed(1)}G`;
  if (n >= 1e6) return `${+(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${+(n / 1e3).toFixed(1)}k`;
  return String(n);
}

// Tokens per day as bars, with a y axis of token counts (ticks and grid lines), an x axis of dates (UTC) and each
// bar's exact count in its tooltip; drawn at the chart's own width so the text is not stretched.
function chart(buckets) {
  const box = $("usage-chart");
  const totals = buckets.map((b) => b.results.reduce((n, r) => n + r.uncached_input_tokens + r.output_tokens + r.cache_read_input_tokens + r.cache_creation.ephemeral_5m_input_tokens, 0));
  const W = Math.max(320, Math.round(box.getBoundingClientRect().width) || 620);
  const H = 200;
  const left = 64, right = 12, top = 12, bottom = 40;
  const base = H - bottom, plotH = base - top, plotW = W - left - right;
  const step = tickStep(Math.max(0, ...totals));
  const ceiling = Math.max(step, Math.ceil(Math.max(0, ...totals) / step) * step);
  const y = (v) => base - (v / ceiling) * plotH;
  box.setAttribute("viewBox", `0 0 ${W} ${H}`);
  box.dataset.ceiling = ceiling;
  const yAxis = svg("g", { class: "axis y-axis" });
  for (let v = 0; v <= ceiling; v += step) {
    const tick = svg("g", { class: "tick", "data-value": v });
    tick.append(
      svg("line", { class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v) }),
      svg("text", { x: left - 6, y: y(v), "text-anchor": "end", "dominant-baseline": "middle" }, compact(v)),
    );
    yAxis.append(tick);
  }
  yAxis.append(
    svg("line", { class: "domain", x1: left, x2: left, y1: top, y2: base }),
    svg("text", { class: "axis-title", transform: `translate(14 ${top + plotH / 2}) rotate(-90)`, "text-anchor": "middle" }, "Tokens"),
  );
  const width = plotW / Math.max(1, buckets.length);
  const xAxis = svg("g", { class: "axis x-axis" });
  xAxis.append(svg("line", { class: "domain", x1: left, x2: W - right, y1: base, y2: base }));
  const bars = buckets.map((bucket, i) => {
    const day = bucket.starting_at.slice(0, 10);
    const height = (totals[i] / ceiling) * plotH;
    const bar = svg("rect", {
      class: "bar",
      x: (left + i * width + 1).toFixed(1),
      width: Math.max(1, width - 2).toFixed(1),
      y: (base - height).toFixed(2),
      height: height.toFixed(2),
    });
    bar.dataset.day = day;
    bar.dataset.tokens = totals[i];
    bar.append(svg("title", {}, `${day}: ${totals[i]} tokens`));
    const last = i === buckets.length - 1;
    if (last || (buckets.length - 1 - i) % 7 === 0) {
      // a date every week, counted back from the last day (today), which always has one
      const x = left + (i + 0.5) * width;
      const tick = svg("g", { class: "tick", "data-day": day });
      tick.append(
        svg("line", { x1: x, x2: x, y1: base, y2: base + 4 }),
        svg("text", { x, y: base + 16, "text-anchor": "middle" }, day.slice(5)),
      );
      xAxis.append(tick);
    }
    return bar;
  });
  xAxis.append(svg("text", { class: "axis-title", x: left + plotW / 2, y: H - 4, "text-anchor": "middle" }, "Day (UTC, month-day)"));
  box.replaceChildren(yAxis, ...bars, xAxis);
}

async function refreshUsage(headers) {
  const today = Math.floor(Date.now() / DAY) * DAY;
  const first = new Date(today);
  const month = Date.UTC(first.getUTCFullYear(), first.getUTCMonth(), 1);
  const end = isoDay(today + DAY);
  const window = (start, group) => [["starting_at", isoDay(start)], ["ending_at", end], ["bucket_width", "1d"], ["limit", "31"], ...(group ? [["group_by[]", group]] : [])];
  try {
    const [teams, keys, days] = await Promise.all([
      report(window(month, "workspace_id"), headers),
      report(window(month, "api_key_id"), headers),
      report(window(today - 29 * DAY), headers),
    ]);
    const last = (body) => body.data.slice(-1);
    usageTable($("usage-teams"), "Team", sums(last(teams), "workspace_id"), sums(teams.data, "workspace_id"));
    usageTable($("usage-keys"), "Key", sums(last(keys), "api_key_id"), sums(keys.data, "api_key_id"));
    chart(days.data);
    $("usage-note").hidden = true;
  } catch (e) {
    $("usage-note").textContent = `No usage to show: ${e.message}`;
    $("usage-note").hidden = false;
  }
}

function schedule() {
  clearInterval(timer);
  timer = $("live").checked ? setInterval(refresh, 2000) : null;
}

$("controls").addEventListener("submit", (e) => {
  e.preventDefault();
  refresh();
});
$("live").addEventListener("change", schedule);
$("key").addEventListener("change", refresh);
refresh();
schedule();

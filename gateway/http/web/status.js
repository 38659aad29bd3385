// The status page: GET /v1/gateway/status (routes, breaker state, success rate, time to first event,
// streams in flight, request outcomes and token totals from the metrics registry), redrawn every 2 s. With a
// client key the document's scope is "key": the aliases it may use, their health, and its own usage today.

const $ = (id) => document.getElementById(id);
const TOKEN_TYPES = [
  ["input", "Input"],
  ["output", "Output"],
  ["cache_read", "Cache read"],
  ["cache_creation", "Cache write"],
];
let timer = null;

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
  for (const title of ["Provider", "Model", "State", "Success rate", "Time to first event", "In flight", "Requests", "Tokens"]) {
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
    $("status-error").hidden = true;
    const worker = body.worker && body.worker.workers > 1 ? ` · health from worker ${body.worker.pid} of ${body.worker.workers}` : "";
    $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}${worker}`;
    await refreshUsage(headers);
  } catch (e) {
    $("status-error").textContent = `Could not read the status: ${e.message}`;
    $("status-error").hidden = false;
  }
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
      const s = out.get(name) || { input: 0, output: 0, cost: 0, requests: 0 };
      s.input += r.uncached_input_tokens + r.cache_read_input_tokens + r.cache_creation.ephemeral_5m_input_tokens;
      s.output += r.output_tokens;
      s.cost += r.cost_usd || 0;
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
  const zero = { input: 0, output: 0, cost: 0, requests: 0 };
  for (const name of [...month.keys()].sort()) {
    const t = today.get(name) || zero;
    const m = month.get(name);
    const row = el("tr", null, { "data-name": name });
    row.append(
      el("th", name, { scope: "row" }),
      el("td", t.requests, { "data-cell": "requests-today" }),
      el("td", t.input + t.output, { "data-cell": "tokens-today" }),
      el("td", `$${t.cost.toFixed(4)}`, { "data-cell": "cost-today" }),
      el("td", m.requests, { "data-cell": "requests-month" }),
      el("td", m.input + m.output, { "data-cell": "tokens-month" }),
      el("td", `$${m.cost.toFixed(4)}`, { "data-cell": "cost-month" }),
    );
    body.append(row);
  }
  table.replaceChildren(el("caption", `Per ${caption.toLowerCase()}`), thead, body);
}

function chart(buckets) {
  const svg = $("usage-chart");
  const totals = buckets.map((b) => b.results.reduce((n, r) => n + r.uncached_input_tokens + r.output_tokens + r.cache_read_input_tokens + r.cache_creation.ephemeral_5m_input_tokens, 0));
  const most = Math.max(1, ...totals);
  const width = 620 / Math.max(1, buckets.length);
  svg.replaceChildren(
    ...buckets.map((bucket, i) => {
      const bar = document.createElementNS(SVG, "rect");
      const height = Math.round((totals[i] / most) * 150);
      bar.setAttribute("x", (i * width + 1).toFixed(1));
      bar.setAttribute("width", Math.max(1, width - 2).toFixed(1));
      bar.setAttribute("y", 155 - height);
      bar.setAttribute("height", height);
      bar.setAttribute("class", "bar");
      bar.dataset.day = bucket.starting_at.slice(0, 10);
      bar.dataset.tokens = totals[i];
      const title = document.createElementNS(SVG, "title");
      title.textContent = `${bar.dataset.day}: ${totals[i]} tokens`;
      bar.append(title);
      return bar;
    }),
  );
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

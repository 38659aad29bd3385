// The status page: GET /v1/gateway/status (routes, breaker state, success rate, time to first event,
// streams in flight, request outcomes and token totals from the metrics registry), redrawn every 2 s.

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

async function refresh() {
  const headers = {};
  const key = $("key").value.trim();
  if (key) headers["x-api-key"] = key;
  try {
    const response = await fetch("/v1/gateway/status", { headers });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? `${body.error.type}: ${body.error.message}` : response.statusText);
    const totals = Object.fromEntries(TOKEN_TYPES.map(([key]) => [key, 0]));
    for (const alias of body.aliases) for (const [key] of TOKEN_TYPES) totals[key] += alias.tokens[key] || 0;
    $("totals").replaceChildren(
      ...TOKEN_TYPES.flatMap(([key, label]) => [el("dt", label), el("dd", totals[key], { "data-total": key })]),
    );
    $("aliases").replaceChildren(...body.aliases.map(aliasSection));
    $("status-error").hidden = true;
    $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    $("status-error").textContent = `Could not read the status: ${e.message}`;
    $("status-error").hidden = false;
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

// The operator page's script: refreshes the decisions, who is limited and the store's health from
// /status.json and /limited, and runs the explain form (POST /explain) and resets
// (DELETE /counters). Everything it asks for is on this listener.
"use strict";

const $ = (id) => document.getElementById(id);
let status = null;

function text(tag, content, cls) {
  const el = document.createElement(tag);
  if (content !== undefined) el.textContent = content;
  if (cls) el.className = cls;
  return el;
}

function descriptorText(entries) {
  return entries.map((e) => e.key + "=" + e.value).join(", ");
}

// A small chart of a rule's allowed, denied and shadow-denied decisions per sample.
function spark(series) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 160 28");
  const max = Math.max(1, ...series.allowed, ...series.denied, ...series.shadow);
  for (const kind of ["allowed", "denied", "shadow"]) {
    if (kind === "shadow" && !series.shadow.some((v) => v > 0)) continue;
    const values = series[kind];
    const step = values.length > 1 ? 160 / (values.length - 1) : 0;
    const points = values.map((v, i) => (i * step).toFixed(1) + "," + (27 - (v / max) * 26).toFixed(1));
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("class", kind);
    line.setAttribute("points", points.join(" "));
    svg.appendChild(line);
  }
  return svg;
}

function renderHistory() {
  const samples = status.history.samples;
  for (const cell of document.querySelectorAll("td.history")) {
    const domain = cell.dataset.domain, rules = cell.dataset.rules.split(",");
    const series = { allowed: [], denied: [], shadow: [] };
    let allowed = 0, denied = 0, shadow = 0;
    for (const sample of samples) {
      const d = { allowed: 0, denied: 0, shadowDenied: 0 };
      for (const x of sample.decisions) {
        if (x.domain !== domain || !rules.includes(x.rule)) continue;
        d.allowed += x.allowed; d.denied += x.denied; d.shadowDenied += x.shadowDenied;
      }
      series.allowed.push(d.allowed);
      series.denied.push(d.denied);
      series.shadow.push(d.shadowDenied);
      allowed += d.allowed; denied += d.denied; shadow += d.shadowDenied;
    }
    cell.replaceChildren(spark(series), text("div", allowed + " allowed, "));
    const counts = cell.lastChild;
    counts.appendChild(text("span", denied + " denied", denied ? "denied" : ""));
    if (shadow) counts.appendChild(text("span", ", " + shadow + " shadow-denied"));
  }
}

function renderStore() {
  const s = status.store;
  $("store-health").textContent = s.serving ? "serving" : "NOT SERVING";
  $("store-health").className = s.serving ? "up" : "down";
  const last = status.history.samples[status.history.samples.length - 1];
  const parts = [s.kind, s.serving ? "reachable" : "not serving"];
  if (last && last.storeMeanMs !== null) parts.push("mean call " + last.storeMeanMs.toFixed(2) + " ms");
  if (last) parts.push(last.storeErrors + " errors in the last " + status.history.everySeconds + " s");
  const detail = $("store-detail");
  detail.replaceChildren(text("span", parts.join(" · ")));
  for (const node of s.nodes) {
    detail.appendChild(text("span", " · " + node.node + " "));
    detail.appendChild(text("span", node.up ? "up" : "down", node.up ? "up" : "down"));
  }
  if (status.config.lastError) {
    detail.appendChild(text("div", "last reload refused: " + status.config.lastError, "down"));
  }
}

async function refreshStatus() {
  const answer = await fetch("/status.json");
  status = await answer.json();
  renderHistory();
  renderStore();
  $("reset-form").hidden = !(status.resetEnabled && !status.hideValues);
}

async function refreshLimited() {
  const answer = await fetch("/limited");
  const list = await answer.json();
  const rows = list.entries.map((entry) => {
    const tr = document.createElement("tr");
    tr.appendChild(text("td", entry.domain));
    tr.appendChild(text("td", entry.rule));
    tr.appendChild(text("td", descriptorText(entry.entries), "key"));
    tr.appendChild(text("td", String(entry.denied), "denied"));
    tr.appendChild(text("td", entry.lastDeny));
    tr.appendChild(text("td", String(entry.replicas)));
    const actions = document.createElement("td");
    if (!(status && status.hideValues)) {
      const explain = text("button", "explain");
      explain.addEventListener("click", () => {
        $("explain-domain").value = entry.domain;
        $("explain-entries").value = entry.entries.map((e) => e.key + "=" + e.value).join("\n");
        runExplain();
      });
      actions.appendChild(explain);
      if (status && status.resetEnabled) {
        const reset = text("button", "reset");
        reset.addEventListener("click", () => resetKey(entry));
        actions.appendChild(reset);
      }
    }
    tr.appendChild(actions);
    return tr;
  });
  $("limited-rows").replaceChildren(...rows);
  $("limited-note").textContent = rows.length
    ? "Refreshes every two seconds; denies of the last minute, across replicas (" + list.replicas + ")."
    : "Nothing is being limited (no deny in the last minute).";
}

function requestBody(domain, lines) {
  const entries = lines
    .map((line) => line.trim())
    .filter((line) => line.length > 0)
    .map((line) => {
      const at = line.indexOf("=");
      return at < 0 ? { key: line, value: "" } : { key: line.slice(0, at), value: line.slice(at + 1) };
    });
  return JSON.stringify({ domain: domain, descriptors: [{ entries: entries }] });
}

async function runExplain() {
  const body = requestBody($("explain-domain").value, $("explain-entries").value.split("\n"));
  const out = $("explain-answer");
  const answer = await fetch("/explain", { method: "POST", body: body });
  if (!answer.ok) {
    out.replaceChildren(text("p", "HTTP " + answer.status + ": " + (await answer.text()), "down"));
    return;
  }
  const explained = await answer.json();
  const d = explained.descriptors[0];
  const summary = [explained.overallCode, d.outcome];
  if (d.rule) summary.push("rule " + (d.rule.name || d.rule.path));
  for (const c of d.counters) summary.push(c.holds + " of " + c.limit + " per " + c.window + " held, " + c.remaining + " remaining");
  out.replaceChildren(text("p", summary.join(" · "), explained.overallCode === "OK" ? "up" : "denied"),
    text("pre", JSON.stringify(explained, null, 2)));
}

async function resetKey(entry) {
  const body = JSON.stringify({ domain: entry.domain, descriptors: [{ entries: entry.entries }] });
  const answer = await fetch("/counters", {
    method: "DELETE",
    body: body,
    headers: { Authorization: "Bearer " + $("token").value },
  });
  $("explain-answer").replaceChildren(text("p", "reset: HTTP " + answer.status + " " + (await answer.text())));
  refreshLimited();
}

$("explain-form").addEventListener("submit", (event) => {
  event.preventDefault();
  runExplain();
});

// `#explain=DOMAIN&entries=k=v;k2=v2` fills the form and asks at once (a link to an explanation).
function explainFromHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (!params.has("explain")) return;
  $("explain-domain").value = params.get("explain");
  $("explain-entries").value = (params.get("entries") || "").split(";").join("\n");
  runExplain();
}

async function tick() {
  try {
    await refreshStatus();
    await refreshLimited();
  } catch (error) {
    $("limited-note").textContent = "Cannot reach the operator listener: " + error;
  }
}

tick();
explainFromHash();
setInterval(tick, 2000);

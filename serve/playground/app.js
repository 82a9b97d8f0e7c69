"use strict";
// The fastmode playground: one prompt raced on every tier over one persistent WebSocket
// (docs/protocol.md). Plain JS, no build step, nothing fetched from outside the server.

const PROTOCOL = "fastmode.responses.v1";
// serve.auth.KEY_SUBPROTOCOL: a browser cannot set Authorization on a WebSocket upgrade, so it
// offers the key as a subprotocol (base64url, no padding); the server selects PROTOCOL.
const KEY_SUBPROTOCOL = "fastmode.key.";
const ORDER = ["fast", "exact", "priority", "standard", "auto"];

const $ = (id) => document.getElementById(id);
const state = {
  ws: null, wsKey: null, opening: null,
  tiers: [],              // {name, model, service_tier}
  panes: new Map(),       // tier name -> pane element
  inflight: new Map(),    // response id -> run (one tier's response in the current race)
  race: 0,
};

// -- tiers -------------------------------------------------------------------------------------
// GET /v1/models lists each model with its lanes: a model on one lane is one tier; the full
// model's lanes are chosen by service_tier (priority -> "priority", exact -> "exact", standard ->
// "default").
function tiersFrom(models) {
  const tiers = [];
  for (const m of models) {
    if (m.id === "auto") {
      tiers.push({ name: "auto", model: "auto", service_tier: null });
      continue;
    }
    for (const lane of m.lanes || []) {
      const tier = m.lanes.length > 1 ? ({ priority: "priority", exact: "exact" }[lane] || "default") : null;
      tiers.push({ name: lane, model: m.id, service_tier: tier });
    }
  }
  const rank = (t) => (ORDER.indexOf(t.name) + 1) || ORDER.length + 1;
  return tiers.sort((a, b) => rank(a) - rank(b));
}

function apiKey() {
  return $("api-key").value.trim();
}

async function loadTiers() {
  const key = apiKey();
  let r;
  try {
    r = await fetch("/v1/models", { headers: key ? { Authorization: `Bearer ${key}` } : {} });
  } catch (e) {
    return keyStatus(`cannot reach the server: ${e.message}`, "error");
  }
  if (r.status === 401) {
    $("key-row").hidden = false;  // the server has keys: ask for one
    return keyStatus(key ? "unauthorized: wrong API key" : "this server needs an API key", "error");
  }
  if (!r.ok) return keyStatus(`GET /v1/models answered HTTP ${r.status}`, "error");
  keyStatus(key ? "key accepted" : "", "ok");
  state.tiers = tiersFrom((await r.json()).data);
  renderTiers();
}

function keyStatus(text, kind) {
  const el = $("key-status");
  el.textContent = text;
  el.dataset.kind = kind || "";
}

function renderTiers() {
  const box = $("tiers");
  for (const t of state.tiers) {
    if (state.panes.has(t.name)) continue;
    const label = document.createElement("label");
    const check = Object.assign(document.createElement("input"), { type: "checkbox", id: `tier-${t.name}`,
                                                                checked: true });
    label.append(check, ` ${t.name}`);
    box.append(label);
    const pane = $("pane-template").content.firstElementChild.cloneNode(true);
    pane.id = `pane-${t.name}`;
    pane.querySelector(".tier").textContent = t.name;
    pane.querySelector(".route").textContent =
      t.model === "auto" ? "model auto: the router picks the lane" : `${t.model}` +
        (t.service_tier ? ` · service_tier ${t.service_tier}` : "");
    $("panes").append(pane);
    state.panes.set(t.name, pane);
  }
  updateButtons();
}

// -- the WebSocket -----------------------------------------------------------------------------
function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function connect(key) {
  const open = state.ws && state.ws.readyState <= WebSocket.OPEN;
  if (open && state.wsKey === key) return state.opening;
  if (state.ws) state.ws.close(1000);  // a new key: a new connection
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const protocols = key ? [PROTOCOL, KEY_SUBPROTOCOL + base64url(key)] : [PROTOCOL];
  const ws = new WebSocket(`${scheme}://${location.host}/v1/responses`, protocols);
  state.ws = ws;
  state.wsKey = key;
  setConnection("connecting", "connecting…");
  state.opening = new Promise((resolve, reject) => {
    ws.onopen = () => {
      setConnection("open", `connected (${ws.protocol || "no subprotocol"})`);
      resolve(ws);
    };
    ws.onclose = (ev) => {
      const why = closeReason(ev);
      if (state.ws === ws) {
        state.ws = null;
        setConnection("closed", `closed: ${why}`);
      }
      reject(new Error(why));
      for (const run of [...state.inflight.values()]) {
        if (run.ws === ws) fail(run, why);  // the ones still waiting for it: race() reports them
      }
    };
  });
  state.opening.catch(() => {});  // reported by onclose
  ws.onmessage = (ev) => onEvent(JSON.parse(ev.data));
  return state.opening;
}

function closeReason(ev) {
  if (ev.code === 1008) return "unauthorized: missing or wrong API key (the server closed the WebSocket, 1008)";
  if (ev.code === 1006) return "the connection was lost or refused (1006)";
  return `the server closed the WebSocket (${ev.code}${ev.reason ? ": " + ev.reason : ""})`;
}

function setConnection(kind, text) {
  const el = $("connection");
  el.dataset.state = kind;
  el.textContent = text;
}

// -- a race ------------------------------------------------------------------------------------
function numberOr(text) {
  const n = Number(text);
  return text.trim() !== "" && Number.isFinite(n) ? n : text;  // not a number: the server says why
}

function requestBody() {
  const body = { input: $("prompt").value };
  const max = $("max-tokens").value;
  const temperature = $("temperature").value;
  if (max.trim() !== "") body.max_output_tokens = numberOr(max);
  if (temperature.trim() !== "") body.temperature = numberOr(temperature);
  if ($("ignore-eos").checked) body.ignore_eos = true;
  return body;
}

async function race(ev) {
  ev.preventDefault();
  const chosen = state.tiers.filter((t) => $(`tier-${t.name}`).checked);
  if (!chosen.length) return keyStatus("choose at least one tier", "error");
  cancelAll();  // a new race replaces the one still running
  state.inflight.clear();
  state.race += 1;
  const body = requestBody();
  const runs = chosen.map((t) => startRun(t, `${t.name}-${state.race}`));
  updateButtons();
  let ws;
  try {
    ws = await connect(apiKey());
  } catch (e) {
    return runs.forEach((run) => fail(run, e.message));
  }
  for (const run of runs) {
    if (!state.inflight.has(run.id)) continue;
    run.ws = ws;
    run.sentAt = performance.now();
    ws.send(JSON.stringify({ type: "response.create", id: run.id, model: run.tier.model,
                             service_tier: run.tier.service_tier, ...body }));
  }
}

function startRun(tier, id) {
  const pane = state.panes.get(tier.name);
  const run = { tier, id, pane, ws: null, sentAt: 0, firstAt: 0, firstTokens: 0, tokens: 0 };
  pane.querySelector(".text").textContent = "";
  pane.querySelector(".error").hidden = true;
  pane.querySelector(".hops").hidden = true;
  for (const dd of pane.querySelectorAll("dd")) dd.textContent = "-";
  setState(run, "waiting");
  state.inflight.set(id, run);
  return run;
}

function cancelAll() {
  for (const run of state.inflight.values()) {
    if (run.ws && run.ws.readyState === WebSocket.OPEN && run.pane.dataset.state !== "cancelling") {
      run.ws.send(JSON.stringify({ type: "response.cancel", id: run.id }));
      setState(run, "cancelling");
    }
  }
}

function updateButtons() {
  $("race").disabled = state.tiers.length === 0;
  $("cancel").disabled = state.inflight.size === 0;
}

// -- server events -----------------------------------------------------------------------------
function onEvent(e) {
  const run = state.inflight.get(e.id);
  if (!run) {
    if (e.type === "error" && e.id == null) keyStatus(`${e.code}: ${e.message}`, "error");
    return;  // a response of an earlier race, ended by its cancel
  }
  if (e.type === "response.created") created(run, e);
  else if (e.type === "response.output_text.delta") delta(run, e);
  else if (e.type === "response.completed") completed(run, e);
  else if (e.type === "response.cancelled") end(run, "cancelled");
  else if (e.type === "error") fail(run, `${e.code}: ${e.message}`, e.retry_after);
}

function created(run, e) {
  const r = e.route || {};
  let why = `lane ${e.lane} · ${e.model}`;
  if (r.by === "auto") {
    const cmp = r.difficulty <= r.threshold ? "≤" : ">";
    why = `auto chose ${e.lane} (${e.model}): prompt difficulty ${r.difficulty} ${cmp} threshold ${r.threshold}` +
      (r.fast_when ? ` (the fast lane takes the ${r.fast_when} side)` : "");
  }
  if (r.spilled_from) why += ` · spilled from ${r.spilled_from}, which was full`;
  run.pane.querySelector(".route").textContent = why;
  run.pane.dataset.lane = e.lane;
  setState(run, "streaming");
}

function delta(run, e) {
  const now = performance.now();
  run.pane.querySelector(".text").append(e.delta);
  run.tokens += e.tokens || 0;
  if (!run.firstAt) {
    run.firstAt = now;
    run.firstTokens = run.tokens;
    field(run, "ttft", `${ms(now - run.sentAt)} (browser)`);
  } else if (now > run.firstAt) {  // decode rate after the first delta, as the server reports it
    field(run, "tps", ((run.tokens - run.firstTokens) / ((now - run.firstAt) / 1000)).toFixed(0));
  }
  field(run, "tokens", String(run.tokens));
}

function completed(run, e) {
  const t = e.timing || {};
  const browser = run.firstAt ? ` · ${ms(run.firstAt - run.sentAt)} browser` : "";
  field(run, "ttft", t.ttft_s == null ? "-" : `${ms(t.ttft_s * 1000)} server${browser}`);
  field(run, "tps", t.decode_tokens_per_s == null ? "-" : t.decode_tokens_per_s.toFixed(0));
  field(run, "tokens", String(e.usage.output_tokens));
  field(run, "cost", e.cost_units.toPrecision(3));
  field(run, "finish", e.finish_reason);
  if (e.speculative) {  // the exact lane: the fast model drafted, the full model verified
    const s = e.speculative;
    run.pane.querySelector(".route").textContent +=
      ` · drafts accepted ${(s.acceptance_rate * 100).toFixed(0)}%, ${s.tokens_per_step.toFixed(2)} tokens per ` +
      `verify step (k=${s.draft_tokens})`;
  }
  if (e.hops && e.hops.length) heatmap(run.pane.querySelector(".hops"), e.hops);
  else if (e.lane === "fast") noHops(run.pane.querySelector(".hops"));
  end(run, "completed");
}

function fail(run, message, retryAfter) {
  const el = run.pane.querySelector(".error");
  el.textContent = retryAfter != null ? `${message} (retry after ${retryAfter} s)` : message;
  el.hidden = false;
  end(run, "error");
}

function end(run, kind) {
  setState(run, kind);
  state.inflight.delete(run.id);
  updateButtons();
}

function setState(run, kind) {
  run.pane.dataset.state = kind;
  run.pane.querySelector(".state").textContent = kind;
}

function field(run, name, text) {
  run.pane.querySelector(`[data-field="${name}"]`).textContent = text;
}

function ms(x) {
  return x < 10 ? `${x.toFixed(1)} ms` : `${x.toFixed(0)} ms`;
}

// -- the fast lane's chip-to-chip hops ---------------------------------------------------------
// response.completed.hops: per (sender, receiver) chip pair, hops, seconds in total and at most,
// bytes. Cells: mean microseconds per hop, coloured from the cheapest pair (blue) to the dearest (red).
function heatmap(figure, hops) {
  const chips = [...new Set(hops.flatMap((h) => [h.src, h.dst]))].sort();
  const nodes = new Set(chips.map((c) => c.split("/")[0]));
  const label = (c) => (nodes.size === 1 ? c.split("/").pop() : c);
  const mean = new Map(hops.map((h) => [`${h.src}|${h.dst}`, (h.seconds / h.count) * 1e6]));
  const values = [...mean.values()];
  const lo = Math.min(...values), hi = Math.max(...values);
  const table = figure.querySelector("table");
  table.textContent = "";
  const head = table.insertRow();
  head.insertCell().textContent = "from \\ to";
  for (const c of chips) head.insertCell().textContent = label(c);
  for (const src of chips) {
    const row = table.insertRow();
    row.insertCell().textContent = label(src);
    for (const dst of chips) {
      const cell = row.insertCell();
      const us = mean.get(`${src}|${dst}`);
      if (us == null) continue;
      const t = hi > lo ? (us - lo) / (hi - lo) : 0;
      cell.style.background = `hsl(${210 - 210 * t}, 70%, ${82 - 30 * t}%)`;
      cell.textContent = us.toFixed(0);
      const h = hops.find((x) => x.src === src && x.dst === dst);
      cell.title = `${src} → ${dst}: ${h.count} hops, mean ${us.toFixed(1)} µs, slowest ` +
        `${(h.max_seconds * 1e6).toFixed(0)} µs, ${h.bytes} bytes`;
    }
  }
  const n = hops.reduce((a, h) => a + h.count, 0);
  const total = hops.reduce((a, h) => a + h.seconds, 0);
  const kib = hops.reduce((a, h) => a + h.bytes, 0) / 1024;
  figure.querySelector("figcaption").textContent =
    `chip-to-chip hops: ${n}, mean ${(total / n * 1e6).toFixed(0)} µs each (µs per hop below), ${kib.toFixed(0)} KiB`;
  figure.hidden = false;
}

function noHops(figure) {
  figure.querySelector("table").textContent = "";
  figure.querySelector("figcaption").textContent = "one chip: no chip-to-chip hops to show";
  figure.hidden = false;
}

// -- wiring ------------------------------------------------------------------------------------
$("controls").addEventListener("submit", race);
$("cancel").addEventListener("click", () => { cancelAll(); updateButtons(); });
$("api-key").addEventListener("change", loadTiers);
updateButtons();
loadTiers();

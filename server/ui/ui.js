/*
 * ui.js - the dashboard (GET /): plain JavaScript, no library, speaking only
 * the public API of docs/API.md with the key the user enters (kept in
 * sessionStorage, sent as Authorization: Bearer). Models, a playground
 * (streamed generation; a text scored token by token), attention, sessions
 * and a metrics strip.
 */
"use strict";

const $ = (id) => document.getElementById(id);
const LN2 = Math.log(2);
/* the page of the jobs listener (jobs.html) keeps its admin key apart */
const JOBS = document.body.dataset.listener === "jobs";
const KEY_NAME = JOBS ? "spanserve-admin-key" : "spanserve-key";
let key = sessionStorage.getItem(KEY_NAME) || "";
let models = [];

/* ------------------------------------------------------------ requests */

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function showError(msg) {
  const e = $("error-msg");
  e.textContent = msg || "";
  e.hidden = !msg;
}

/* aria-busy on the body while a request waits for its answer's headers */
let inflight = 0;
function busy(d) {
  inflight += d;
  document.body.setAttribute("aria-busy", inflight > 0 ? "true" : "false");
}

/* fetch() with the key; a non-2xx answer throws an ApiError carrying the
 * server's message (a 401 also shows the banner asking for the key). */
async function api(path, opts = {}) {
  const headers = Object.assign({}, opts.headers || {});
  if (key) headers["Authorization"] = "Bearer " + key;
  if (opts.json !== undefined) {
    headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(opts.json);
  }
  let r;
  busy(1);
  try {
    r = await fetch(path, { method: opts.method || "GET", headers, body: opts.body, signal: opts.signal, cache: "no-store" });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "the server could not be reached (" + e.message + ")");
  } finally {
    busy(-1);
  }
  if (r.status === 401) {
    if ($("auth-msg").hidden && document.activeElement === document.body) $("key").focus();   /* where to type it */
    $("auth-msg").hidden = false;
    const what = JOBS ? "an admin key" : "an API key";
    throw new ApiError(401, key ? "the key was refused: enter a valid one" : "this server needs " + what);
  }
  if (!r.ok) {
    let msg = "HTTP " + r.status;
    try { const j = await r.json(); if (j && j.error && j.error.message) msg += ": " + j.error.message; } catch (e) { /* not JSON */ }
    throw new ApiError(r.status, msg);
  }
  $("auth-msg").hidden = true;
  return r;
}

async function apiJson(path, opts) { return (await api(path, opts)).json(); }

/* Runs FN, showing its error in STATUS (an element) or the page's banner. */
async function guarded(fn, status) {
  try {
    await fn();
  } catch (e) {
    if (e.name === "AbortError") return;
    const msg = e instanceof ApiError ? e.message : "error: " + e.message;
    if (e instanceof ApiError && e.status === 401) {
      if (status) status.textContent = msg;
      return;
    }
    if (status) status.textContent = msg; else showError(msg);
  }
}

/* ------------------------------------------------------------ helpers */

function el(tag, props, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of kids) e.append(c);
  return e;
}

function bytes(n) {
  if (!isFinite(n)) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + u[i];
}

function count(n) {
  if (!isFinite(n)) return "–";
  if (n >= 1e9) return (n / 1e9).toFixed(2) + " G";
  if (n >= 1e6) return (n / 1e6).toFixed(2) + " M";
  if (n >= 1e4) return (n / 1e3).toFixed(1) + " k";
  return String(Math.round(n));
}

/* A token's text shown visibly (a newline stays a newline). */
function visible(t) { return t === "" ? "∅" : t; }
function quoted(t) { return JSON.stringify(t); }

/* The colour of a surprise of BITS: pale yellow (expected) to red (surprising);
 * light enough everywhere for black text. */
function surpriseColour(bits) {
  const x = Math.max(0, Math.min(1, bits / 10));
  return "hsl(" + Math.round(55 - 55 * x) + ", 95%, " + Math.round(92 - 30 * x) + "%)";
}

function setOptions(sel, values, keep) {
  const old = keep ? sel.value : "";
  sel.replaceChildren(...values.map(([v, label]) => el("option", { value: v, text: label })));
  if (values.some(([v]) => v === old)) sel.value = old;
}

/* An <img> showing an SVG fetched with the key (an <img src> could not send it). */
async function showSvg(img, path) {
  const r = await api(path);
  const blob = await r.blob();
  if (img.dataset.url) URL.revokeObjectURL(img.dataset.url);
  img.dataset.url = URL.createObjectURL(blob);
  img.src = img.dataset.url;
}

/* ------------------------------------------------------------ models */

async function loadModels() {
  const j = await apiJson("/v1/models");
  models = j.data || [];
  const body = $("model-table").tBodies[0];
  body.replaceChildren(...models.map((m) => el("tr", {},
    el("td", {}, el("button", { type: "button", class: "link", "aria-label": "show model " + m.name, onclick: () => guarded(() => showModel(m.name)) , text: m.name })),
    el("td", { text: m.family }), el("td", { text: m.tokenizer || "" }),
    el("td", { class: "num", text: count(m.parameters), title: String(m.parameters) }),
    el("td", { text: m.device }), el("td", { text: m.precision }),
    el("td", { class: "num", text: bytes((m.cost && m.cost.session_bytes) || (m.memory && m.memory.bytes_per_stream)) }),
    el("td", {}, el("button", { type: "button", text: "Unload", "aria-label": "unload model " + m.name,
      onclick: () => guarded(() => unloadModel(m.name), $("load-status")) })))));
  const opts = models.map((m) => [m.name, m.name + " (" + m.family + ")"]);
  for (const id of ["g-model", "a-model", "n-model", "i-model"]) setOptions($(id), opts, true);
  if (models.length && $("model-detail").hidden) await showModel(models[0].name);
  await loadHeads();
}

/* POST /v1/models: NAME from a path in the server's --model-dir, or from an
 * https URL; the server's message (400, 403, 404, 409, 413, ...) is shown. */
async function loadModel() {
  const status = $("load-status");
  const name = $("l-name").value.trim(), path = $("l-path").value.trim(), url = $("l-url").value.trim();
  if (!path === !url) { status.textContent = "give either a path in the model directory or an https URL"; return; }
  if (url && !/^https:/i.test(url)) { status.textContent = "the server fetches models over https only"; return; }
  const b = { name };
  if (path) b.path = path; else { b.url = url; if ($("l-replace").checked) b.replace = true; }
  status.textContent = "loading " + name + "…";
  $("l-go").disabled = true;
  try {
    const m = await apiJson("/v1/models", { method: "POST", json: b });
    status.textContent = "loaded " + m.name + " (" + m.family + ", " + count(m.parameters) + " parameters)";
  } finally { $("l-go").disabled = false; }
  await loadModels();
}

/* DELETE /v1/models/NAME (its sessions go with it). */
async function unloadModel(name) {
  if (!confirm("Unload model " + name + "? Its sessions are deleted with it.")) return;
  await api("/v1/models/" + encodeURIComponent(name), { method: "DELETE" });
  $("load-status").textContent = "unloaded " + name;
  if ($("model-detail-h").textContent === name) $("model-detail").hidden = true;
  delete headsOf[name];
  await loadModels();
  await loadSessions();
}

async function showModel(name) {
  const m = await apiJson("/v1/models/" + encodeURIComponent(name));
  $("model-detail").hidden = false;
  $("model-detail-h").textContent = m.name;
  const c = m.config || {};
  const bits = [m.family, m.tokenizer + " tokenizer", count(m.parameters) + " parameters", "vocabulary " + m.vocab_size,
    "block " + m.block_len + " tokens", "memory mode " + (m.memory && m.memory.mode),
    bytes(m.memory && m.memory.bytes_per_stream) + " a session", m.device + " / " + m.precision];
  if (m.cost && m.cost.flops_per_token) bits.push(count(m.cost.flops_per_token) + "FLOP a token");
  if (c.attn_span) bits.push("attn_span " + c.attn_span);
  if (c.mem_len) bits.push("mem_len " + c.mem_len);
  $("model-detail-text").textContent = bits.join(" · ");
  const img = $("spans-img");
  img.alt = m.family === "adaptive-span" ? "The learned attention span of each head of " + m.name + ", layers by heads"
    : "The block sequence of " + m.name + " with each block's architecture weights";
  $("spans-cap").textContent = m.family === "adaptive-span" ? "Learned spans: a row per layer, a column per head."
    : "Blocks and the softmax of their architecture weights (attn, ffn, skip).";
  try {
    await showSvg(img, "/v1/models/" + encodeURIComponent(name) + "/spans?format=svg");
  } catch (e) {
    img.removeAttribute("src");
    $("spans-cap").textContent = "No span picture: " + e.message;
  }
}

/* ------------------------------------------------------------ playground */

let genAbort = null;

function genBody(stream) {
  const b = { prompt: $("g-prompt").value, max_tokens: Number($("g-max").value), temperature: Number($("g-temp").value),
    top_k: Number($("g-topk").value), top_p: Number($("g-topp").value), stream };
  const sess = $("g-session").value;
  if (sess) b.session = sess; else b.model = $("g-model").value;
  if ($("g-seed").value !== "") b.seed = Number($("g-seed").value);
  const stop = $("g-stop").value.replace(/\\n/g, "\n").replace(/\\t/g, "\t");
  if (stop) b.stop = stop;
  return b;
}

/* Reads a text/event-stream body, calling ON(event, data) for each event. */
async function readSse(resp, on) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let ev = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        if (line.startsWith("event:")) ev = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) on(ev, data.join("\n"));
    }
  }
}

async function generate() {
  const out = $("gen-out"), status = $("gen-status");
  out.replaceChildren();
  status.textContent = "generating…";
  genAbort = new AbortController();
  $("g-go").disabled = true;
  $("g-cancel").disabled = false;
  let n = 0;
  try {
    await guarded(async () => {
      const r = await api("/v1/generate", { method: "POST", json: genBody(true), signal: genAbort.signal });
      await readSse(r, (ev, data) => {
        const d = JSON.parse(data);
        if (ev === "token") {
          n++;
          const s = el("span", { text: d.text, title: "token " + d.index + ": log p = " + Number(d.logprob).toFixed(3) });
          out.append(s);
          out.scrollTop = out.scrollHeight;
          status.textContent = "generating… " + n + " tokens";
        } else if (ev === "done") {
          const t = d.timings || {};
          status.textContent = "done: " + (d.usage ? d.usage.completion_tokens : n) + " tokens, finish_reason " + d.finish_reason +
            ", seed " + d.seed + (t.tokens_per_second ? ", " + Math.round(t.tokens_per_second) + " tokens/s" : "");
          out.dataset.done = "1";
        } else if (ev === "error") {
          status.textContent = "error: " + ((d.error && d.error.message) || data);
        }
      });
    }, status);
  } finally {
    if (genAbort.signal.aborted) status.textContent = "stopped after " + n + " tokens";
    genAbort = null;
    $("g-go").disabled = false;
    $("g-cancel").disabled = true;
    refreshMetrics();
  }
}

/* A token's description: its log-probability, surprise and alternatives. */
function tokenInfo(tok, lp, top) {
  let s = quoted(tok);
  if (lp === null || lp === undefined) return s + ": the first token (nothing predicts it)";
  s += ": log p = " + lp.toFixed(3) + " (" + (-lp / LN2).toFixed(2) + " bits)";
  if (top) {
    const alts = Object.entries(top).sort((a, b) => b[1] - a[1]).map(([t, v]) => quoted(t) + " " + v.toFixed(2));
    s += "; likeliest: " + alts.join(", ");
  }
  return s;
}

let scored = null;   /* {model, text, tokens, offsets} of the last scored text */

async function scoreText() {
  const out = $("score-out"), status = $("score-status");
  const text = $("g-prompt").value, model = $("g-model").value;
  status.textContent = "scoring…";
  await guarded(async () => {
    const j = await apiJson("/v1/completions", { method: "POST",
      json: { model, prompt: text, echo: true, logprobs: 5, max_tokens: 0 } });
    const lp = j.choices[0].logprobs;
    out.replaceChildren();
    let bits = 0, n = 0;
    lp.tokens.forEach((tok, i) => {
      const l = lp.token_logprobs[i], info = tokenInfo(tok, l, lp.top_logprobs[i]);
      const s = el("span", { class: "tok", tabindex: "0", role: "button", title: info, "aria-label": info, "data-i": String(i) });
      s.textContent = tok;
      if (l !== null && l !== undefined) {
        s.style.background = surpriseColour(-l / LN2);
        bits += -l / LN2; n++;
      }
      const show = () => { $("tok-info").textContent = info; };
      s.addEventListener("mouseenter", show);
      s.addEventListener("focus", show);
      const pick = () => guarded(() => attendFrom(model, text, i), $("att-status"));
      s.addEventListener("click", pick);
      s.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(); } });
      out.append(s);
    });
    scored = { model, text };
    status.textContent = n ? lp.tokens.length + " tokens, " + (bits / n).toFixed(3) + " bits per token on average" : lp.tokens.length + " tokens";
  }, status);
  refreshMetrics();
}

/* From a scored token: the attention view of that text, from that token. */
async function attendFrom(model, text, i) {
  $("a-model").value = model;
  if ($("a-text").value !== text || att.model !== model) {
    $("a-text").value = text;
    await loadHeads();
    await runAttention();
  }
  selectQuery(i);
  $("attention").scrollIntoView({ block: "start" });
}

/* ------------------------------------------------------------ attention */

const headsOf = {};   /* model -> [[layer, head], ...] */
let att = { model: null, data: null, sel: -1 };

/* The attention layers and heads of the selected model, asked from the
 * server once (a one-token text, every head, top_k 1). */
async function loadHeads() {
  const model = $("a-model").value;
  if (!model) return;
  if (!headsOf[model]) {
    const text = ($("a-text").value || "a").slice(0, 8);
    try {
      const j = await apiJson("/v1/attention", { method: "POST", json: { model, text, top_k: 1 } });
      headsOf[model] = j.heads.map((h) => [h.layer, h.head]);
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) throw e;
      headsOf[model] = [];
      $("att-status").textContent = e.message;
    }
  }
  const layers = [...new Set(headsOf[model].map((h) => h[0]))];
  setOptions($("a-layer"), layers.map((l) => [String(l), String(l)]), true);
  fillHeads();
}

function fillHeads() {
  const model = $("a-model").value, layer = Number($("a-layer").value);
  const heads = (headsOf[model] || []).filter((h) => h[0] === layer).map((h) => h[1]);
  setOptions($("a-head"), heads.map((h) => [String(h), String(h)]), true);
}

async function runAttention() {
  const status = $("att-status");
  const body = { model: $("a-model").value, text: $("a-text").value, layer: Number($("a-layer").value), head: Number($("a-head").value) };
  status.textContent = "computing…";
  const j = await apiJson("/v1/attention", { method: "POST", json: body });
  att = { model: body.model, data: j, sel: -1 };
  const box = $("att-tokens");
  box.replaceChildren(...j.tokens.map((t, i) => {
    const s = el("span", { class: "tok", tabindex: "0", role: "button", "data-i": String(i), "aria-label": "token " + i + " " + quoted(t.text) });
    s.textContent = t.text.replace(/\n/g, "↵\n");   /* a newline shows, to be shaded */
    s.addEventListener("click", () => selectQuery(i));
    s.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); selectQuery(i); } });
    return s;
  }));
  $("att-list").replaceChildren();
  status.textContent = j.tokens.length + " tokens, layer " + body.layer + " head " + body.head + ": click a token";
  const fig = $("att-fig");
  if (j.tokens.length <= 256) {
    try {
      await showSvgPost($("att-img"), "/v1/attention?format=svg", body);
      $("att-img").alt = "Heat map of layer " + body.layer + " head " + body.head + " over the text";
      fig.hidden = false;
    } catch (e) { fig.hidden = true; }
  } else fig.hidden = true;
}

/* The heat map: POST with the same body, the answer an SVG. */
async function showSvgPost(img, path, body) {
  const r = await api(path, { method: "POST", json: body });
  const blob = await r.blob();
  if (img.dataset.url) URL.revokeObjectURL(img.dataset.url);
  img.dataset.url = URL.createObjectURL(blob);
  img.src = img.dataset.url;
}

function selectQuery(i) {
  const j = att.data;
  if (!j) return;
  const head = j.heads[0], row = head && head.rows.find((r) => r.query === i);
  const spans = $("att-tokens").children;
  for (const s of spans) { s.style.background = ""; s.classList.remove("sel"); s.removeAttribute("title"); }
  if (!row || !spans[i]) return;
  att.sel = i;
  spans[i].classList.add("sel");
  const w = new Map();
  row.keys.forEach((k, n) => w.set(k, row.weights[n]));
  let max = 0;
  for (const v of w.values()) max = Math.max(max, v);
  /* shaded by the square root of the weight over the row's largest, so
   * that small weights still show beside a dominant one */
  for (const [k, v] of w) {
    if (!spans[k]) continue;
    spans[k].style.background = "rgba(11, 87, 208, " + (max > 0 ? 0.7 * Math.sqrt(v / max) : 0).toFixed(3) + ")";
    spans[k].title = "weight " + v.toFixed(4);
  }
  const top = [...w.entries()].sort((a, b) => b[1] - a[1]).slice(0, 12);
  const items = top.map(([k, v]) => el("li", { text: k + " " + quoted(j.tokens[k] ? j.tokens[k].text : "") + "  " + v.toFixed(4) }));
  if (row.before_start) items.push(el("li", { text: "before the start  " + row.before_start.toFixed(4) }));
  if (row.persistent) items.push(el("li", { text: "persistent memory  " + row.persistent.toFixed(4) }));
  $("att-list").replaceChildren(...items);
  $("att-status").textContent = "token " + i + " " + quoted(j.tokens[i].text) + " (layer " + head.layer + ", head " + head.head +
    ") looked at " + w.size + " positions; row sum " + row.sum.toFixed(4);
}

/* ------------------------------------------------------------ sessions */

async function loadSessions() {
  const j = await apiJson("/v1/sessions");
  const list = j.sessions || [];
  const body = $("sess-table").tBodies[0];
  body.replaceChildren(...list.map((s) => {
    const id = encodeURIComponent(s.id);
    return el("tr", {},
      el("td", { text: s.id }), el("td", { text: s.model }), el("td", { class: "num", text: String(s.tokens_seen) }),
      el("td", { class: "num", text: bytes(s.memory_bytes) }), el("td", { text: s.location }), el("td", { text: s.saved ? "yes" : "no" }),
      el("td", { text: s.last_used }),
      el("td", {},
        el("button", { type: "button", text: "Inspect", "aria-label": "inspect session " + s.id,
          onclick: () => guarded(async () => {
            const d = $("sess-detail");
            d.textContent = JSON.stringify(await apiJson("/v1/sessions/" + id), null, 2);
            d.hidden = false;
          }, $("sess-status")) }), " ",
        el("button", { type: "button", text: "Export", "aria-label": "export session " + s.id,
          onclick: () => guarded(async () => {
            const blob = await (await api("/v1/sessions/" + id + "/state")).blob();
            const a = el("a", { href: URL.createObjectURL(blob), download: s.id + ".state" });
            document.body.append(a); a.click(); a.remove();
            setTimeout(() => URL.revokeObjectURL(a.href), 10000);
            $("sess-status").textContent = "exported " + s.id + " (" + bytes(blob.size) + ")";
          }, $("sess-status")) }), " ",
        el("button", { type: "button", text: "Delete", "aria-label": "delete session " + s.id,
          onclick: () => guarded(async () => {
            if (!confirm("Delete session " + s.id + "?")) return;
            await api("/v1/sessions/" + id, { method: "DELETE" });
            $("sess-status").textContent = "deleted " + s.id;
            await loadSessions();
          }, $("sess-status")) })));
  }));
  setOptions($("g-session"), [["", "none"]].concat(list.map((s) => [s.id, s.id + " (" + s.model + ")"])), true);
}

/* ------------------------------------------------------------ metrics */

function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const v = Number(m[3]);
    if (!isFinite(v)) continue;
    (out[m[1]] = out[m[1]] || []).push([m[2] || "", v]);
  }
  return out;
}

function msum(ms, name, label) {
  return (ms[name] || []).filter(([l]) => !label || l.includes(label)).reduce((a, [, v]) => a + v, 0);
}

async function refreshMetrics() {
  if (!$("auth-msg").hidden) return;   /* waiting for a key: no 401 every few seconds */
  try {
    const ms = parseMetrics(await (await api("/metrics")).text());
    $("m-requests").textContent = count(msum(ms, "spanserve_requests_total"));
    $("m-generated").textContent = count(msum(ms, "spanserve_tokens_generated_total"));
    $("m-scored").textContent = count(msum(ms, "spanserve_tokens_scored_total"));
    $("m-queue").textContent = count(msum(ms, "spanserve_queue_depth"));
    $("m-sessions").textContent = count(msum(ms, "spanserve_sessions", 'state="live"'));
    $("m-memory").textContent = bytes(msum(ms, "spanserve_session_memory_bytes"));
  } catch (e) { /* the strip keeps its last numbers; a 401 shows the banner */ }
}

/* ------------------------------------------------------------ jobs (jobs.html) */

const TINY = {
  "adaptive-span": { hidden_size: 16, inner_hidden_size: 32, nb_heads: 2, nb_layers: 2, attn_span: 32, block_size: 16,
    batch_size: 4, steps: 200, log_every: 20, eval_every: 100, checkpoint_every: 100, eval_tokens: 500 },
  "par-transformer-xl": { n_blocks: 4, n_head: 2, d_model: 16, d_head: 8, d_inner: 32, mem_len: 16, tgt_len: 16,
    batch_size: 4, steps: 200, search_steps: 100, log_every: 20, eval_every: 100, checkpoint_every: 100, eval_tokens: 500 },
};

async function loadFiles() {
  const j = await apiJson("/v1/files");
  setOptions($("j-file"), (j.files || []).map((f) => [f.id, f.name + " (" + f.id + ", " + bytes(f.bytes) + ")"]), true);
}

const num = (v, d) => (typeof v === "number" ? v.toFixed(d) : "–");

async function loadJobs() {
  const j = await apiJson("/v1/jobs");
  const body = $("jobs-table").tBodies[0];
  body.replaceChildren(...(j.jobs || []).map((job) => {
    const id = encodeURIComponent(job.id);
    const act = (label, fn) => el("button", { type: "button", text: label, "aria-label": label.toLowerCase() + " job " + job.id,
      onclick: () => guarded(fn, $("j-status")) });
    const post = (what) => async () => {
      await api("/v1/jobs/" + id + "/" + what, { method: "POST" });
      $("j-status").textContent = what + ": " + job.id;
      await loadJobs();
    };
    return el("tr", {},
      el("td", { text: job.id }), el("td", { text: job.status + (job.cancelling ? " (cancelling)" : "") }),
      el("td", { text: job.family }), el("td", { text: job.device || "" }),
      el("td", { class: "num", text: (job.step || 0) + " / " + job.steps }), el("td", { class: "num", text: num(job.loss, 3) }),
      el("td", { class: "num", text: num(job.val_bpc, 3) }), el("td", { class: "num", text: num(job.tokens_per_s, 0) }),
      el("td", {}, act("Follow", () => follow(job.id)), " ", act("Cancel", post("cancel")), " ", act("Resume", post("resume")), " ",
        act("Delete", async () => {
          if (!confirm("Delete job " + job.id + " and its directory?")) return;
          await api("/v1/jobs/" + id, { method: "DELETE" });
          $("j-status").textContent = "deleted " + job.id;
          await loadJobs();
        })));
  }));
}

let followAbort = null;

/* ---- the followed job's history, drawn here as inline SVG (no library) */

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...kids) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of kids) e.append(c);
  return e;
}
function svgTitle(text) { const t = svg("title"); t.textContent = text; return t; }
function svgText(x, y, text, attrs) { const t = svg("text", Object.assign({ x, y, "font-size": 11, fill: "#1a1a1a" }, attrs || {})); t.textContent = text; return t; }
const short = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2));

/* hist: the job's `train` lines in order ({step, loss, val_bpc?, spans | arch_weights});
 * vals: [step, val_bpc] of every evaluation (train lines and `done`). */
let hist = { family: "", train: [], vals: [], playing: null, steps: 0, timer: null, top: 1 };

/* A line chart of POINTS ([x, y], x ascending) in BOX, labelled LABEL. */
function lineChart(box, points, label, colour, xmax) {
  const W = 480, H = 200, L = 46, R = 10, T = 12, B = 30;
  const root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": label + ": " +
    (points.length ? points.length + " points, last " + short(points[points.length - 1][1]) + " at step " + points[points.length - 1][0] : "no points yet"),
    "data-points": points.length });
  root.append(svgTitle(label));
  root.append(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "#fff", stroke: "#c8c8c8" }));
  if (points.length) {
    const ys = points.map((p) => p[1]);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const x1 = Math.max(xmax || 0, points[points.length - 1][0], 1);
    const X = (x) => L + (W - L - R) * x / x1, Y = (y) => T + (H - T - B) * (1 - (y - y0) / (y1 - y0));
    for (const f of [0, 0.5, 1]) {
      const v = y0 + (y1 - y0) * f;
      root.append(svg("line", { x1: L - 4, x2: L, y1: Y(v), y2: Y(v), stroke: "#4a4a4a" }));
      root.append(svgText(L - 6, Y(v) + 4, short(v), { "text-anchor": "end" }));
    }
    for (const f of [0, 0.5, 1]) root.append(svgText(X(x1 * f), H - 12, String(Math.round(x1 * f)), { "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle" }));
    root.append(svgText(W - R, H - 1, "step", { "text-anchor": "end", fill: "#4a4a4a" }));
    root.append(svg("polyline", { points: points.map((p) => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" "),
      fill: "none", stroke: colour, "stroke-width": 2 }));
    if (points.length <= 300) for (const p of points) root.append(svg("circle", { cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 3, fill: colour },
      svgTitle("step " + p[0] + ": " + p[1].toFixed(4))));
  } else root.append(svgText(W / 2, H / 2, "no points yet", { "text-anchor": "middle", fill: "#4a4a4a" }));
  box.replaceChildren(root);
}

function drawCurves() {
  $("curves").hidden = false;
  lineChart($("loss-chart"), hist.train.filter((t) => typeof t.loss === "number").map((t) => [t.step, t.loss]),
    "Training loss (nats) against the step", "#0b57d0", hist.steps);
  lineChart($("bpc-chart"), hist.vals, "Validation bpc against the step", "#b3261e", hist.steps);
}

/* What a train line tells per layer (adaptive-span) or per block (PAR). */
function barsOf(t) {
  if (Array.isArray(t.spans)) return t.spans.map((s) => ({ label: "layer " + s.layer, values: [s.mean, s.max], names: ["mean", "max"] }));
  if (Array.isArray(t.arch_weights)) return t.arch_weights.map((w, i) => ({ label: "block " + i, values: w, names: ["attn", "ffn", "skip"] }));
  return [];
}

const BAR_COLOURS = ["#0b57d0", "#8a5300", "#4a4a4a"];

/* The bar chart of history entry I, and the slider's text. */
function drawBars(i) {
  const t = hist.train[i];
  if (!t) return;
  const groups = barsOf(t), par = !Array.isArray(t.spans);
  const top = par ? 1 : hist.top;   /* spans: one scale for every step (the largest seen) */
  const W = 480, L = 70, R = 60, rowH = par ? 42 : 30, T = 22, H = T + groups.length * rowH + 6;
  const root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "data-index": i,
    "aria-label": (par ? "Block weights" : "Spans") + " at step " + t.step });
  const names = groups.length ? groups[0].names : [];
  names.forEach((n, k) => {
    root.append(svg("rect", { x: L + k * 90, y: 4, width: 10, height: 10, fill: BAR_COLOURS[k] }));
    root.append(svgText(L + k * 90 + 14, 13, n));
  });
  const bh = (rowH - 8) / names.length;
  groups.forEach((g, r) => {
    const y = T + r * rowH;
    root.append(svgText(L - 6, y + rowH / 2, g.label, { "text-anchor": "end" }));
    g.values.forEach((v, k) => {
      const w = Math.max(0, (W - L - R) * v / top);
      root.append(svg("rect", { class: "bar", x: L, y: (y + k * bh).toFixed(1), width: w.toFixed(1), height: (bh - 1).toFixed(1), fill: BAR_COLOURS[k] },
        svgTitle(g.label + " " + g.names[k] + " " + v.toFixed(4))));
      root.append(svgText(L + w + 4, y + k * bh + bh - 2, par ? v.toFixed(2) : short(v), { "font-size": 10 }));
    });
  });
  $("anim-chart").replaceChildren(root);
  const desc = "step " + t.step + " (" + (i + 1) + " of " + hist.train.length + "): " +
    groups.map((g) => g.label + " " + g.names.map((n, k) => n + " " + (par ? g.values[k].toFixed(2) : short(g.values[k]))).join(" ")).join("; ");
  $("anim-step").setAttribute("aria-valuetext", "step " + t.step);
  $("anim-text").textContent = desc;
}

function updateAnim(follow) {
  const n = hist.train.length;
  if (!n || !barsOf(hist.train[n - 1]).length) return;
  const s = $("anim-step"), wasEnd = Number(s.value) >= Number(s.max);
  $("anim").hidden = false;
  const par = hist.family === "par-transformer-xl";
  $("anim-h").textContent = par ? "Block weights over training" : "Spans over training";
  $("anim-cap").textContent = par ? "Each block's softmax over attn, ffn and skip at the selected step."
    : "Each layer's mean and largest span (positions) at the selected step.";
  s.max = String(n - 1);
  if (follow && wasEnd && !hist.playing) s.value = String(n - 1);
  drawBars(Number(s.value));
}

function stopPlay() {
  if (hist.playing) clearInterval(hist.playing);
  hist.playing = null;
  $("anim-play").textContent = "Play";
  $("anim-text").setAttribute("aria-live", "polite");
}

function togglePlay() {
  if (hist.playing) { stopPlay(); return; }
  const s = $("anim-step");
  if (Number(s.value) >= Number(s.max)) s.value = "0";
  drawBars(Number(s.value));
  $("anim-play").textContent = "Pause";
  $("anim-text").setAttribute("aria-live", "off");   /* no announcement per frame */
  hist.playing = setInterval(() => {
    if (Number(s.value) >= Number(s.max)) { stopPlay(); drawBars(Number(s.value)); return; }
    s.value = String(Number(s.value) + 1);
    drawBars(Number(s.value));
  }, 350);
}

/* The followed job on the page at most every 100 ms: its new log lines and
 * status (followFlush, set by follow), the curves and the bars. A long
 * job's replayed history is drawn once, not once per line: a stream of a
 * line every few steps, each line appended to the log and the log laid out
 * again, froze the page. */
let followFlush = null;
function scheduleDraw() {
  if (hist.timer) return;
  hist.timer = setTimeout(drawNow, 100);
}
function drawNow() {
  if (hist.timer) clearTimeout(hist.timer);
  hist.timer = null;
  if (followFlush) followFlush();
  if (!hist.train.length && !hist.vals.length) return;
  drawCurves();
  updateAnim(true);
}

function resetHistory(family) {
  stopPlay();
  if (hist.timer) clearTimeout(hist.timer);
  hist = { family: family || "", train: [], vals: [], playing: null, steps: 0, timer: null, top: 1 };
  $("curves").hidden = true;
  $("loss-chart").replaceChildren();   /* (no curve of the job followed before stays behind, hidden) */
  $("bpc-chart").replaceChildren();
  $("anim").hidden = true;
  $("anim-step").max = "0";
  $("anim-step").value = "0";
}

/* One progress line D of the followed job into the history. */
function record(d) {
  if (d.event === "train" && typeof d.step === "number") {
    const n = hist.train.length;
    if (n && hist.train[n - 1].step >= d.step) {   /* a resume repeats steps since its checkpoint */
      hist.train = hist.train.filter((t) => t.step < d.step);
      hist.vals = hist.vals.filter((v) => v[0] < d.step);
    }
    hist.train.push(d);
    if (Array.isArray(d.spans)) for (const x of d.spans) hist.top = Math.max(hist.top, x.mean, x.max);
    if (typeof d.val_bpc === "number") hist.vals.push([d.step, d.val_bpc]);
  } else if (d.event === "done" && typeof d.val_bpc === "number" && typeof d.step === "number") {
    if (!hist.vals.some((v) => v[0] === d.step)) hist.vals.push([d.step, d.val_bpc]);
  } else return false;
  return true;
}

/* The newest lines of the followed job's log the page keeps (the whole log:
 * GET /v1/jobs/ID/events) */
const FOLLOW_LOG_LINES = 500;

/* Follows job ID through its event stream (GET /v1/jobs/ID/events?stream=true). */
async function follow(id) {
  if (followAbort) followAbort.abort();
  const ctl = followAbort = new AbortController();
  $("follow").hidden = false;
  $("follow-h").textContent = "Job " + id;
  const log = $("follow-log"), status = $("follow-status"), prog = $("follow-progress");
  log.textContent = "";
  delete log.dataset.ended;
  status.textContent = "connecting";   /* (not the job followed before's status until this one's first event) */
  prog.value = 0;
  resetHistory("");
  $("follow-model").hidden = true;
  let last = null;
  const show = (job) => {
    last = job;
    hist.family = job.family || hist.family;
    hist.steps = job.steps || hist.steps;
    const fm = $("follow-model");
    if (job.model && job.model.name) {
      fm.textContent = "Model " + job.model.name + (job.model.deployed ? ": deployed, served on the main listener as " + job.model.name
        : job.deploy ? ": not deployed" + (job.model.error ? " (" + job.model.error + ")" : "") : ": saved (" + job.model.path + ")");
      fm.hidden = false;
    } else if (job.deploy) {
      fm.textContent = "Model " + job.name + ": deployed on the main listener when the job succeeds";
      fm.hidden = false;
    }
    prog.max = job.steps || 1;
    prog.value = job.step || 0;
    status.textContent = job.status + ", step " + (job.step || 0) + " of " + job.steps +
      (typeof job.val_bpc === "number" ? ", val bpc " + job.val_bpc.toFixed(3) : "") + (job.error ? ": " + job.error : "") +
      (job.model ? ", model " + job.model.name + (job.model.deployed ? " (deployed)" : "") : "");
  };
  /* the lines since the last flush, the newest FOLLOW_LOG_LINES shown, the older ones counted; the step of the
   * newest line (null: the last job event's own) */
  let pending = [], lines = [], dropped = 0, step = null;
  followFlush = () => {
    if (ctl.signal.aborted) return;
    if (pending.length) {
      lines = lines.concat(pending);
      pending = [];
      if (lines.length > FOLLOW_LOG_LINES) {
        dropped += lines.length - FOLLOW_LOG_LINES;
        lines = lines.slice(-FOLLOW_LOG_LINES);
      }
      log.textContent = (dropped ? "(" + dropped + " earlier lines: GET /v1/jobs/" + id + "/events)\n" : "") + lines.join("\n") + "\n";
      log.scrollTop = log.scrollHeight;
    }
    if (last && step !== null) show(Object.assign({}, last, { step }));
  };
  const r = await api("/v1/jobs/" + encodeURIComponent(id) + "/events?stream=true", { signal: ctl.signal });
  await readSse(r, (ev, data) => {
    if (ctl.signal.aborted) return;   /* (a job followed before this one: its last buffered events) */
    const d = JSON.parse(data);
    if (ev === "job") { show(d); step = null; return; }
    pending.push(data);
    if (pending.length >= 2 * FOLLOW_LOG_LINES) {   /* (a burst between two flushes: only its newest lines can be shown) */
      dropped += lines.length + pending.length - FOLLOW_LOG_LINES;
      lines = [];
      pending = pending.slice(-FOLLOW_LOG_LINES);
    }
    record(d);
    if (typeof d.step === "number") step = d.step;
    scheduleDraw();
  });
  if (ctl.signal.aborted) return;
  drawNow();
  log.dataset.ended = "1";
  await loadJobs();
  try {
    await showSvg($("follow-img"), "/v1/jobs/" + encodeURIComponent(id) + "/spans.svg");
    $("follow-img").alt = "Training of job " + id + " against the step";
  } catch (e) { $("follow-img").removeAttribute("src"); }
}

function initJobs() {
  $("j-config").value = JSON.stringify(TINY["adaptive-span"], null, 1);
  $("j-family").addEventListener("change", () => { $("j-config").value = JSON.stringify(TINY[$("j-family").value], null, 1); });
  $("f-form").addEventListener("submit", (e) => {
    e.preventDefault();
    guarded(async () => {
      const f = $("f-file").files[0];
      const name = $("f-name").value || f.name.replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 64);
      const j = await apiJson("/v1/files?name=" + encodeURIComponent(name), { method: "POST", body: f,
        headers: { "Content-Type": "text/plain; charset=utf-8" } });
      $("f-status").textContent = "uploaded " + j.id + ": " + j.characters + " characters, " + j.distinct_characters + " distinct";
      await loadFiles();
      $("j-file").value = j.id;
    }, $("f-status"));
  });
  $("j-form").addEventListener("submit", (e) => {
    e.preventDefault();
    guarded(async () => {
      let config;
      try { config = JSON.parse($("j-config").value || "{}"); } catch (err) { throw new Error("the config is not JSON: " + err.message); }
      const b = { family: $("j-family").value, file: $("j-file").value, config, deploy: $("j-deploy").checked };
      if ($("j-name").value) b.name = $("j-name").value;
      if ($("j-device").value) b.device = $("j-device").value;
      const job = await apiJson("/v1/jobs", { method: "POST", json: b });
      $("j-status").textContent = "submitted " + job.id + " (" + job.status + ")";
      await loadJobs();
      await follow(job.id);
    }, $("j-status"));
  });
  $("jobs-refresh").addEventListener("click", () => guarded(loadJobs, $("j-status")));
  $("anim-step").addEventListener("input", () => { stopPlay(); drawBars(Number($("anim-step").value)); });
  $("anim-play").addEventListener("click", togglePlay);
}

/* ------------------------------------------------------------ start */

async function loadAll() {
  if (JOBS) {
    showError("");
    await guarded(async () => { await loadFiles(); await loadJobs(); });
    return;
  }
  showError("");
  await guarded(async () => {
    await loadModels();
    await loadSessions();
  });
  await refreshMetrics();
}

function init() {
  $("key").value = key;
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    key = $("key").value.trim();
    if (key) sessionStorage.setItem(KEY_NAME, key); else sessionStorage.removeItem(KEY_NAME);
    loadAll();
  });
  $("key-forget").addEventListener("click", () => {
    key = "";
    $("key").value = "";
    sessionStorage.removeItem(KEY_NAME);
  });
  if (JOBS) {
    initJobs();
    loadAll();
    return;
  }
  $("load-form").addEventListener("submit", (e) => { e.preventDefault(); guarded(loadModel, $("load-status")); });
  $("gen-form").addEventListener("submit", (e) => { e.preventDefault(); generate(); });
  $("g-cancel").addEventListener("click", () => { if (genAbort) genAbort.abort(); });
  $("s-go").addEventListener("click", () => scoreText());
  $("att-form").addEventListener("submit", (e) => {
    e.preventDefault();
    guarded(runAttention, $("att-status"));
  });
  $("a-model").addEventListener("change", () => guarded(loadHeads, $("att-status")));
  $("a-layer").addEventListener("change", fillHeads);
  $("sess-new").addEventListener("submit", (e) => {
    e.preventDefault();
    guarded(async () => {
      const b = { model: $("n-model").value };
      if ($("n-id").value) b.id = $("n-id").value;
      const s = await apiJson("/v1/sessions", { method: "POST", json: b });
      $("sess-status").textContent = "created " + s.id;
      await loadSessions();
    }, $("sess-status"));
  });
  $("sess-refresh").addEventListener("click", () => guarded(loadSessions, $("sess-status")));
  $("sess-import").addEventListener("submit", (e) => {
    e.preventDefault();
    guarded(async () => {
      const f = $("i-file").files[0];
      const id = encodeURIComponent($("i-id").value), model = encodeURIComponent($("i-model").value);
      const s = await apiJson("/v1/sessions/" + id + "/state?model=" + model,
        { method: "PUT", body: f, headers: { "Content-Type": "application/octet-stream" } });
      $("sess-status").textContent = "imported " + s.id + " (" + s.tokens_seen + " tokens seen)";
      await loadSessions();
    }, $("sess-status"));
  });
  $("legend").replaceChildren(...[0, 2, 4, 6, 8, 10].map((b) => {
    const s = el("span", { text: b + (b === 10 ? "+ bits" : "") });
    s.style.background = surpriseColour(b);
    return s;
  }));
  loadAll();
  setInterval(refreshMetrics, 3000);
}

init();

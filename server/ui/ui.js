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
    el("td", { class: "num", text: bytes((m.cost && m.cost.session_bytes) || (m.memory && m.memory.bytes_per_stream)) }))));
  const opts = models.map((m) => [m.name, m.name + " (" + m.family + ")"]);
  for (const id of ["g-model", "a-model", "n-model", "i-model"]) setOptions($(id), opts, true);
  if (models.length && $("model-detail").hidden) await showModel(models[0].name);
  await loadHeads();
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

/* Follows job ID through its event stream (GET /v1/jobs/ID/events?stream=true). */
async function follow(id) {
  if (followAbort) followAbort.abort();
  const ctl = followAbort = new AbortController();
  $("follow").hidden = false;
  $("follow-h").textContent = "Job " + id;
  const log = $("follow-log"), status = $("follow-status"), prog = $("follow-progress");
  log.textContent = "";
  delete log.dataset.ended;
  let last = null;
  const show = (job) => {
    last = job;
    prog.max = job.steps || 1;
    prog.value = job.step || 0;
    status.textContent = job.status + ", step " + (job.step || 0) + " of " + job.steps +
      (typeof job.val_bpc === "number" ? ", val bpc " + job.val_bpc.toFixed(3) : "") + (job.error ? ": " + job.error : "") +
      (job.model ? ", model " + job.model.name + (job.model.deployed ? " (deployed)" : "") : "");
  };
  const r = await api("/v1/jobs/" + encodeURIComponent(id) + "/events?stream=true", { signal: ctl.signal });
  await readSse(r, (ev, data) => {
    const d = JSON.parse(data);
    if (ev === "job") { show(d); return; }
    log.textContent += data + "\n";
    log.scrollTop = log.scrollHeight;
    if (last && typeof d.step === "number") show(Object.assign({}, last, { step: d.step }));
  });
  if (ctl.signal.aborted) return;
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

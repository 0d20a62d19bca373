// The page at `/`: a chat (or a plain completion box) with the served model, and a live view
// of its KV pool. It calls the server's public routes as any client would.
//
// Model text never reaches the DOM as markup: the renderer below builds elements with
// createElement and fills them with textContent only.
"use strict";

const KEY_STORE = "strata-api-key";
const POLL_MS = 1000;

const $ = (id) => document.getElementById(id);

const state = {
  key: sessionStorage.getItem(KEY_STORE) || "",
  model: null,
  chatTemplate: false,
  messages: [],
  running: null, // the AbortController of the request in flight
  lastTokens: null, // {tokens, t} of the previous poll, for the decode rate
  polling: false,
  started: false,
};

// ------------------------------------------------------------------ safe markdown renderer

/** Appends `text`'s inline markup (code spans, bold, italics) to `parent`, as text nodes
 * and fixed elements only. */
function renderInline(parent, text, depth) {
  const re = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([\s\S]+?)\*\*|__([\s\S]+?)__|\*([^*\s](?:[^*]*[^*\s])?)\*/g;
  let last = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
    let el;
    if (m[1] !== undefined) {
      el = document.createElement("code");
      el.textContent = m[2];
    } else {
      el = document.createElement(m[5] !== undefined ? "em" : "strong");
      const inner = m[3] ?? m[4] ?? m[5];
      if (depth < 3) renderInline(el, inner, depth + 1);
      else el.textContent = inner;
    }
    parent.append(el);
    last = re.lastIndex;
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

/** Markdown-ish text -> a DocumentFragment: paragraphs, headings, lists, fenced code
 * blocks (an unclosed fence, mid-stream, is still a code block), inline code and
 * emphasis. Links and HTML stay text. */
function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = String(text).split("\n");
  let para = [];
  let list = null;
  const flushPara = () => {
    if (para.length) {
      const p = document.createElement("p");
      renderInline(p, para.join("\n"), 0);
      out.append(p);
      para = [];
    }
  };
  const endList = () => { list = null; };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = /^\s*(`{3,}|~{3,})\s*([\w+.#-]{0,32})/.exec(line);
    if (fence) {
      flushPara(); endList();
      const body = [];
      i++;
      const closes = (l) => l.trim().startsWith(fence[1]) && /^[`~]+$/.test(l.trim());
      while (i < lines.length && !closes(lines[i])) body.push(lines[i++]);
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      if (fence[2]) code.dataset.lang = fence[2];
      code.textContent = body.join("\n");
      pre.append(code);
      out.append(pre);
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      flushPara(); endList();
      const h = document.createElement(["h3", "h4", "h5", "h6", "h6", "h6"][heading[1].length - 1]);
      renderInline(h, heading[2], 0);
      out.append(h);
      continue;
    }
    const item = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/.exec(line);
    if (item) {
      flushPara();
      const tag = /\d/.test(item[1]) ? "ol" : "ul";
      if (!list || list.tagName.toLowerCase() !== tag) {
        list = document.createElement(tag);
        out.append(list);
      }
      const li = document.createElement("li");
      renderInline(li, item[2], 0);
      list.append(li);
      continue;
    }
    if (line.trim() === "") {
      flushPara(); endList();
      continue;
    }
    endList();
    para.push(line);
  }
  flushPara();
  return out;
}

/** Shows `text` as the body of message element `el` (replacing what it showed). */
function showText(el, text) {
  el.dataset.raw = text;
  el.replaceChildren(renderMarkdown(text));
}

// ------------------------------------------------------------------ HTTP

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (state.key) h["Authorization"] = "Bearer " + state.key;
  return h;
}

/** A 401 from the server: ask for the key, then start over. */
class NeedKey extends Error {}

async function getJson(path) {
  const r = await fetch(path, { headers: headers(false) });
  if (r.status === 401) throw new NeedKey();
  if (!r.ok) throw new Error(path + ": " + (await errorText(r)));
  return r.json();
}

async function errorText(r) {
  try {
    const body = await r.json();
    return (body.error && body.error.message) || r.statusText;
  } catch (_) {
    return r.status + " " + r.statusText;
  }
}

/** POSTs a streamed request and calls `onDelta(text)` for each chunk's text. Resolves to
 * the finish reason; rejects on an error (an aborted fetch rejects with AbortError). */
async function stream(path, body, signal, pick, onDelta) {
  const r = await fetch(path, {
    method: "POST",
    headers: headers(true),
    body: JSON.stringify(body),
    signal,
  });
  if (r.status === 401) throw new NeedKey();
  if (!r.ok) throw new Error(await errorText(r));
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let finish = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return finish;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        const text = pick(choice);
        if (text) onDelta(text);
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
  }
  return finish;
}

// ------------------------------------------------------------------ chat and completion

function settings() {
  const temperature = Number($("temperature").value);
  const maxTokens = Math.floor(Number($("max-tokens").value));
  if (!Number.isFinite(temperature) || temperature < 0) throw new Error("temperature must be a number >= 0");
  if (!Number.isFinite(maxTokens) || maxTokens < 1) throw new Error("max tokens must be at least 1");
  return { temperature, max_tokens: maxTokens };
}

function setRunning(controller) {
  state.running = controller;
  const busy = controller !== null;
  $("send").disabled = busy;
  $("complete").disabled = busy;
  $("stop").disabled = !busy;
  $("complete-stop").disabled = !busy;
}

function stop() {
  if (state.running) state.running.abort();
}

function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = "msg " + role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role;
  const body = document.createElement("div");
  body.className = "body";
  showText(body, text);
  el.append(who, body);
  $("chat-log").append(el);
  el.scrollIntoView({ block: "end" });
  return body;
}

async function sendChat() {
  const text = $("chat-input").value;
  if (!text.trim() || state.running) return;
  $("talk-error").textContent = "";
  let params;
  try { params = settings(); } catch (e) { $("talk-error").textContent = e.message; return; }
  $("chat-input").value = "";
  state.messages.push({ role: "user", content: text });
  addMessage("user", text);
  const messages = [];
  const system = $("system").value;
  if (system.trim()) messages.push({ role: "system", content: system });
  messages.push(...state.messages);
  const body = { model: state.model, messages, stream: true, ...params };
  const out = addMessage("assistant", "");
  out.dataset.state = "streaming";
  await run(body, "/v1/chat/completions", (c) => c.delta && c.delta.content, out, (answer) => {
    state.messages.push({ role: "assistant", content: answer });
  });
}

async function sendCompletion() {
  const prompt = $("completion-prompt").value;
  if (!prompt || state.running) return;
  $("talk-error").textContent = "";
  let params;
  try { params = settings(); } catch (e) { $("talk-error").textContent = e.message; return; }
  const box = $("completion-output");
  const shown = document.createElement("span");
  shown.className = "prompt";
  shown.textContent = prompt;
  const gen = document.createElement("span");
  gen.className = "generated";
  box.replaceChildren(shown, gen);
  box.dataset.raw = "";
  box.dataset.state = "streaming";
  const body = { model: state.model, prompt, stream: true, ...params };
  await run(body, "/v1/completions", (c) => c.text, gen, null, box);
}

/** Streams one request into `el` (markdown for chat, plain text into a completion's
 * `holder`), and records how it ended in the holder's `data-state`. */
async function run(body, path, pick, el, onDone, holder) {
  const controller = new AbortController();
  setRunning(controller);
  const target = holder || el;
  let answer = "";
  try {
    const finish = await stream(path, body, controller.signal, pick, (t) => {
      answer += t;
      if (holder) {
        el.textContent = answer;
        holder.dataset.raw = answer;
      } else {
        showText(el, answer);
      }
    });
    target.dataset.state = "done";
    target.dataset.finish = finish || "";
  } catch (e) {
    if (e.name === "AbortError") {
      target.dataset.state = "stopped";
    } else if (e instanceof NeedKey) {
      target.dataset.state = "error";
      askKey("");
    } else {
      target.dataset.state = "error";
      $("talk-error").textContent = e.message;
    }
  } finally {
    setRunning(null);
  }
  if (onDone && answer) onDone(answer);
}

function setMode(mode) {
  $("chat-pane").hidden = mode !== "chat";
  $("completion-pane").hidden = mode !== "completion";
  $("mode-chat").checked = mode === "chat";
  $("mode-completion").checked = mode === "completion";
}

// ------------------------------------------------------------------ the KV pool panel

/** Prometheus text -> {"name{labels}": value}. */
function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const sp = line.lastIndexOf(" ");
    out[line.slice(0, sp)] = Number(line.slice(sp + 1));
  }
  return out;
}

function poolBar(name, total, used, cached) {
  const free = total - used;
  const wrap = document.createElement("div");
  wrap.className = "pool";
  wrap.dataset.pool = name;
  const label = document.createElement("div");
  label.className = "pool-label";
  const title = document.createElement("strong");
  title.textContent = name + " pool";
  const nums = document.createElement("span");
  const field = (key, v, what) => {
    const s = document.createElement("span");
    s.dataset.field = key;
    s.textContent = String(v);
    nums.append(s, document.createTextNode(" " + what));
  };
  const pre = name === "full" ? "" : "window_";
  field(pre + "used_pages", used, "used · ");
  field(pre + "cached_pages", cached, "cached · ");
  field(pre + "free_pages", free, "free of ");
  field(pre === "" ? "num_pages" : "window_num_pages", total, "pages");
  label.append(title, document.createTextNode(" "), nums);
  const bar = document.createElement("div");
  bar.className = "bar";
  const seg = (cls, n, tip) => {
    const s = document.createElement("div");
    s.className = "seg " + cls;
    s.style.width = total > 0 ? (100 * n / total) + "%" : "0";
    s.title = n + " pages " + tip;
    bar.append(s);
  };
  seg("active", used - cached, "held by running requests");
  seg("cached", cached, "kept by the prefix cache");
  seg("free", free, "free");
  wrap.append(label, bar);
  return wrap;
}

function showStatus(s, metrics) {
  const pools = [poolBar("full", s.num_pages, s.used_pages, s.cached_pages)];
  if (s.window_num_pages > 0) {
    pools.push(poolBar("window", s.window_num_pages, s.window_used_pages, s.window_cached_pages));
  }
  $("pools").replaceChildren(...pools);
  for (const el of document.querySelectorAll("#kv table [data-field]")) {
    const v = s[el.dataset.field];
    el.textContent = v === undefined ? "–" : String(v);
  }
  $("cache-lookups").textContent = String(s.cache_hits + s.cache_misses);
  $("kv-dtype").textContent = s.kv_cache_dtype;
  const cancelled = metrics['strata_requests_finished_total{reason="cancelled"}'];
  $("cancelled").textContent = cancelled === undefined ? "–" : String(cancelled);
  const tokens = metrics["strata_generation_tokens_total"];
  const now = performance.now();
  if (tokens !== undefined && state.lastTokens) {
    const dt = (now - state.lastTokens.t) / 1000;
    const rate = dt > 0 ? (tokens - state.lastTokens.tokens) / dt : 0;
    $("decode-rate").textContent = rate.toFixed(1);
  }
  if (tokens !== undefined) state.lastTokens = { tokens, t: now };
}

async function poll() {
  if (state.polling) return;
  state.polling = true;
  try {
    const [status, metrics] = await Promise.all([
      getJson("/v1/cache/status"),
      fetch("/metrics").then((r) => (r.ok ? r.text() : "")),
    ]);
    showStatus(status, parseMetrics(metrics));
    $("conn").textContent = "";
  } catch (e) {
    // A refused key is asked for by start() and by a refused request, not every second.
    $("conn").textContent = e instanceof NeedKey ? "the server wants an API key" : "server unreachable: " + e.message;
  } finally {
    state.polling = false;
  }
}

function showLayout(layout) {
  $("kv-cost").textContent = String(layout.kv_cost);
  $("kv-cost-unshared").textContent = String(layout.kv_cost_unshared);
  $("kv-gain").textContent = layout.kv_cost > 0
    ? "×" + (layout.kv_cost_unshared / layout.kv_cost).toFixed(2) + " with sharing"
    : "–";
  const boxes = layout.layers.map((l) => {
    const b = document.createElement("div");
    b.className = "layer " + l.attention + (l.owns_kv ? "" : " shared");
    b.dataset.layer = String(l.layer);
    b.dataset.attention = l.attention;
    b.dataset.owns = String(l.owns_kv);
    b.dataset.source = String(l.kv_source);
    const n = document.createElement("span");
    n.className = "n";
    n.textContent = String(l.layer);
    const k = document.createElement("span");
    k.className = "k";
    k.textContent = l.owns_kv ? l.attention[0].toUpperCase() : "↩" + l.kv_source;
    b.append(n, k);
    b.title = "layer " + l.layer + ": " + l.attention + " attention, " +
      (l.owns_kv ? "owns its KV" : "reads layer " + l.kv_source + "'s KV");
    return b;
  });
  $("layer-strip").replaceChildren(...boxes);
}

// ------------------------------------------------------------------ start-up and the key

function askKey(message) {
  const d = $("key-dialog");
  $("key-error").textContent = message;
  if (!d.open) d.showModal();
}

async function start() {
  try {
    const models = await getJson("/v1/models");
    const card = models.data[0];
    state.model = card.id;
    state.chatTemplate = card.has_chat_template === true;
    $("model-name").textContent = card.id + " · context " + card.max_model_len;
    $("mode-chat").disabled = !state.chatTemplate;
    $("mode-note").textContent = state.chatTemplate ? "" : "(this model has no chat template)";
    setMode(state.chatTemplate ? "chat" : "completion");
    showLayout(await getJson("/v1/kv/layout"));
    await poll();
    if (!state.started) {
      state.started = true;
      setInterval(poll, POLL_MS);
    }
    document.body.dataset.ready = "true";
  } catch (e) {
    if (e instanceof NeedKey) askKey(state.key ? "That key was refused." : "");
    else $("conn").textContent = "cannot reach the server: " + e.message;
  }
}

function wire() {
  $("send").addEventListener("click", sendChat);
  $("stop").addEventListener("click", stop);
  $("complete").addEventListener("click", sendCompletion);
  $("complete-stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => {
    stop();
    state.messages = [];
    $("chat-log").replaceChildren();
  });
  $("chat-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      sendChat();
    }
  });
  for (const r of document.querySelectorAll('input[name="mode"]')) {
    r.addEventListener("change", () => setMode(r.value));
  }
  $("key-form").addEventListener("submit", () => {
    state.key = $("key-input").value.trim();
    sessionStorage.setItem(KEY_STORE, state.key);
    start();
  });
}

// For the browser test and the console: the renderer and the way answers are shown.
window.strataUi = { renderMarkdown, showText, parseMetrics };

wire();
start();

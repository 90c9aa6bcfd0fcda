// infer's demo chat page: streams /v1/chat/completions with fetch and shows live tok/s.
// Replies are markdown, rendered by marked and sanitised by DOMPurify (both bundled into the
// server from web/chat-page; without them replies stay plain text). The conversation is kept
// in localStorage across reloads until cleared.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "infer-chat";
const state = { model: null, context: null, history: [], controller: null };

const markdown = window.marked && window.DOMPurify ? window.marked : null;
if (markdown) {
  markdown.use({ gfm: true, breaks: true });
  // Links in replies open elsewhere and cannot reach this page.
  window.DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
}

// Sets a message's text: an assistant's as sanitised markdown, anything else as plain text.
function render(div, role, text) {
  if (role === "assistant" && markdown) {
    div.classList.add("markdown");
    div.innerHTML = window.DOMPurify.sanitize(markdown.parse(text));
  } else {
    div.textContent = text;
  }
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify({ history: state.history, system: $("system").value }));
  } catch {
    // Storage full or refused (private windows): the page works, it just forgets.
  }
}

function restore() {
  let saved = null;
  try {
    saved = JSON.parse(localStorage.getItem(STORE) ?? "null");
  } catch {
    localStorage.removeItem(STORE);
  }
  if (!saved || !Array.isArray(saved.history)) return;
  state.history = saved.history.filter(
    (m) => m && typeof m.content === "string" && (m.role === "user" || m.role === "assistant"));
  if (typeof saved.system === "string") $("system").value = saved.system;
  for (const m of state.history) addMessage(m.role, m.content);
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = `Bearer ${key}`;
  return h;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  render(div, role, text);
  $("log").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function setMeta(div, text) {
  let meta = div.querySelector(".meta");
  if (!meta) {
    meta = document.createElement("span");
    meta.className = "meta";
    div.appendChild(meta);
  }
  meta.textContent = text;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error?.message ?? `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (!r.ok) throw new Error(await errorMessage(r));
    const body = await r.json();
    state.model = body.data[0].id;
    state.context = body.data[0].max_model_len ?? null;
    if (state.context) $("max-tokens").max = state.context;
    $("model").textContent = `${state.model} · context ${state.context ?? "?"}`;
  } catch (e) {
    $("model").textContent = `not connected: ${e.message}`;
  }
}

// Yields the JSON payload of every `data: ` event of an SSE body.
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice(6);
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("prompt").disabled = on;
}

// The max tokens asked for, cut to what the context leaves after the prompt (the server
// counts the prompt as the template renders it); throws when nothing is left.
async function maxTokens(messages) {
  const wanted = Math.max(1, Math.floor(Number($("max-tokens").value) || 1));
  if (!state.context) return wanted;
  let prompt = 0;
  try {
    const r = await fetch("/tokenize", {
      method: "POST", headers: headers(),
      body: JSON.stringify({ model: state.model, messages, add_generation_prompt: true }),
    });
    if (r.ok) prompt = (await r.json()).count ?? 0;
  } catch {
    // Counted by the server anyway: a request too long for the context comes back as an error.
  }
  const left = state.context - prompt;
  if (left < 1) {
    throw new Error(`the conversation (${prompt} tokens) fills the model's context of ${state.context}: clear it to go on`);
  }
  return Math.min(wanted, left);
}

function showError(div, text) {
  settle();
  div.className = "msg error";
  div.textContent = text;
  div.scrollIntoView({ block: "nearest" });
}

async function send(text) {
  if (!state.model) await loadModel();
  state.history.push({ role: "user", content: text });
  addMessage("user", text);
  const reply = addMessage("assistant", "");
  const system = $("system").value.trim();
  const messages = system ? [{ role: "system", content: system }, ...state.history] : state.history;
  let max_tokens;
  try {
    max_tokens = await maxTokens(messages);
  } catch (e) {
    showError(reply, `Error: ${e.message}`);
    state.history.pop();
    return;
  }
  const request = {
    model: state.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    max_tokens,
  };
  state.controller = new AbortController();
  busy(true);
  const start = performance.now();
  let first = null, tokens = 0, content = "", finish = null, usage = null;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(request), signal: state.controller.signal,
    });
    if (!r.ok) throw new Error(await errorMessage(r));
    for await (const chunk of events(r.body)) {
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) continue;
      if (choice.delta?.content !== undefined && choice.delta.role === undefined) {
        // One content chunk per engine step: one token each.
        tokens += 1;
        first ??= performance.now();
        content += choice.delta.content;
        draw(reply, () => content);
      }
      if (choice.finish_reason) finish = choice.finish_reason;
      const elapsed = (performance.now() - (first ?? start)) / 1000;
      const rate = tokens > 1 && elapsed > 0 ? ((tokens - 1) / elapsed).toFixed(1) : "–";
      $("stats").textContent = `${tokens} tokens · ${rate} tok/s`;
    }
  } catch (e) {
    if (e.name !== "AbortError") {
      showError(reply, `${content}${content ? "\n" : ""}Error: ${e.message}`);
    } else {
      finish = "stopped";
    }
  } finally {
    settle();
    busy(false);
    state.controller = null;
  }
  if (reply.className === "msg error") {
    state.history.pop();
    return;
  }
  state.history.push({ role: "assistant", content });
  save();
  render(reply, "assistant", content);
  const ttft = first ? ((first - start) / 1000).toFixed(2) : "–";
  const decode = first && tokens > 1 ? ((tokens - 1) / ((performance.now() - first) / 1000)).toFixed(1) : "–";
  const n = usage?.completion_tokens ?? tokens;
  const clamped = max_tokens < Number($("max-tokens").value) ? ` · max tokens cut to ${max_tokens} (context left)` : "";
  setMeta(reply, `${n} tokens · first token ${ttft} s · ${decode} tok/s · ${finish ?? "?"}${clamped}`);
  reply.scrollIntoView({ block: "nearest" });
  $("stats").textContent = `${n} tokens · ${decode} tok/s`;
  $("prompt").focus();
}

// Streamed text is re-rendered at most once a frame (markdown parses the whole reply).
let pending = null;
function draw(div, text) {
  if (pending) return;
  pending = requestAnimationFrame(() => {
    pending = null;
    render(div, "assistant", text());
    div.scrollIntoView({ block: "end" });
  });
}

function settle() {
  if (pending) cancelAnimationFrame(pending);
  pending = null;
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || state.controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => state.controller?.abort());
$("clear").addEventListener("click", () => {
  state.controller?.abort();
  state.history = [];
  try {
    localStorage.removeItem(STORE);
  } catch {
    // Nothing stored.
  }
  $("log").replaceChildren();
  $("stats").textContent = "";
});
$("system").addEventListener("change", save);
$("max-tokens").addEventListener("change", () => {
  const el = $("max-tokens");
  if (state.context && Number(el.value) > state.context) el.value = state.context;
});
$("temperature").addEventListener("input", () => { $("temp-value").textContent = $("temperature").value; });
$("api-key").addEventListener("change", loadModel);
if (!markdown) {
  $("notice").textContent = "replies shown as plain text: this server was built without the page's markdown libraries";
}
restore();
loadModel();

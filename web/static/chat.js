// infer's demo chat page: streams /v1/chat/completions with fetch and shows live tok/s.
// Plain script, no build step; the server embeds it.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, history: [], controller: null };

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = `Bearer ${key}`;
  return h;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
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
    $("model").textContent = `${state.model} · context ${body.data[0].max_model_len}`;
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

async function send(text) {
  if (!state.model) await loadModel();
  state.history.push({ role: "user", content: text });
  addMessage("user", text);
  const reply = addMessage("assistant", "");
  const system = $("system").value.trim();
  const messages = system ? [{ role: "system", content: system }, ...state.history] : state.history;
  const request = {
    model: state.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
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
        reply.textContent = content;
        reply.scrollIntoView({ block: "end" });
      }
      if (choice.finish_reason) finish = choice.finish_reason;
      const elapsed = (performance.now() - (first ?? start)) / 1000;
      const rate = tokens > 1 && elapsed > 0 ? ((tokens - 1) / elapsed).toFixed(1) : "–";
      $("stats").textContent = `${tokens} tokens · ${rate} tok/s`;
    }
  } catch (e) {
    if (e.name !== "AbortError") {
      reply.className = "msg error";
      reply.textContent = `${content}${content ? "\n" : ""}Error: ${e.message}`;
    } else {
      finish = "stopped";
    }
  } finally {
    busy(false);
    state.controller = null;
  }
  if (reply.className === "msg error") {
    state.history.pop();
    return;
  }
  state.history.push({ role: "assistant", content });
  const ttft = first ? ((first - start) / 1000).toFixed(2) : "–";
  const decode = first && tokens > 1 ? ((tokens - 1) / ((performance.now() - first) / 1000)).toFixed(1) : "–";
  const n = usage?.completion_tokens ?? tokens;
  setMeta(reply, `${n} tokens · first token ${ttft} s · ${decode} tok/s · ${finish ?? "?"}`);
  $("stats").textContent = `${n} tokens · ${decode} tok/s`;
  $("prompt").focus();
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
  state.history = [];
  $("log").replaceChildren();
  $("stats").textContent = "";
});
$("temperature").addEventListener("input", () => { $("temp-value").textContent = $("temperature").value; });
$("api-key").addEventListener("change", loadModel);
loadModel();

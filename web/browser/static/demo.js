// The demo page: loads a GGUF model into the engine in a worker on this machine's GPU and
// chats with it, streamed; "two chats at once" sends to two conversations together to show
// that the engine batches them.
import { createEngine } from './infer.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
$('model-url').value = params.get('model') || 'model.gguf';
$('draft-url').value = params.get('draft') || '';
$('speculate').checked = params.has('speculate') || params.has('draft');
let engine = null;
const conversations = { 'chat-a': [], 'chat-b': [] };
const live = new Set();

function show(el, text, cls) {
  el.textContent = text;
  el.className = cls || '';
}

async function describeAdapter() {
  if (!navigator.gpu) return show($('adapter'), 'This browser has no WebGPU.', 'error');
  const a = await navigator.gpu.requestAdapter();
  if (!a) return show($('adapter'), 'No WebGPU adapter.', 'error');
  const info = a.info || {};
  const l = a.limits;
  show($('adapter'), `${info.vendor || ''} ${info.architecture || ''} ${info.description || ''}`.trim() +
    `\nmax binding ${(l.maxStorageBufferBindingSize / 2 ** 20).toFixed(0)} MiB · buffers/stage ${l.maxStorageBuffersPerShaderStage}` +
    ` · shader-f16 ${a.features.has('shader-f16') ? 'yes' : 'no'}`);
}

async function load() {
  const file = $('model-file').files[0];
  const model = file || $('model-url').value;
  $('load-btn').disabled = true;
  show($('load-status'), 'loading…');
  try {
    if (engine) engine.terminate();
    // Speculative decoding: prompt lookup, or a draft model when one is named.
    const draft = $('draft-url').value.trim();
    const speculativeConfig = !$('speculate').checked ? undefined
      : draft ? { model: draft, num_speculative_tokens: 4 }
        : { method: 'ngram', num_speculative_tokens: 4, prompt_lookup_max: 3 };
    engine = await createEngine({
      model,
      speculativeConfig,
      kvCacheMiB: Number($('kv').value) || 256,
      onProgress: (p) => {
        if (p.phase === 'adapter') return;
        $('bar').max = p.total || 1;
        $('bar').value = p.loaded;
        const mib = (b) => (b / 2 ** 20).toFixed(1);
        const doing = { download: 'downloading', upload: 'uploading to the GPU', 'draft-upload': 'uploading the draft model' }[p.phase] || p.phase;
        show($('load-status'), `${doing} ${mib(p.loaded)} / ${mib(p.total)} MiB`);
      },
    });
    engine.onFatal = (e) => show($('load-status'), `engine stopped: ${e.message}`, 'error');
    const i = engine.info;
    show($('load-status'), `${i.config.architecture}, ${i.config.num_layers} layers · context ${i.kv.max_model_len} · ` +
      `KV ${i.kv.kv_cache_mib} MiB · loaded in ${(i.loadMs / 1000).toFixed(1)} s${i.fromCache ? ' from the cache' : ''}`);
    $('adapter').textContent = `${i.adapter.name}\n${$('adapter').textContent.split('\n').slice(1).join('\n')}`;
    $('prompt').disabled = $('send').disabled = false;
  } catch (e) {
    show($('load-status'), e.message, 'error');
  } finally {
    $('load-btn').disabled = false;
  }
}

function bubble(chat, role, text) {
  const div = document.createElement('div');
  div.className = `msg ${role}`;
  div.textContent = text;
  $(chat).querySelector('.log').append(div);
  return div;
}

async function ask(chat, text) {
  const messages = conversations[chat];
  messages.push({ role: 'user', content: text });
  bubble(chat, 'user', text);
  const out = bubble(chat, 'assistant', '');
  const meta = document.createElement('div');
  meta.className = 'meta';
  out.after(meta);
  const t0 = performance.now();
  let first = 0;
  let tokens = 0;
  let reply = '';
  try {
    const stream = await engine.chat.completions.create({ messages, stream: true, max_tokens: 256, temperature: 0.7 });
    live.add(stream);
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        if (c.delta && c.delta.content) {
          if (!first) first = performance.now();
          tokens += 1;
          reply += c.delta.content;
          out.textContent = reply;
          const rate = tokens > 1 ? (tokens - 1) / ((performance.now() - first) / 1000) : 0;
          meta.textContent = `${tokens} tokens · first token ${((first - t0) / 1000).toFixed(2)} s · ${rate.toFixed(1)} tok/s`;
        }
        if (c.finish_reason) meta.textContent += ` · ${c.finish_reason}`;
      }
    }
    live.delete(stream);
  } catch (e) {
    meta.textContent = e.message;
    meta.className = 'meta error';
  }
  messages.push({ role: 'assistant', content: reply });
}

$('load-btn').onclick = load;
$('two').onchange = () => { $('chat-b').hidden = !$('two').checked; };
$('stop').onclick = () => { for (const s of live) s.abort(); };
$('ask').onsubmit = async (ev) => {
  ev.preventDefault();
  const text = $('prompt').value.trim();
  if (!text || !engine) return;
  $('prompt').value = '';
  $('stop').disabled = false;
  const chats = $('two').checked ? ['chat-a', 'chat-b'] : ['chat-a'];
  const timer = setInterval(async () => {
    const s = await engine.stats();
    const sd = s.spec_decode;
    const spec = sd && sd.num_drafts ? ` · speculation: ${sd.num_accepted_tokens}/${sd.num_draft_tokens} proposals accepted` : '';
    $('stats').textContent = `running ${s.num_running} · waiting ${s.num_waiting} · KV blocks ${s.kv_blocks_used}/${s.kv_blocks_total} · step ${s.last_step_ms.toFixed(0)} ms${spec}`;
  }, 500);
  await Promise.all(chats.map((c) => ask(c, text)));
  clearInterval(timer);
  $('stop').disabled = true;
};
describeAdapter();
if (params.get('model')) load();

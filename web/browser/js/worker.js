// The engine's Web Worker: loads the wasm module, streams the GGUF model into WebGPU tensor by
// tensor, then steps the engine while requests are live. The page talks to it through infer.js.
import init, { WebLoader, WebEngine } from './pkg/infer_browser.js';

const CACHE_NAME = 'infer-models-v1';
const HEADER_PROBE = 1 << 20;

let engine = null;
let stepping = false;
const queue = [];

const post = (msg) => self.postMessage(msg);
const progress = (phase, loaded, total) => post({ type: 'progress', phase, loaded, total });

// A byte source: `read(start, end)` resolves to an ArrayBuffer of exactly end - start bytes.
function blobSource(blob, name, fromCache) {
  return {
    name, size: blob.size, fromCache,
    read: async (a, b) => blob.slice(a, b).arrayBuffer(),
  };
}

async function rangeSource(url) {
  const head = await fetch(url, { method: 'HEAD' });
  if (!head.ok) throw new Error(`${url}: HTTP ${head.status}`);
  const size = Number(head.headers.get('content-length'));
  if (!Number.isFinite(size) || size <= 0) throw new Error(`${url}: the server sent no length`);
  return {
    name: url, size, fromCache: false,
    read: async (a, b) => {
      const r = await fetch(url, { headers: { Range: `bytes=${a}-${b - 1}` } });
      if (r.status !== 206 && !(r.status === 200 && a === 0 && b === size)) {
        throw new Error(`${url}: the server does not answer Range requests (HTTP ${r.status})`);
      }
      const buf = await r.arrayBuffer();
      if (buf.byteLength !== b - a) throw new Error(`${url}: got ${buf.byteLength} of ${b - a} bytes (truncated download)`);
      return buf;
    },
  };
}

// Downloads `url` into the Cache API, counting bytes. A failed, short or over-quota download
// leaves nothing in the cache.
async function download(url, cache) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  const total = Number(r.headers.get('content-length')) || 0;
  let loaded = 0;
  const counted = r.body.pipeThrough(new TransformStream({
    transform(chunk, ctl) {
      loaded += chunk.byteLength;
      progress('download', loaded, total);
      ctl.enqueue(chunk);
    },
  }));
  const headers = { 'content-type': 'application/octet-stream', 'x-infer-bytes': String(total) };
  try {
    await cache.put(url, new Response(counted, { headers }));
  } catch (e) {
    await cache.delete(url).catch(() => {});
    throw e;
  }
  if (total && loaded !== total) {
    await cache.delete(url);
    throw new Error(`${url}: got ${loaded} of ${total} bytes (truncated download)`);
  }
}

async function openSource(model, useCache) {
  if (typeof Blob !== 'undefined' && model instanceof Blob) {
    return blobSource(model, model.name || 'model.gguf', false);
  }
  const url = new URL(model, self.location.href).href;
  if (useCache && self.caches) {
    try {
      const cache = await caches.open(CACHE_NAME);
      let hit = await cache.match(url);
      const fromCache = Boolean(hit);
      if (!hit) {
        await download(url, cache);
        hit = await cache.match(url);
      }
      if (hit) return { ...blobSource(await hit.blob(), url, fromCache), url, cache };
    } catch (e) {
      if (e && e.name === 'QuotaExceededError') {
        post({ type: 'warning', message: `the model does not fit the browser's storage quota; loading without the cache (${e.message})` });
      } else if (/truncated|HTTP/.test(String(e && e.message))) {
        throw e;
      } else {
        post({ type: 'warning', message: `cache unavailable, loading from the network: ${e && e.message}` });
      }
    }
  }
  return rangeSource(url);
}

// Streams the GGUF behind `src` into `loader` (header, config tensors, then every weight
// uploaded to the GPU); `phase` names the progress events.
async function stream(src, phase, loader) {
  let want = Math.min(HEADER_PROBE, src.size);
  for (;;) {
    const prefix = new Uint8Array(await src.read(0, want));
    if (loader.parse_header(src.name, prefix, src.size)) break;
    if (want >= src.size) throw new Error(`${src.name}: the GGUF header runs past the end of the file`);
    want = Math.min(want * 4, src.size);
  }
  for (let r = loader.config_tensor_range(); r; r = loader.config_tensor_range()) {
    loader.set_config_tensor(new Uint8Array(await src.read(r[0], r[1])));
  }
  const config = JSON.parse(loader.prepare());
  let uploaded = 0;
  for (let r = loader.next_tensor(); r; r = loader.next_tensor()) {
    const bytes = new Uint8Array(await src.read(r[0], r[1]));
    loader.upload_tensor(bytes);
    uploaded += r[1] - r[0];
    progress(phase, uploaded, src.size);
  }
  return config;
}

// Opens `model` (a URL or a File) and streams it into `loader`, dropping a cached copy that
// fails to load.
async function loadModel(model, useCache, phase, loader) {
  const src = await openSource(model, useCache);
  try {
    return { src, config: await stream(src, phase, loader) };
  } catch (e) {
    if (src.cache && src.url) await src.cache.delete(src.url).catch(() => {});
    throw e;
  }
}

async function load({ model, kvCacheMiB, maxModelLen, cache, modelName, speculativeConfig }) {
  const started = performance.now();
  await init();
  const loader = await WebLoader.open();
  const adapter = JSON.parse(loader.adapter());
  // wgpu's WebGPU backend leaves the adapter's name empty: add the browser's description.
  const gpu = (await navigator.gpu.requestAdapter().catch(() => null))?.info;
  const described = gpu && [gpu.vendor, gpu.architecture, gpu.description].filter(Boolean).join(' ');
  if (described) adapter.name = `${described} ${adapter.name.trim()}`;
  post({ type: 'adapter', adapter });
  // A draft model (`speculativeConfig.model`, its URL) streams like the target, onto the same
  // device.
  const draft = speculativeConfig && speculativeConfig.model ? loader.sibling() : undefined;
  const { src, config } = await loadModel(model, cache !== false, 'upload', loader);
  engine = new WebEngine(loader, modelName || String(src.name).split('/').pop(), maxModelLen || 0);
  if (speculativeConfig) {
    if (draft) await loadModel(speculativeConfig.model, cache !== false, 'draft-upload', draft);
    engine.set_speculation(JSON.stringify(speculativeConfig), draft);
  }
  const kv = JSON.parse(await engine.allocate(kvCacheMiB || 256));
  post({
    type: 'ready',
    info: { adapter, config, kv, fromCache: src.fromCache, loadMs: performance.now() - started },
  });
}

function apply(msg) {
  switch (msg.type) {
    case 'add': {
      const r = JSON.parse(engine.add(msg.endpoint, JSON.stringify(msg.body)));
      if (r.error) post({ type: 'add-error', rid: msg.rid, error: r.error });
      else {
        post({ type: 'added', rid: msg.rid, id: r.id });
        for (const event of r.events) post({ type: 'event', event });
      }
      break;
    }
    case 'abort':
      for (const event of JSON.parse(engine.abort(msg.id))) post({ type: 'event', event });
      break;
    case 'tokenize': case 'detokenize': {
      const r = JSON.parse(engine.tokenizer(msg.type, JSON.stringify(msg.body)));
      if (r.error) post({ type: 'add-error', rid: msg.rid, error: r.error });
      else post({ type: 'reply', rid: msg.rid, reply: r });
      break;
    }
    case 'stats':
      post({ type: 'stats', rid: msg.rid, stats: JSON.parse(engine.stats()) });
      break;
  }
}

// Applies queued messages between steps and steps while there is work.
async function pump() {
  if (stepping || !engine) return;
  stepping = true;
  try {
    for (;;) {
      while (queue.length) apply(queue.shift());
      if (!engine.has_work()) break;
      const events = JSON.parse(await engine.step());
      for (const event of events) post({ type: 'event', event });
    }
  } catch (e) {
    post({ type: 'fatal', message: String(e && e.message || e) });
  } finally {
    stepping = false;
  }
  if (queue.length) pump();
}

self.onmessage = async ({ data }) => {
  if (data.type === 'load') {
    try {
      await load(data);
    } catch (e) {
      post({ type: 'load-error', message: String(e && e.message || e) });
    }
    return;
  }
  queue.push(data);
  pump();
};

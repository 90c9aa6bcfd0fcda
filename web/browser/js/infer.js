// infer in the browser: an OpenAI-shaped API over the engine running in a Web Worker on the
// visitor's own GPU (WebGPU). Plain ES module, no bundler:
//
//   import { createEngine } from './infer.js';
//   const engine = await createEngine({ model: 'model.gguf', onProgress: p => console.log(p) });
//   const reply = await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }] });
//   for await (const chunk of await engine.chat.completions.create({ messages, stream: true })) { ... }
//
// Concurrent `create` calls are batched by the engine (continuous batching, paged KV cache).

/** An error the engine answered with OpenAI's error body (`status`, `param`, `type`). */
export class APIError extends Error {
  constructor(body) {
    const e = (body && body.error) || {};
    super(e.message || 'request failed');
    this.name = 'APIError';
    this.status = Number(e.status) || 500;
    this.param = e.param ?? null;
    this.type = e.type || 'internal_error';
  }
}

/** A streamed reply: an async iterable of chunks (as `infer serve` sends them in SSE). */
class Stream {
  constructor(engine, id) {
    this.engine = engine;
    this.id = id;
    this.chunks = [];
    this.waiting = null;
    this.ended = false;
    this.error = null;
  }

  push(item) {
    if (item.error) this.error = item.error;
    else if (item.end) this.ended = true;
    else this.chunks.push(item.chunk);
    if (this.waiting) {
      this.waiting();
      this.waiting = null;
    }
  }

  /** Stops generating; the iteration ends. */
  abort() {
    this.engine.abort(this.id);
  }

  async *[Symbol.asyncIterator]() {
    for (;;) {
      if (this.chunks.length) {
        yield this.chunks.shift();
        continue;
      }
      if (this.error) throw new APIError(this.error);
      if (this.ended) return;
      await new Promise((resolve) => { this.waiting = resolve; });
    }
  }
}

class BrowserEngine {
  constructor(worker, info) {
    this.worker = worker;
    /** Adapter, model config, KV pool, and how the weights were loaded. */
    this.info = info;
    this.nextRid = 0;
    this.pending = new Map(); // rid -> {resolve, reject}
    this.requests = new Map(); // id -> {stream} or {resolve, reject}
    this.onFatal = null;
    this.chat = { completions: { create: (body, opts) => this.create('chat', body, opts) } };
    this.completions = { create: (body, opts) => this.create('completion', body, opts) };
    worker.onmessage = ({ data }) => this.receive(data);
  }

  receive(msg) {
    switch (msg.type) {
      case 'added': case 'stats': case 'reply': {
        const p = this.pending.get(msg.rid);
        this.pending.delete(msg.rid);
        if (p) p.resolve(msg.type === 'added' ? msg.id : msg.type === 'stats' ? msg.stats : msg.reply);
        break;
      }
      case 'add-error': {
        const p = this.pending.get(msg.rid);
        this.pending.delete(msg.rid);
        if (p) p.reject(new APIError(msg.error));
        break;
      }
      case 'event': this.event(msg.event); break;
      case 'fatal':
        for (const r of this.requests.values()) {
          const body = { error: { message: msg.message, code: '500', type: 'internal_error' } };
          if (r.stream) r.stream.push({ error: body });
          else r.reject(new APIError(body));
        }
        this.requests.clear();
        if (this.onFatal) this.onFatal(new Error(msg.message));
        break;
      case 'warning': console.warn('infer:', msg.message); break;
    }
  }

  event(ev) {
    const r = this.requests.get(ev.id);
    if (!r) return;
    if (ev.type === 'chunk') {
      if (r.stream) r.stream.push({ chunk: ev.chunk });
      return;
    }
    this.requests.delete(ev.id);
    if (ev.type === 'error') {
      if (r.stream) r.stream.push({ error: ev.error });
      else r.reject(new APIError(ev.error));
    } else if (r.stream) {
      r.stream.push({ end: true });
    } else if (ev.aborted) {
      const e = new Error('Request was aborted.');
      e.name = 'AbortError';
      r.reject(e);
    } else {
      r.resolve(ev.response);
    }
  }

  call(msg) {
    const rid = this.nextRid++;
    return new Promise((resolve, reject) => {
      this.pending.set(rid, { resolve, reject });
      this.worker.postMessage({ ...msg, rid });
    });
  }

  /**
   * Adds a request (`endpoint` 'chat' or 'completion', `body` as OpenAI's API takes it).
   * Resolves to the reply, or with `stream: true` to a `Stream` of chunks. `opts.signal`
   * (an AbortSignal) aborts it.
   */
  async create(endpoint, body, opts = {}) {
    const id = await this.call({ type: 'add', endpoint, body });
    const onAbort = () => this.abort(id);
    if (opts.signal) opts.signal.addEventListener('abort', onAbort, { once: true });
    if (body.stream) {
      const stream = new Stream(this, id);
      this.requests.set(id, { stream });
      return stream;
    }
    return new Promise((resolve, reject) => this.requests.set(id, { resolve, reject }));
  }

  /** Aborts a request by id; its KV blocks are freed before the next step. */
  abort(id) {
    this.worker.postMessage({ type: 'abort', id });
  }

  /**
   * Token ids of `prompt`, as `infer serve`'s `POST /tokenize`: `{ tokens, count, max_model_len }`
   * (`addSpecialTokens` defaults to true).
   */
  tokenize(prompt, { addSpecialTokens = true } = {}) {
    return this.call({ type: 'tokenize', body: { prompt, add_special_tokens: addSpecialTokens } });
  }

  /** Text of token ids, as `POST /detokenize`: `{ prompt }`. */
  detokenize(tokens) {
    return this.call({ type: 'detokenize', body: { tokens } });
  }

  /** Engine counters: running / waiting requests, KV blocks used and total, steps, tokens. */
  stats() {
    return this.call({ type: 'stats' });
  }

  /** Stops the worker and frees the GPU. */
  terminate() {
    this.worker.terminate();
  }
}

const CREATE_OPTIONS = ['model', 'onProgress', 'kvCacheMiB', 'maxModelLen', 'cache', 'modelName', 'speculativeConfig'];

/** Refuses, by name, an option that is unknown, missing or of the wrong kind, before any download. */
function checkCreateOptions(options) {
  if (options === null || typeof options !== 'object') throw new Error('createEngine: expected an options object, e.g. { model: \'model.gguf\' }');
  const unknown = Object.keys(options).filter((k) => !CREATE_OPTIONS.includes(k));
  if (unknown.length) throw new Error(`createEngine: unknown option(s) ${unknown.join(', ')} (known: ${CREATE_OPTIONS.join(', ')})`);
  const { model, onProgress, kvCacheMiB, maxModelLen, cache, modelName } = options;
  const isFile = typeof Blob !== 'undefined' && model instanceof Blob;
  if (model === undefined || model === null || model === '') {
    throw new Error('createEngine: the `model` option is required: the URL of a GGUF file or a File the user picked');
  }
  if (typeof model !== 'string' && !isFile) throw new Error(`createEngine: \`model\` must be a URL string or a File, not ${typeof model}`);
  if (onProgress !== undefined && typeof onProgress !== 'function') throw new Error('createEngine: `onProgress` must be a function');
  const positive = (name, v, integer) => {
    if (v !== undefined && !(typeof v === 'number' && v > 0 && Number.isFinite(v) && (!integer || Number.isInteger(v)))) {
      throw new Error(`createEngine: \`${name}\` must be a positive ${integer ? 'integer' : 'number'}, not ${JSON.stringify(v)}`);
    }
  };
  positive('kvCacheMiB', kvCacheMiB, false);
  positive('maxModelLen', maxModelLen, true);
  if (cache !== undefined && typeof cache !== 'boolean') throw new Error('createEngine: `cache` must be true or false');
  if (modelName !== undefined && (typeof modelName !== 'string' || !modelName)) throw new Error('createEngine: `modelName` must be a non-empty string');
  const spec = options.speculativeConfig;
  if (spec !== undefined) {
    if (spec === null || typeof spec !== 'object') throw new Error('createEngine: `speculativeConfig` must be an object like { method: \'ngram\', num_speculative_tokens: 4 }');
    if (spec.model !== undefined && (typeof spec.model !== 'string' || !spec.model)) throw new Error('createEngine: `speculativeConfig.model` must be the draft model\'s URL');
  }
}

/**
 * Loads a model and starts the engine in a Web Worker.
 * - `model`: URL of a GGUF file (downloaded once into the browser's cache, then read in
 *   ranges) or a `File` the user picked (read in place, no upload).
 * - `onProgress({ phase: 'download' | 'upload', loaded, total })`: bytes done of total.
 * - `kvCacheMiB` (256): the KV pool; halved on out-of-memory errors.
 * - `maxModelLen`: a smaller context than the model's; `cache` (true): use the Cache API;
 * - `modelName`: the `model` replies carry (the file's name by default).
 * - `speculativeConfig`: speculative decoding with vLLM's keys, e.g. `{ method: 'ngram',
 *   num_speculative_tokens: 4, prompt_lookup_max: 3 }`, or a draft model sharing the target's
 *   tokenizer: `{ model: 'draft.gguf', num_speculative_tokens: 4 }` (streamed like `model`;
 *   its progress phase is 'draft-upload'). `stats()` reports `spec_decode`.
 * Other keys are refused.
 * Rejects with a clear message for a missing WebGPU, a corrupt or unsupported file.
 */
export async function createEngine(options = {}) {
  checkCreateOptions(options);
  if (typeof navigator === 'undefined' || !('gpu' in navigator)) throw new Error('this browser has no WebGPU (navigator.gpu is missing)');
  const { onProgress, ...rest } = options;
  if (typeof rest.model === 'string') rest.model = new URL(rest.model, document.baseURI).href;
  if (rest.speculativeConfig && rest.speculativeConfig.model) {
    rest.speculativeConfig = { ...rest.speculativeConfig, model: new URL(rest.speculativeConfig.model, document.baseURI).href };
  }
  const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
  const info = await new Promise((resolve, reject) => {
    worker.onerror = (e) => reject(new Error(`the engine worker failed to start: ${e.message || e}`));
    worker.onmessage = ({ data }) => {
      if (data.type === 'progress' && onProgress) onProgress(data);
      else if (data.type === 'adapter' && onProgress) onProgress({ phase: 'adapter', adapter: data.adapter });
      else if (data.type === 'warning') console.warn('infer:', data.message);
      else if (data.type === 'ready') resolve(data.info);
      else if (data.type === 'load-error') reject(new Error(data.message));
    };
    worker.postMessage({ type: 'load', ...rest });
  }).catch((e) => {
    worker.terminate();
    throw e;
  });
  return new BrowserEngine(worker, info);
}

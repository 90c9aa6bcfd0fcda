// Browser tests of the wasm + WebGPU engine in headless Chromium (SwiftShader's WebGPU):
// greedy output equal to the native CPU backend (SmolLM2 and the tiny fixture models), the
// wasm tokenizer equal to the reference ids, batching equal to requests alone, abort frees
// blocks, the second load comes from the cache, bad files give clear errors, and every WGSL
// kernel compiles in Chromium (Tint). Prints figures as JSON and "N passed, N failed".
//
// node web/browser/tests/run.mjs DIST_DIR MODEL.gguf INFER_BINARY   (ONLY=regex: some checks)
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

import { serve } from './server.mjs';

const [dist, modelPath, inferBin] = process.argv.slice(2);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const PROMPTS = ['The capital of France is', 'def fibonacci(n):', 'Once upon a time, there', 'Water boils at'];
const results = [];
const figures = {};

async function check(name, fn) {
  // ONLY=regex runs the matching checks alone (while working on them).
  if (process.env.ONLY && !new RegExp(process.env.ONLY).test(name)) return;
  const t = Date.now();
  try {
    await fn();
    results.push([name, true]);
    console.log(`ok   ${name} (${Date.now() - t} ms)`);
  } catch (e) {
    results.push([name, false]);
    console.log(`FAIL ${name}: ${e && e.stack || e}`);
  }
}

function assertEq(got, want, what) {
  const g = JSON.stringify(got);
  const w = JSON.stringify(want);
  if (g !== w) throw new Error(`${what}: got ${g}, want ${w}`);
}

/** Greedy continuations from the native CPU backend, the reference: f32 weights, as the browser
 * computes (packed K-quants decode on 8-bit activations natively, which moves near-ties). */
function native(model, prompt, maxTokens) {
  const r = spawnSync(inferBin, ['generate', '--model', model, '--backend', 'cpu', '--cpu-weights', 'f32', '--prompt', prompt, '--max-tokens', String(maxTokens),
    '--temperature', '0', '--ignore-eos', '--json'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`infer generate failed: ${r.stderr}`);
  return JSON.parse(r.stdout).text;
}

const server = await serve({
  '/': dist,
  '/models/smollm2.gguf': { file: modelPath },
  '/models/truncated.gguf': { file: modelPath, truncate: 0.5 },
  '/models/not-gguf.gguf': { bytes: Buffer.from('<html>this is not a model</html>'.repeat(64)) },
  ...Object.fromEntries(fs.readdirSync(path.join(root, 'fixtures/tiny')).filter((f) => f.endsWith('.gguf'))
    .map((f) => [`/tiny/${f}`, { file: path.join(root, 'fixtures/tiny', f) }])),
  ...Object.fromEntries(['qwen3_moe', 'mixtral', 'gpt_oss']
    .map((f) => [`/families/${f}.gguf`, { file: path.join(root, 'fixtures/families', `${f}.gguf`) }])),
});
const base = `http://127.0.0.1:${server.port}`;
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless=new', '--no-sandbox', '--enable-unsafe-webgpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});
const context = await browser.newContext();
const page = await context.newPage();
page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') console.log(`  [page ${m.type()}] ${m.text()}`); });
page.on('pageerror', (e) => console.log(`  [page error] ${e}`));
page.on('crash', () => console.log('  [page crash] the renderer died'));
page.on('worker', (w) => w.on('close', () => console.log('  [worker closed]')));

const modelRequests = () => server.requests.filter((r) => r.startsWith('/models/smollm2.gguf'));

const want = Object.fromEntries(PROMPTS.map((p) => [p, native(modelPath, p, 8)]));
const TINY = fs.readdirSync(path.join(root, 'fixtures/tiny')).filter((f) => f.endsWith('.gguf'));
const TINY_PROMPTS = ['Hello world', 'The quick brown fox'];
const wantTiny = Object.fromEntries(TINY.map((f) => [f, TINY_PROMPTS.map((p) => native(path.join(root, 'fixtures/tiny', f), p, 48))]));
// Mixtures of experts (routing, grouping and the expert-grouped matmul in WGSL; gpt-oss's
// sinks, clamped SwiGLU and MXFP4 experts), both prompts in one batch, so experts get more
// than one chunk of tokens in the prefill (this caught a Tint-only miscompile).
const MOE = ['qwen3_moe', 'mixtral', 'gpt_oss'];
const MOE_TOKENS = 24;
const wantMoe = Object.fromEntries(MOE.map((f) => [f, TINY_PROMPTS.map((p) => native(path.join(root, 'fixtures/families', `${f}.gguf`), p, MOE_TOKENS))]));

await page.goto(`${base}/blank.html`);

await check('every WGSL kernel compiles in Chromium (Tint), as the engine builds it', async () => {
  const r = await page.evaluate(async () => {
    // The sources come from the wasm module: exactly what the engine compiles (weight headers included).
    const wasm = await import('./pkg/infer_browser.js');
    await wasm.default();
    const kernels = JSON.parse(wasm.kernelSources());
    const adapter = await navigator.gpu.requestAdapter();
    const device = await adapter.requestDevice({ requiredLimits: { maxStorageBuffersPerShaderStage: adapter.limits.maxStorageBuffersPerShaderStage } });
    const bad = [];
    let pipelines = 0;
    for (const k of kernels) {
      const module = device.createShaderModule({ code: k.source, label: k.name });
      const info = await module.getCompilationInfo();
      const errors = info.messages.filter((m) => m.type === 'error');
      if (errors.length) { bad.push(`${k.name}: ${errors.map((e) => `${e.lineNum}:${e.linePos} ${e.message}`).join('; ')}`); continue; }
      for (const entryPoint of k.entryPoints) {
        try {
          await device.createComputePipelineAsync({ layout: 'auto', compute: { module, entryPoint } });
          pipelines += 1;
        } catch (e) { bad.push(`${k.name} ${entryPoint}: ${e.message}`); }
      }
    }
    device.destroy();
    return { bad, kernels: kernels.length, pipelines };
  });
  if (r.bad.length) throw new Error(r.bad.join('\n'));
  if (r.kernels < 20) throw new Error(`only ${r.kernels} kernels`);
  figures.kernels_compiled = r.pipelines;
});

await check('cold load of SmolLM2 (download into the cache, upload to WebGPU)', async () => {
  const info = await page.evaluate(async () => {
    const { createEngine } = await import('./infer.js');
    const phases = new Set();
    window.engine = await createEngine({ model: '/models/smollm2.gguf', kvCacheMiB: 64, maxModelLen: 1024, onProgress: (p) => phases.add(p.phase) });
    return { ...window.engine.info, phases: [...phases] };
  });
  if (info.fromCache) throw new Error('the first load came from the cache');
  for (const p of ['download', 'upload']) if (!info.phases.includes(p)) throw new Error(`no ${p} progress`);
  figures.adapter = info.adapter.name;
  figures.load_cold_ms = Math.round(info.loadMs);
  figures.kv = info.kv;
});

const complete = (prompt, max_tokens, extra = {}) => page.evaluate(async ([prompt, max_tokens, extra]) => {
  const r = await window.engine.completions.create({ prompt, max_tokens, temperature: 0, ignore_eos: true, ...extra });
  return r.choices[0].text;
}, [prompt, max_tokens, extra]);

await check('the wasm tokenizer gives the reference ids (fixtures/reference.json) and round-trips', async () => {
  const cases = JSON.parse(fs.readFileSync(path.join(root, 'fixtures/reference.json'), 'utf8')).tokenizer_cases;
  const got = await page.evaluate(async (texts) => {
    const out = [];
    for (const t of texts) {
      const { tokens } = await window.engine.tokenize(t);
      out.push({ tokens, text: (await window.engine.detokenize(tokens)).prompt });
    }
    return out;
  }, cases.map((c) => c.text));
  cases.forEach((c, i) => {
    assertEq(got[i].tokens, c.ids, JSON.stringify(c.text));
    assertEq(got[i].text, c.text, `round trip of ${JSON.stringify(c.text)}`);
  });
});

await check('greedy output equals the CPU backend (4 prompts x 8 tokens, each alone)', async () => {
  for (const p of PROMPTS) assertEq(await complete(p, 8), want[p], p);
});

await check('tiny fixture models equal the CPU backend over 48 tokens (Q4_0 GQA, Q4_1/BF16 Llama 3, Q4_K/Q6_K, Qwen2 Q8_0 biases)', async () => {
  for (const file of TINY) {
    const got = await page.evaluate(async ([url, prompts]) => {
      const { createEngine } = await import('./infer.js');
      const e = await createEngine({ model: url, kvCacheMiB: 4, cache: false });
      try {
        return await Promise.all(prompts.map(async (prompt) => (await e.completions.create({ prompt, max_tokens: 48, temperature: 0, ignore_eos: true })).choices[0].text));
      } finally { e.terminate(); }
    }, [`/tiny/${file}`, TINY_PROMPTS]);
    TINY_PROMPTS.forEach((p, i) => assertEq(got[i], wantTiny[file][i], `${file}: ${p}`));
  }
});

await check('speculative decoding (n-gram, and a draft model awaited through step_async) keeps the greedy output', async () => {
  // A tiny model as its own draft: every proposal is its own greedy choice. Proposals are
  // verified by the target, so the output must be the plain greedy output either way.
  const file = TINY[0];
  const r = await page.evaluate(async ([url, prompts]) => {
    const { createEngine } = await import('./infer.js');
    const out = {};
    for (const [name, speculativeConfig] of [
      ['ngram', { method: 'ngram', num_speculative_tokens: 4, prompt_lookup_max: 3 }],
      ['draft', { model: url, num_speculative_tokens: 3 }],
    ]) {
      const e = await createEngine({ model: url, kvCacheMiB: 4, cache: false, speculativeConfig });
      try {
        const texts = await Promise.all(prompts.map(async (prompt) => (await e.completions.create({ prompt, max_tokens: 48, temperature: 0, ignore_eos: true })).choices[0].text));
        out[name] = { texts, spec: (await e.stats()).spec_decode, kv: e.info.kv };
      } finally { e.terminate(); }
    }
    return out;
  }, [`/tiny/${file}`, TINY_PROMPTS]);
  for (const name of ['ngram', 'draft']) {
    TINY_PROMPTS.forEach((p, i) => assertEq(r[name].texts[i], wantTiny[file][i], `${name}: ${p}`));
    if (!(r[name].spec.num_drafts > 0)) throw new Error(`${name}: no proposals ${JSON.stringify(r[name].spec)}`);
  }
  const d = r.draft.spec;
  if (!(d.num_accepted_tokens * 10 >= d.num_draft_tokens * 9)) throw new Error(`a model as its own draft: ${JSON.stringify(d)}`);
  figures.speculation = { ngram: r.ngram.spec, draft: d };
});

await check('mixtures of experts equal the CPU backend (Qwen3-MoE, Mixtral, gpt-oss with MXFP4 experts)', async () => {
  for (const name of MOE) {
    const got = await page.evaluate(async ([url, prompts, n]) => {
      const { createEngine } = await import('./infer.js');
      const e = await createEngine({ model: url, kvCacheMiB: 4, cache: false });
      try {
        return await Promise.all(prompts.map(async (prompt) => (await e.completions.create({ prompt, max_tokens: n, temperature: 0, ignore_eos: true })).choices[0].text));
      } finally { e.terminate(); }
    }, [`/families/${name}.gguf`, TINY_PROMPTS, MOE_TOKENS]);
    TINY_PROMPTS.forEach((p, i) => assertEq(got[i], wantMoe[name][i], `${name}: ${p}`));
  }
});

await check('4 concurrent requests equal each alone (batching changes nothing)', async () => {
  const got = await page.evaluate(async (prompts) => {
    const rs = await Promise.all(prompts.map((prompt) => window.engine.completions.create({ prompt, max_tokens: 8, temperature: 0, ignore_eos: true })));
    return rs.map((r) => r.choices[0].text);
  }, PROMPTS);
  assertEq(got, PROMPTS.map((p) => want[p]), 'batched');
});

await check('streamed chat: role first, deltas, finish, usage; same text as the JSON reply', async () => {
  const r = await page.evaluate(async () => {
    const body = { messages: [{ role: 'user', content: 'What is the capital of France?' }], max_tokens: 8, temperature: 0 };
    const json = await window.engine.chat.completions.create(body);
    const stream = await window.engine.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    return { json, chunks };
  });
  assertEq(r.chunks[0].choices[0].delta.role, 'assistant', 'first delta');
  const text = r.chunks.flatMap((c) => c.choices).map((c) => (c.delta && c.delta.content) || '').join('');
  assertEq(text, r.json.choices[0].message.content, 'streamed text');
  // Same counts; the second (streamed) run found its prompt in the prefix cache.
  const [streamed, whole] = [r.chunks.at(-1).usage, r.json.usage];
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens']) assertEq(streamed[k], whole[k], `usage.${k}`);
  if (!(streamed.prompt_tokens_details.cached_tokens > whole.prompt_tokens_details.cached_tokens)) {
    throw new Error(`cached_tokens ${JSON.stringify(streamed)} vs ${JSON.stringify(whole)}`);
  }
  if (r.json.object !== 'chat.completion') throw new Error(`object ${r.json.object}`);
});

await check('structured outputs in the browser: guided choice and a JSON schema, as natively', async () => {
  const r = await page.evaluate(async () => {
    const ask = (content, extra) => window.engine.chat.completions.create({ messages: [{ role: 'user', content }], max_tokens: 60, temperature: 0, ...extra });
    const choice = await ask('Is Paris the capital of France? Answer yes or no.', { guided_choice: ['yes', 'no'] });
    const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, sunny: { type: 'boolean' } }, required: ['city', 'sunny'], additionalProperties: false };
    const json = await ask('Describe the weather in Paris as JSON.', { response_format: { type: 'json_schema', json_schema: { name: 'w', schema } } });
    return { choice: choice.choices[0].message.content, json: json.choices[0].message.content, finish: json.choices[0].finish_reason };
  });
  // The native engine answers "yes" to this prompt (tests/tests/structured.rs).
  assertEq(r.choice, 'yes', 'guided choice');
  const v = JSON.parse(r.json);
  if (typeof v.city !== 'string' || typeof v.sunny !== 'boolean' || Object.keys(v).length !== 2) throw new Error(`schema: ${r.json}`);
  assertEq(r.finish, 'stop', 'finish_reason');
});

await check('tool calls in the browser: tool_choice required parses, streamed deltas reassemble into the JSON reply', async () => {
  const r = await page.evaluate(async () => {
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'], additionalProperties: false } } }];
    const body = { messages: [{ role: 'user', content: 'What is the weather in Paris?' }], tools, tool_choice: 'required', max_tokens: 32, temperature: 0 };
    const json = await window.engine.chat.completions.create(body);
    const stream = await window.engine.chat.completions.create({ ...body, stream: true });
    let name = '', args = '', finish = null;
    for await (const c of stream) {
      for (const ch of c.choices) {
        for (const d of ch.delta.tool_calls || []) { name += d.function.name || ''; args += d.function.arguments || ''; }
        finish = ch.finish_reason || finish;
      }
    }
    return { choice: json.choices[0], name, args, finish };
  });
  const call = r.choice.message.tool_calls[0];
  assertEq([call.function.name, r.choice.finish_reason, r.choice.message.content], ['get_weather', 'tool_calls', null], 'call');
  if (typeof JSON.parse(call.function.arguments).city !== 'string') throw new Error(`arguments ${call.function.arguments}`);
  assertEq([r.name, r.args, r.finish], [call.function.name, call.function.arguments, 'tool_calls'], 'streamed');
});

await check('bad parameters are refused with a 400 naming them, unknown or missing createEngine options by name', async () => {
  const e = await page.evaluate(async () => {
    try { await window.engine.completions.create({ prompt: 'x', temperature: -1 }); return null; } catch (e) { return { status: e.status, param: e.param, message: e.message }; }
  });
  if (!e || e.status !== 400 || e.param !== 'temperature') throw new Error(`got ${JSON.stringify(e)}`);
  const unknown = await page.evaluate(async () => {
    const { createEngine } = await import('./infer.js');
    try { await createEngine({ model: '/models/smollm2.gguf', kvCacheMB: 64 }); return null; } catch (e) { return e.message; }
  });
  if (!unknown || !unknown.includes('kvCacheMB')) throw new Error(`unknown createEngine option: ${unknown}`);
  const missing = await page.evaluate(async () => {
    const { createEngine } = await import('./infer.js');
    try { await createEngine({}); return null; } catch (e) { return e.message; }
  });
  if (!missing || !/`model` option is required/.test(missing)) throw new Error(`createEngine({}): ${missing}`);
});

await check('abort frees the request\'s KV blocks', async () => {
  const s = await page.evaluate(async () => {
    const stream = await window.engine.completions.create({ prompt: 'Tell me a long story.', max_tokens: 200, temperature: 0, ignore_eos: true, stream: true });
    let n = 0;
    let during = null;
    for await (const c of stream) {
      if (++n === 3) { during = await window.engine.stats(); stream.abort(); }
    }
    const after = await window.engine.stats();
    return { during, after, n };
  });
  if (!(s.during.kv_blocks_used > 0)) throw new Error(`no blocks held while running: ${JSON.stringify(s.during)}`);
  assertEq([s.after.kv_blocks_used, s.after.num_running, s.after.active_requests], [0, 0, 0], 'after abort');
  if (s.n >= 200) throw new Error('the stream ran to the end');
});

await check('decode speed and time to first token (figures)', async () => {
  const f = await page.evaluate(async () => {
    const t0 = performance.now();
    const stream = await window.engine.completions.create({ prompt: 'The history of the printing press', max_tokens: 16, temperature: 0, ignore_eos: true, stream: true });
    let first = null;
    let n = 0;
    for await (const c of stream) { if (first === null) first = performance.now(); n += c.choices.length ? 1 : 0; }
    const end = performance.now();
    // A chat turn's prompt (the template and its default system prompt) is longer.
    const c0 = performance.now();
    const chat = await window.engine.chat.completions.create({ messages: [{ role: 'user', content: 'Name three colors of the rainbow.' }], max_tokens: 1 });
    return { ttft_ms: first - t0, decode_tok_s: (n - 1) / ((end - first) / 1000), tokens: n, chat_prompt_tokens: chat.usage.prompt_tokens, chat_ttft_ms: performance.now() - c0 };
  });
  Object.assign(figures, { ttft_ms: Math.round(f.ttft_ms), decode_tok_s: Number(f.decode_tok_s.toFixed(2)), chat_prompt_tokens: f.chat_prompt_tokens, chat_ttft_ms: Math.round(f.chat_ttft_ms) });
});

await check('a second page load takes the weights from the cache', async () => {
  const before = modelRequests().length;
  const page2 = await context.newPage();
  await page2.goto(`${base}/blank.html`);
  const info = await page2.evaluate(async () => {
    const { createEngine } = await import('./infer.js');
    const e = await createEngine({ model: '/models/smollm2.gguf', kvCacheMiB: 32, maxModelLen: 512 });
    const r = await e.completions.create({ prompt: 'The capital of France is', max_tokens: 8, temperature: 0, ignore_eos: true });
    e.terminate();
    return { ...e.info, text: r.choices[0].text };
  });
  await page2.close();
  assertEq(modelRequests().length - before, 0, 'network requests for the model');
  if (!info.fromCache) throw new Error('not loaded from the cache');
  assertEq(info.text, want['The capital of France is'], 'output after a cached load');
  figures.load_cached_ms = Math.round(info.loadMs);
});

await check('demo page: adapter and limits, two chats streaming at once with tok/s, stop', async () => {
  const demo = await context.newPage();
  try {
    await demo.goto(`${base}/index.html?model=/models/smollm2.gguf`);
    await demo.waitForFunction(() => !document.getElementById('prompt').disabled, null, { timeout: 120000 });
    const adapter = await demo.textContent('#adapter');
    if (!/max binding \d+ MiB/.test(adapter)) throw new Error(`adapter panel: ${adapter}`);
    await demo.check('#two');
    await demo.fill('#prompt', 'Hi!');
    await demo.click('#send');
    // Both conversations stream at least two tokens (a live rate needs two), then Stop ends them.
    await demo.waitForFunction(() => [...document.querySelectorAll('.chat .meta')].filter((m) => /tok\/s/.test(m.textContent) && parseInt(m.textContent, 10) >= 2).length === 2,
      null, { timeout: 240000 });
    await demo.click('#stop');
    await demo.waitForFunction(() => document.getElementById('stop').disabled, null, { timeout: 120000 });
    const stats = await demo.textContent('#stats');
    if (!/KV blocks \d+\/\d+/.test(stats)) throw new Error(`stats footer: ${stats}`);
    figures.demo_adapter = adapter.split('\n')[0];
    if (process.env.SCREENSHOT) await demo.screenshot({ path: process.env.SCREENSHOT, fullPage: true });
  } finally { await demo.close(); }
});

await check('demo page: a GGUF file picked from disk loads without any request for it', async () => {
  const demo = await context.newPage();
  try {
    await demo.goto(`${base}/index.html`);
    const file = path.join(root, 'fixtures/tiny', TINY[0]);
    const before = server.requests.length;
    await demo.setInputFiles('#model-file', file);
    await demo.click('#load-btn');
    await demo.waitForFunction(() => /loaded in/.test(document.getElementById('load-status').textContent) || document.getElementById('load-status').className === 'error', null, { timeout: 60000 });
    const status = await demo.textContent('#load-status');
    if (!/loaded in/.test(status)) throw new Error(`status: ${status}`);
    const fetched = server.requests.slice(before).filter((r) => r.includes('.gguf'));
    assertEq(fetched, [], 'model requests');
  } finally { await demo.close(); }
});

await check('infer serve offers the demo at /browser/ with the GGUF it loaded', async () => {
  const port = 18000 + Math.floor(Math.random() * 2000);
  const child = spawn(inferBin, ['serve', '--model', modelPath, '--port', String(port), '--max-model-len', '512'], { stdio: 'ignore' });
  const demo = await context.newPage();
  try {
    const url = `http://127.0.0.1:${port}`;
    for (let i = 0; ; i++) {
      if ((await fetch(`${url}/health`).catch(() => null))?.ok) break;
      if (i > 600) throw new Error('infer serve did not come up');
      await new Promise((r) => setTimeout(r, 100));
    }
    await demo.goto(`${url}/browser/`);
    await demo.click('#load-btn');
    await demo.waitForFunction(() => /loaded in|error/.test(document.getElementById('load-status').textContent + document.getElementById('load-status').className), null, { timeout: 120000 });
    const status = await demo.textContent('#load-status');
    if (!/loaded in/.test(status)) throw new Error(`status: ${status}`);
  } finally {
    await demo.close();
    child.kill();
  }
});

for (const [url, needle] of [['/models/truncated.gguf', 'truncated'], ['/models/not-gguf.gguf', 'GGUF']]) {
  await check(`${url} gives a clear error`, async () => {
    const msg = await page.evaluate(async (url) => {
      const { createEngine } = await import('./infer.js');
      try { await createEngine({ model: url }); return null; } catch (e) { return e.message; }
    }, url);
    if (!msg || !msg.includes(needle)) throw new Error(`message: ${msg}`);
    figures[`error_${path.basename(url)}`] = msg;
    const cached = await page.evaluate(async (url) => Boolean(await (await caches.open('infer-models-v1')).match(new URL(url, location.href).href)), url);
    if (cached) throw new Error('the bad file stayed in the cache');
  });
}

figures.wasm_bytes = fs.statSync(path.join(dist, 'pkg/infer_browser_bg.wasm')).size;
await browser.close();
server.close();
console.log(`figures: ${JSON.stringify(figures)}`);
const passed = results.filter((r) => r[1]).length;
console.log(`${passed} passed, ${results.length - passed} failed`);
process.exit(passed === results.length ? 0 : 1);

// createEngine's option checks, in Node (no browser needed): they run before anything touches
// WebGPU or the network, so a caller's mistake is named instead of surfacing as a 404 or a
// worker error.  node --test web/browser/tests/options.test.mjs
import assert from 'node:assert/strict';
import test from 'node:test';

import { createEngine } from '../js/infer.js';

const refused = async (options, pattern) => {
  await assert.rejects(() => createEngine(options), (e) => {
    assert.match(e.message, pattern);
    return true;
  });
};

test('a missing model is named', async () => {
  await refused({}, /the `model` option is required/);
  await refused(undefined, /the `model` option is required/);
  await refused({ model: '' }, /the `model` option is required/);
});

test('options of the wrong kind are named', async () => {
  await refused(null, /expected an options object/);
  await refused({ model: 42 }, /`model` must be a URL string or a File/);
  await refused({ model: 'm.gguf', onProgress: 'yes' }, /`onProgress` must be a function/);
  await refused({ model: 'm.gguf', kvCacheMiB: 0 }, /`kvCacheMiB` must be a positive number/);
  await refused({ model: 'm.gguf', maxModelLen: 100.5 }, /`maxModelLen` must be a positive integer/);
  await refused({ model: 'm.gguf', cache: 'no' }, /`cache` must be true or false/);
  await refused({ model: 'm.gguf', modelName: '' }, /`modelName` must be a non-empty string/);
  await refused({ model: 'm.gguf', speculativeConfig: 'ngram' }, /`speculativeConfig` must be an object/);
  await refused({ model: 'm.gguf', speculativeConfig: { model: 3 } }, /`speculativeConfig.model` must be the draft model's URL/);
});

test('unknown options are named', async () => {
  await refused({ model: 'm.gguf', kvCacheMB: 64 }, /unknown option\(s\) kvCacheMB/);
});

test('valid options get past the checks (then Node has no WebGPU)', async () => {
  await refused({ model: 'm.gguf', kvCacheMiB: 64, maxModelLen: 512, cache: false }, /no WebGPU/);
  await refused({ model: 'm.gguf', speculativeConfig: { method: 'ngram', num_speculative_tokens: 4 } }, /no WebGPU/);
});

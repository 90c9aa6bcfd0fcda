#!/usr/bin/env bash
# The browser tests: builds the wasm engine (scripts/build-browser.sh), then drives it in
# headless Chromium with WebGPU (SwiftShader where there is no GPU) against the native CPU
# backend. Needs Debian's `chromium` and node/npm (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
scripts/build-browser.sh target/browser-dist
# The test build's feature set (`mpi`): another set would rebuild the binary here and again
# in the openai client suite (5 min of CI's 2 cores).
cargo build -q --release --bin infer --features mpi
(cd web/browser/tests && npm install --no-audit --no-fund --loglevel=error)
node web/browser/tests/run.mjs "$PWD/target/browser-dist" "$MODEL" target/release/infer

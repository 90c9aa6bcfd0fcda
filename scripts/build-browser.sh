#!/usr/bin/env bash
# Builds the browser engine into a folder any static host can serve (default
# target/browser-dist): pkg/ (the wasm module and its wasm-bindgen glue), infer.js and worker.js
# (the JS API), and the demo page. `infer serve` embeds this folder at /browser/ when it exists
# at build time.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/browser-dist}
WB_VERSION=$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
if ! command -v wasm-bindgen >/dev/null || [ "$(wasm-bindgen --version | cut -d' ' -f2)" != "$WB_VERSION" ]; then
  echo "installing wasm-bindgen-cli $WB_VERSION (must match Cargo.lock)" >&2
  cargo install -q wasm-bindgen-cli --version "$WB_VERSION"
fi
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
cargo build -p infer-browser --target wasm32-unknown-unknown --profile browser
rm -rf "$OUT"
mkdir -p "$OUT/pkg"
wasm-bindgen --target web --no-typescript --out-dir "$OUT/pkg" \
  target/wasm32-unknown-unknown/browser/infer_browser.wasm
cp web/browser/js/*.js web/browser/static/* "$OUT/"
echo "$OUT: wasm $(stat -c %s "$OUT/pkg/infer_browser_bg.wasm") bytes" >&2

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
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/pkg"
wasm-bindgen --target web --no-typescript --out-dir "$STAGE/pkg" \
  target/wasm32-unknown-unknown/browser/infer_browser.wasm
cp web/browser/js/*.js web/browser/static/* "$STAGE/"
# Only what changed is written: the server embeds this folder, and a file written again, even
# unchanged, makes cargo rebuild it (minutes of CI, which builds the folder before its tests).
mkdir -p "$OUT"
(cd "$STAGE" && find . -type f) | while read -r f; do
  if ! cmp -s "$STAGE/$f" "$OUT/$f"; then
    mkdir -p "$(dirname "$OUT/$f")"
    cp "$STAGE/$f" "$OUT/$f"
  fi
done
(cd "$OUT" && find . -type f) | while read -r f; do
  [ -e "$STAGE/$f" ] || rm -f "$OUT/$f"
done
echo "$OUT: wasm $(stat -c %s "$OUT/pkg/infer_browser_bg.wasm") bytes" >&2

#!/usr/bin/env bash
# The test command: fetch the model, check formatting and lints, run every test (release
# build: the tests run the real model), then the official openai client against `infer serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
scripts/openai-client-tests.sh

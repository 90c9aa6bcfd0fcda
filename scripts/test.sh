#!/usr/bin/env bash
# The test command: fetch the model, check formatting, import circles, the docs' links and
# book, and lints, run every test (release
# build: the tests run the real model; the CPU kernels also for aarch64 under qemu-user), then
# the official openai client against `infer serve`,
# then the Python package (`pip install ./cli/python`, LLM / AsyncLLM / Ray Serve / Ray Data).
set -euo pipefail
cd "$(dirname "$0")/.."
# No debug info in the test build (and the binaries the later scripts build): with it the ~60
# test binaries, each linking the whole stack, take 9 GB of disk instead of 1.5.
export CARGO_PROFILE_RELEASE_DEBUG=false
scripts/fetch-model.sh
# NVRTC lets the CUDA kernels' compile test run here; with no libcuda the GPU tests skip.
NVRTC_LIB=$(scripts/fetch-nvrtc.sh)
export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo fmt --all --check
# No import circles between files (issue 38).
python3 scripts/import_circles.py
# Every GGUF key llama.cpp knows has a row in infer's key table (issue 58; fetches the
# llama.cpp sources of the sdist the fixtures were converted with, 76 MB, once).
python3 scripts/check_gguf_keys.py
# The README and the manual's links, and the manual built as a site (mdBook).
scripts/docs.sh
# Before the first build: the server embeds the chat page's markdown libraries from npm, and
# the browser engine's build (so the test build embeds it and the later suites rebuild nothing).
scripts/chat-page-deps.sh
scripts/build-browser.sh target/browser-dist
# `mpi`: tensor parallelism over MPI (Open MPI from .ci/run), tested under mpirun.
cargo clippy --workspace --all-targets --release --features infer-cli/mpi -- -D warnings
cargo test --workspace --release --features infer-cli/mpi
# A second build with nothing changed compiles nothing (the test build's own flags).
scripts/check-noop-build.sh test --workspace --release --features infer-cli/mpi --no-run
# The NEON kernels: the CPU backend's tests for aarch64 under qemu-user.
scripts/aarch64-tests.sh
# createEngine's option checks (Node, no browser).
node --test web/browser/tests/options.test.mjs
# The browser engine: the wasm32 build, then its tests in headless Chromium (WebGPU).
scripts/browser-tests.sh
scripts/openai-client-tests.sh
scripts/python-tests.sh

#!/usr/bin/env bash
# The Python suite: the official `openai` client against `infer serve` (tests/openai_client).
# Builds the binary if needed and keeps its virtual environment under target/.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/openai-venv
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/openai_client/requirements.txt
# The chat page's libraries (embedded by the build) and its Chromium test's driver.
scripts/chat-page-deps.sh
cargo build --release --bin infer --features mpi
INFER_BIN=target/release/infer "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/openai_client
# The same client suite against a 3-rank tensor-parallel server (mpirun; lm-eval once is enough).
INFER_TP=3 INFER_BIN=target/release/infer "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/openai_client --deselect tests/openai_client/test_lm_eval.py

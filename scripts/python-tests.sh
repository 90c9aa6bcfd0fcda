#!/usr/bin/env bash
# The Python package (cli/python): installed with the README's command (`pip install
# ./cli/python`, maturin building the native module) into a virtual environment under target/,
# then its tests: LLM and AsyncLLM against `infer generate` / `infer serve` and the reference
# tokens, Ray Serve replicas and Ray Data actors on one local cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/python-venv
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --quiet --disable-pip-version-check "$@"; }
pip install -r cli/python/tests/requirements.txt
pip install ./cli/python
cargo build --release --bin infer --features mpi
# From the tests' folder: `infer` is the installed package, not the source tree.
ROOT=$PWD
cd cli/python/tests
INFER_BIN="$ROOT/target/release/infer" "$ROOT/$VENV/bin/python" -m pytest -q -p no:cacheprovider .

#!/usr/bin/env bash
# Builds (here, with internet) what scripts/gpu-check.sh runs on the GPU machine, which has
# CUDA but no internet and no Rust: the stripped `infer` binary and the CUDA test binaries in
# target/gpu-bundle/, and the SmolLM2 GGUF split in 30 MiB parts (each carry is at most
# 64 MiB, so the parts travel over several calls; gpu-check.sh reassembles them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh >&2
OUT=target/gpu-bundle
rm -rf "$OUT" && mkdir -p "$OUT/bin" "$OUT/model"
cargo build --release --bin infer >&2
cp target/release/infer "$OUT/bin/infer"
# The CUDA tests, under stable names.
cargo test --release -p infer-cuda --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/bin/cuda-" + m["target"]["name"])
' "$OUT"
strip "$OUT"/bin/*
split -b 30M -d models/SmolLM2-135M-Instruct.Q4_1.gguf "$OUT/model/part-"
ls -la "$OUT"/bin "$OUT"/model >&2

#!/usr/bin/env bash
# Builds (here, with internet) what scripts/gpu-check.sh runs on the GPU machine, which has
# CUDA but no internet and no Rust, in target/gpu-bundle/: bin.tar.xz (the stripped `infer`
# binary and the CUDA test binaries), smollm2-hf/ (SmolLM2's config and tokenizer, for random
# weights), and the SmolLM2 GGUF split in 30 MiB parts. A call carries at most 64 MiB with
# the work tree, so the parts travel over several calls; gpu-check.sh reassembles them:
#   1. carry bin.tar.xz, smollm2-hf, model/part-00:  scripts/gpu-check.sh nomodel
#   2. carry model/part-01, model/part-03:           scripts/gpu-check.sh --parts-only
#   3. carry model/part-02:                          scripts/gpu-check.sh model
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
tar -C "$OUT" -cJf "$OUT/bin.tar.xz" bin
target/release/infer tokenizer export models/SmolLM2-135M-Instruct.Q4_1.gguf "$OUT/smollm2-hf" >&2
cp configs/smollm2-135m/config.json "$OUT/smollm2-hf/"
split -b 30M -d models/SmolLM2-135M-Instruct.Q4_1.gguf "$OUT/model/part-"
ls -la "$OUT" "$OUT"/model >&2

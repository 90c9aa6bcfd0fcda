#!/usr/bin/env bash
# Runs on the GPU machine (no internet, nothing built there): the CUDA kernel tests against
# the CPU backend, SmolLM2 greedy on CUDA vs CPU, and the benchmarks, then a short table.
# Needs target/gpu-bundle from scripts/gpu-bundle.sh (carried over); model parts may arrive
# over several calls: each call stashes what it got in ~/.infer-model-parts.
set -uo pipefail
cd "$(dirname "$0")/.."
B=target/gpu-bundle
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
STASH=$HOME/.infer-model-parts
mkdir -p "$STASH" models
[ -d "$B/model" ] && cp -n "$B"/model/part-* "$STASH"/ 2>/dev/null
if [ ! -f "$MODEL" ]; then
  cat "$STASH"/part-* > "$MODEL.tmp" 2>/dev/null
  if echo "$SHA256  $MODEL.tmp" | sha256sum -c --status; then
    mv "$MODEL.tmp" "$MODEL"
  else
    rm -f "$MODEL.tmp"
    echo "model parts so far: $(ls "$STASH" | tr '\n' ' ') (not complete yet)"
    [ "${1:-}" = "--parts-only" ] && exit 0
  fi
fi
[ "${1:-}" = "--parts-only" ] && { echo "model ready"; exit 0; }
[ -x "$B/bin/infer" ] || { echo "no $B/bin/infer: run scripts/gpu-bundle.sh and carry $B"; exit 2; }

# CUDA libraries: the toolkit's, or the ones PyTorch ships.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
TORCH_LIBS=$(python3 -c 'import glob, os, torch; d = os.path.dirname(torch.__file__); print(":".join([d + "/lib"] + glob.glob(d + "/../nvidia/*/lib")))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$TORCH_LIBS"
# NCCL (tensor parallelism): PyTorch's wheel ships libnccl.so.2; cudarc opens libnccl.so.
NCCL2=$(echo "$LD_LIBRARY_PATH" | tr ':' '\n' | while read -r d; do
  [ -n "$d" ] && [ -f "$d/libnccl.so.2" ] && { echo "$d/libnccl.so.2"; break; }; done)
if [ -n "$NCCL2" ]; then
  mkdir -p /tmp/nccl-link && ln -sf "$NCCL2" /tmp/nccl-link/libnccl.so
  export LD_LIBRARY_PATH="/tmp/nccl-link:$LD_LIBRARY_PATH"
fi
export INFER_TEST_MODEL=$PWD/$MODEL HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.memory --format=csv
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
export GPU_NAME

declare -a ROWS
status=0
for t in nvrtc no_gpu kernels nccl smollm2; do
  exe=$B/bin/cuda-$t
  [ -x "$exe" ] || { ROWS+=("test $t|missing"); status=1; continue; }
  if out=$("$exe" --test-threads 1 --nocapture 2>&1); then
    res=$(echo "$out" | grep -E "^test result" | tail -1)
    echo "$out" | grep -q SKIPPED && res="$res (SKIPPED inside)"
  else
    echo "$out" | tail -40
    res="FAILED"; status=1
  fi
  ROWS+=("test $t|$res")
done

I=$B/bin/infer
bench() { # name, then infer arguments; records the JSON line
  local name=$1; shift
  local json
  if json=$("$I" "$@" --json 2>/tmp/bench-err | tail -1) && [ -n "$json" ]; then
    ROWS+=("$name|$json")
  else
    ROWS+=("$name|FAILED: $(tail -3 /tmp/bench-err | tr '\n' ' ')"); status=1
  fi
}
SMOL=(--model "$MODEL" --backend cuda)
DUMMY=(--model configs/llama-3-8b/config.json --load-format dummy --tokenizer "$MODEL" --backend cuda)
# Tensor parallelism's CUDA path at world size 1 (one GPU; two ranks need two): `mp` builds
# the NCCL communicator and hands every step over, and must give the plain greedy tokens.
greedy() {
  "$I" generate "${SMOL[@]}" --chat --prompt "What is the capital of France?" --temperature 0 \
    --max-tokens 32 --json "$@" 2>/tmp/greedy-err | head -1 |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["token_ids"])' 2>/dev/null
}
plain=$(greedy); tp1=$(greedy -tp 1 --distributed-executor-backend mp)
if [ -n "$plain" ] && [ "$plain" = "$tp1" ]; then
  ROWS+=("smollm2 greedy, mp -tp 1 (NCCL) == plain|ok")
else
  ROWS+=("smollm2 greedy, mp -tp 1 (NCCL) == plain|FAILED: $(tail -2 /tmp/greedy-err | tr '\n' ' ')")
  status=1
fi
bench "smollm2 throughput 256x(128+128)" bench throughput "${SMOL[@]}" --num-prompts 256 --input-len 128 --output-len 128 --ignore-eos
bench "smollm2 batch-1 decode" bench latency "${SMOL[@]}" --batch-size 1 --input-len 32 --output-len 256 --num-iters 3
bench "llama-3-8b(dummy) throughput 128x(128+128)" bench throughput "${DUMMY[@]}" --num-prompts 128 --input-len 128 --output-len 128 --ignore-eos
bench "llama-3-8b(dummy) batch-1 decode" bench latency "${DUMMY[@]}" --batch-size 1 --input-len 32 --output-len 128 --num-iters 3

echo
echo "=== gpu-check summary ==="
for r in "${ROWS[@]}"; do
  name=${r%%|*}; val=${r#*|}
  case "$val" in
    \{*) val=$(echo "$val" | NAME="$name" python3 -c '
import json, os, sys
v = json.load(sys.stdin)
keys = ["output_tokens_per_s", "requests_per_s", "decode_tok_s_per_request_p50", "ttft_p50_s", "latency_p50_s"]
line = "  ".join(f"{k}={v[k]:.4g}" for k in keys if k in v)
# Batch-1 decode reads every weight once per token (f16: 2 bytes each; the embedding table
# only as the tied lm_head): tok/s against HBM bandwidth / weight bytes.
gpu = os.environ.get("GPU_NAME", "")
bw = 4.8e12 if "H200" in gpu else 2.0e12 if "PCIe" in gpu else 3.35e12 if "H100" in gpu else None
weights = 2 * (134.5e6 if "smollm2" in os.environ["NAME"] else 7.50e9)
tps = v.get("decode_tok_s_per_request_p50")
if tps and bw:
    line += f"  roofline={bw / weights:.0f} tok/s ({100 * tps * weights / bw:.1f}% of HBM {bw / 1e12:.2f} TB/s)"
print(line)') ;;
  esac
  printf "%-45s %s\n" "$name" "$val"
done
exit $status

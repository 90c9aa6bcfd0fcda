#!/usr/bin/env bash
# Runs on the GPU machine (no internet, nothing built there): the CUDA kernel tests against
# the CPU backend, SmolLM2 greedy on CUDA vs CPU, and the benchmarks, then a short table.
# Needs target/gpu-bundle from scripts/gpu-bundle.sh (carried over). The SmolLM2 GGUF is over
# what one call carries, so its parts may arrive over several calls (each stashes what it got
# in ~/.infer-model-parts) while the sections that need no model run:
#   scripts/gpu-check.sh [all|nomodel|quick|graphs|model|--parts-only]
# `nomodel`: kernel tests and benchmarks on random weights; `quick`: the kernel tests and the
# batch-1 decode rows of `nomodel`; `graphs`: kernel and family tests, then decode with CUDA
# graphs beside --enforce-eager (and GPU_CHECK_BASELINE's build, where given); `model`: the rows that need the real SmolLM2; `all`
# (default): both. GPU_CHECK_BACKEND=cpu dry-runs the script here (no 8B
# rows).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
case "$MODE" in all|nomodel|quick|graphs|model|--parts-only) ;; *) echo "usage: $0 [all|nomodel|quick|graphs|model|--parts-only]"; exit 2 ;; esac
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
    case "$MODE" in --parts-only|nomodel|quick|graphs) ;; *) exit 2 ;; esac
  fi
fi
[ "$MODE" = --parts-only ] && exit 0
# The binaries travel compressed (one call carries at most 64 MiB).
if [ -f "$B/bin.tar.xz" ] && [ ! -x "$B/bin/infer" -o "$B/bin.tar.xz" -nt "$B/bin/infer" ]; then
  tar -C "$B" -xJf "$B/bin.tar.xz" && touch "$B/bin/infer"
fi
[ -x "$B/bin/infer" ] || { echo "no $B/bin/infer: run scripts/gpu-bundle.sh and carry $B"; exit 2; }
BACKEND=${GPU_CHECK_BACKEND:-cuda}

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
TESTS=()
case "$MODE" in
  quick) TESTS=(kernels) ;;
  graphs) TESTS=(kernels families) ;;
  nomodel) TESTS=(nvrtc no_gpu kernels families nccl) ;;
  model) TESTS=(smollm2) ;;
  all) TESTS=(nvrtc no_gpu kernels families nccl smollm2) ;;
esac
for t in "${TESTS[@]}"; do
  exe=$B/bin/cuda-$t
  [ -x "$exe" ] || { ROWS+=("test $t|0|missing"); status=1; continue; }
  echo "== test $t" >&2
  if out=$("$exe" --test-threads 1 --nocapture 2>&1); then
    echo "$out" | grep -E "recorded|max \|logprob" >&2
    res=$(echo "$out" | grep -E "^test result" | tail -1)
    echo "$out" | grep -q SKIPPED && res="$res (SKIPPED inside)"
  else
    echo "$out" | tail -40
    res="FAILED"; status=1
  fi
  ROWS+=("test $t|0|$res")
done

I=$B/bin/infer
# Each bench row: name, the weight bytes one batch-1 decode step reads (for the roofline
# share; 0 when it does not apply), then the infer arguments; records the JSON line.
bench() {
  local name=$1 bytes=$2; shift 2
  local json
  echo "== $name" >&2
  if json=$("$I" "$@" --json 2>/tmp/bench-err | tail -1) && [ -n "$json" ]; then
    # A CUDA graph that could not be recorded or replayed says so (the step ran eagerly).
    grep -m2 "CUDA graph" /tmp/bench-err >&2
    echo "$name: $json" >&2
    ROWS+=("$name|$bytes|$json")
  else
    ROWS+=("$name|0|FAILED: $(tail -3 /tmp/bench-err | tr '\n' ' ')"); status=1
  fi
}
check() { # name, then a command that prints ok or why not
  local name=$1; shift
  local out; out=$("$@" 2>&1 | tail -1)
  [ "$out" = ok ] || status=1
  ROWS+=("$name|0|${out:-FAILED}")
}
SMOL=(--model "$MODEL" --backend "$BACKEND")
# Random weights need only a tokenizer (the bundle's SmolLM2 tokenizer and config).
TOK=$B/smollm2-hf
SMOL_DUMMY=(--model "$TOK" --load-format dummy --backend "$BACKEND")
DUMMY=(--model configs/llama-3-8b/config.json --load-format dummy --tokenizer "$TOK" --backend "$BACKEND")
greedy() {
  greedy_on "$BACKEND" "$@"
}
greedy_on() { # backend, then more infer arguments
  local backend=$1; shift
  "$I" generate --model "$MODEL" --backend "$backend" --chat --prompt "What is the capital of France?" --temperature 0 \
    --max-tokens 32 --json "$@" 2>/tmp/greedy-err | head -1 |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["token_ids"])' 2>/dev/null
}
same_as_plain() { # what the greedy tokens with these arguments must equal the plain ones
  local got; got=$(greedy "$@")
  if [ -n "$PLAIN" ] && [ "$PLAIN" = "$got" ]; then echo ok; else echo "FAILED: $got vs $PLAIN $(tail -2 /tmp/greedy-err | tr '\n' ' ')"; fi
}
structured() { # a JSON-schema-constrained sample must parse with exactly the schema's key
  "$I" generate "${SMOL[@]}" --chat --prompt "Name a city in France as JSON." --temperature 0 \
    --max-tokens 128 --json --structured-outputs \
    '{"json": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}' \
    2>/tmp/structured-err | head -1 | python3 -c '
import json, sys
text = json.load(sys.stdin)["text"]
v = json.loads(text)
print("ok" if set(v) == {"city"} and isinstance(v["city"], str) else f"FAILED: {text}")' 2>&1
}
# SmolLM2's GGUF: Q4_1 layers and a Q8_0 embedding (the tied lm_head), 96.6 MB, or 269 MB f16;
# random Q4_1 blocks everywhere: 84.1 MB.
SMOL_Q=96.6e6 SMOL_Q41=84.1e6 SMOL_F16=269e6
# Llama-3-8B without the embedding table (read once per token only as lm_head): 7.50e9 weights.
L8=7.50e9
bytes() { python3 -c "print($1 * $L8)"; }
if [ "$MODE" = quick ]; then
  bench "smollm2(dummy q4_1) batch-1 decode (packed)" $SMOL_Q41 bench latency "${SMOL_DUMMY[@]}" --dummy-dtype q4_1 --batch-size 1 --input-len 32 --output-len 256 --num-iters 3
  for q in q4_k q8_0; do
    b=$(case $q in q4_k) echo 144/256 ;; q8_0) echo 34/32 ;; esac)
    bench "llama-3-8b $q batch-1 decode" "$(bytes "$b")" bench latency "${DUMMY[@]}" --dummy-dtype $q --batch-size 1 --input-len 32 --output-len 128 --num-iters 3
  done
  bench "llama-3-8b f16 batch-1 decode" "$(bytes 2)" bench latency "${DUMMY[@]}" --batch-size 1 --input-len 32 --output-len 128 --num-iters 3
fi
if [ "$MODE" = graphs ]; then
  # Decode with CUDA graphs, beside --enforce-eager and, with GPU_CHECK_BASELINE=path/to/infer
  # (another build, e.g. the last bundle's), beside that build on the same machine.
  BASE=${GPU_CHECK_BASELINE:-}
  both() { # name, bytes, then the bench arguments
    local name=$1 bytes=$2; shift 2
    bench "$name" "$bytes" "$@"
    if [ -n "$BASE" ]; then I=$BASE bench "$name (baseline build)" "$bytes" "$@"; fi
  }
  both "smollm2(dummy q4_1) batch-1 decode" $SMOL_Q41 bench latency "${SMOL_DUMMY[@]}" --dummy-dtype q4_1 --batch-size 1 --input-len 32 --output-len 256 --num-iters 3
  bench "smollm2(dummy q4_1) batch-1 decode (--enforce-eager)" $SMOL_Q41 bench latency "${SMOL_DUMMY[@]}" --dummy-dtype q4_1 --batch-size 1 --input-len 32 --output-len 256 --num-iters 3 --enforce-eager
  both "smollm2(dummy q4_1) batch-8 decode" 0 bench latency "${SMOL_DUMMY[@]}" --dummy-dtype q4_1 --batch-size 8 --input-len 32 --output-len 128 --num-iters 3
  if [ "$BACKEND" != cpu ]; then
    for q in q4_k q6_k q8_0; do
      b=$(case $q in q4_k) echo 144/256 ;; q6_k) echo 210/256 ;; q8_0) echo 34/32 ;; esac)
      both "llama-3-8b $q batch-1 decode" "$(bytes "$b")" bench latency "${DUMMY[@]}" --dummy-dtype $q --batch-size 1 --input-len 32 --output-len 128 --num-iters 3
    done
    both "llama-3-8b q4_k batch-8 decode" 0 bench latency "${DUMMY[@]}" --dummy-dtype q4_k --batch-size 8 --input-len 32 --output-len 64 --num-iters 3
    bench "smollm2(dummy q4_1) throughput 256x(128+128)" 0 bench throughput "${SMOL_DUMMY[@]}" --dummy-dtype q4_1 --num-prompts 256 --input-len 128 --output-len 128 --ignore-eos
  fi
fi
if [ "$MODE" = nomodel ] || [ "$MODE" = all ]; then
  bench "smollm2(dummy q4_1) batch-1 decode (packed)" $SMOL_Q41 bench latency "${SMOL_DUMMY[@]}" --dummy-dtype q4_1 --batch-size 1 --input-len 32 --output-len 256 --num-iters 3
  bench "smollm2(dummy q4_1) batch-1 decode (f16)" $SMOL_F16 bench latency "${SMOL_DUMMY[@]}" --dummy-dtype q4_1 --cuda-weights f16 --batch-size 1 --input-len 32 --output-len 256 --num-iters 3
  # The engine's CPU side at 256 sequences (scheduler, block manager, sampler; no model).
  bench "engine overhead, 256 seqs, vocab 128256" 0 bench overhead --vocab 128256 --num-seqs 256 --steps 50
  # (A dry run on the CPU skips the 8B rows: f32 random weights alone take 32 GB there.)
  [ "$BACKEND" = cpu ] || {
  bench "llama-3-8b f16 batch-1 decode" "$(bytes 2)" bench latency "${DUMMY[@]}" --batch-size 1 --input-len 32 --output-len 128 --num-iters 3
  bench "llama-3-8b f16 throughput 128x(128+128)" 0 bench throughput "${DUMMY[@]}" --num-prompts 128 --input-len 128 --output-len 128 --ignore-eos
  bench "llama-3-8b q8_0 batch-1 decode" "$(bytes 34/32)" bench latency "${DUMMY[@]}" --dummy-dtype q8_0 --batch-size 1 --input-len 32 --output-len 128 --num-iters 3
  bench "llama-3-8b q4_k batch-1 decode" "$(bytes 144/256)" bench latency "${DUMMY[@]}" --dummy-dtype q4_k --batch-size 1 --input-len 32 --output-len 128 --num-iters 3
  bench "llama-3-8b q4_k throughput 128x(128+128)" 0 bench throughput "${DUMMY[@]}" --dummy-dtype q4_k --num-prompts 128 --input-len 128 --output-len 128 --ignore-eos
  }
fi
if [ "$MODE" = model ] || [ "$MODE" = all ]; then
  PLAIN=$(greedy)
  # Tensor parallelism's CUDA path at world size 1 (one GPU; two ranks need two): `mp` builds
  # the NCCL communicator and hands every step over, and must give the plain greedy tokens.
  check "smollm2 greedy, mp -tp 1 (NCCL) == plain" same_as_plain -tp 1 --distributed-executor-backend mp
  # Speculative decoding verifies several tokens a step; greedy output must not change.
  check "smollm2 greedy, ngram speculation == plain" same_as_plain \
    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
  check "smollm2 structured outputs (JSON schema)" structured
  # wgpu through NVIDIA's Vulkan driver (the loader travels in .gl, see the device notes).
  if [ -d .gl ] && [ "$BACKEND" = cuda ]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    [ -f "$icd" ] && export VK_DRIVER_FILES=$icd
    wgpu_vs_cpu() {
      local w c
      w=$(greedy_on wgpu --wgpu-weights f32); c=$(greedy_on cpu --cpu-weights f32)
      if [ -n "$w" ] && [ "$w" = "$c" ]; then echo ok; else echo "FAILED: $w vs $c $(tail -2 /tmp/greedy-err | tr '\n' ' ')"; fi
    }
    check "smollm2 greedy, wgpu == cpu (f32 weights)" wgpu_vs_cpu
    bench "smollm2 batch-1 decode (wgpu f16)" $SMOL_F16 bench latency --model "$MODEL" --backend wgpu --batch-size 1 --input-len 32 --output-len 256 --num-iters 3
  fi
  bench "smollm2 batch-1 decode (packed)" $SMOL_Q bench latency "${SMOL[@]}" --batch-size 1 --input-len 32 --output-len 256 --num-iters 3
  bench "smollm2 batch-1 decode (f16)" $SMOL_F16 bench latency "${SMOL[@]}" --cuda-weights f16 --batch-size 1 --input-len 32 --output-len 256 --num-iters 3
  bench "smollm2 throughput 256x(128+128)" 0 bench throughput "${SMOL[@]}" --num-prompts 256 --input-len 128 --output-len 128 --ignore-eos
fi

echo
echo "=== gpu-check summary ==="
for r in "${ROWS[@]}"; do
  name=${r%%|*}; rest=${r#*|}; bytes=${rest%%|*}; val=${rest#*|}
  case "$val" in
    \{*) val=$(echo "$val" | BYTES="$bytes" python3 -c '
import json, os, sys
v = json.load(sys.stdin)
keys = ["output_tokens_per_s", "requests_per_s", "decode_tok_s_per_request_p50", "ttft_p50_s", "latency_p50_s",
        "us_per_step_p50", "sampler_us_per_step_p50"]
line = "  ".join(f"{k}={v[k]:.4g}" for k in keys if k in v)
# Batch-1 decode reads every weight once per token: tok/s against HBM bandwidth / bytes.
gpu = os.environ.get("GPU_NAME", "")
bw = 4.8e12 if "H200" in gpu else 2.0e12 if "PCIe" in gpu else 3.35e12 if "H100" in gpu else None
weights = float(os.environ["BYTES"])
tps = v.get("decode_tok_s_per_request_p50")
if tps and bw and weights:
    line += f"  roofline={bw / weights:.0f} tok/s ({100 * tps * weights / bw:.1f}% of HBM {bw / 1e12:.2f} TB/s)"
print(line)') ;;
  esac
  printf "%-45s %s\n" "$name" "$val"
done
exit $status

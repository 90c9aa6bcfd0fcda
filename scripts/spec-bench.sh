#!/usr/bin/env bash
# Speculative decoding's figures (README): plain vs n-gram vs a draft model, single stream and
# batch 8, on a repetitive task and open chat; output tok/s of each run, 3 alternating rounds.
#   scripts/spec-bench.sh [DRAFT_GGUF] [extra infer flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
DRAFT=${1:-$M}
shift || true
BIN=target/release/infer
[ -x "$BIN" ] || cargo build --release -p infer-cli
NG='{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"disable_by_batch_size":1000}'
DR="{\"model\":\"$DRAFT\",\"num_speculative_tokens\":3,\"disable_by_batch_size\":1000}"
run() {
  "$BIN" generate --model "$M" --chat --temperature 0 --json \
    --prompts-file "fixtures/spec_decode/$1.jsonl" --max-num-seqs "$2" "${@:3}" 2>/dev/null |
    tail -1 | python3 -c 'import json,sys; s=json.load(sys.stdin)["summary"]; d=s["spec_decode"] or {}
print("%.1f output tok/s" % s["output_tokens_per_s"], "| decode p50 %.1f tok/s" % s["decode_tok_s_per_request_p50"], "| acceptance", d.get("acceptance_rate"), "length", d.get("mean_acceptance_length"))'
}
for round in 1 2 3; do
  for task in repetitive chat; do
    for b in 1 8; do
      echo "round $round $task batch $b plain: $(run $task $b "$@")"
      echo "round $round $task batch $b ngram: $(run $task $b --speculative-config "$NG" "$@")"
      echo "round $round $task batch $b draft: $(run $task $b --speculative-config "$DR" "$@")"
    done
  done
done

#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) on the same shapes as `infer bench latency --batch-size 1`: a synthetic prompt
of --prompt-len ids, then --gen-len single-token decode steps; medians over --runs.
    pip install llama-cpp-python   # builds llama.cpp from source (~8 min)
    python3 scripts/bench_llama_cpp.py models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2
"""
import argparse
import statistics
import time

from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    n_ctx = a.prompt_len + a.gen_len + 8
    # n_batch = n_ctx: the whole prompt in one batch, and room for every position's logits.
    llm = Llama(model_path=a.model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=a.threads,
                n_threads_batch=a.threads, verbose=False)
    vocab = llm.n_vocab()
    prompt = [(1000 + i * 7919) % vocab for i in range(a.prompt_len)]  # same ids as infer's bench
    prefill, decode = [], []
    for run in range(a.runs + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        for _ in range(a.gen_len - 1):
            llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
        t2 = time.perf_counter()
        if run > 0:
            prefill.append(a.prompt_len / (t1 - t0))
            decode.append((a.gen_len - 1) / (t2 - t1))
    print(f"llama.cpp ({a.threads} threads) | prompt {a.prompt_len} tokens, {a.gen_len} generated, {a.runs} runs")
    print(f"prefill: {statistics.median(prefill):.1f} tok/s (median) | decode: {statistics.median(decode):.1f} tok/s (median)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""infer next to llama.cpp on the same GGUF files, threads and shapes, runs interleaved, medians and ratios.

Builds llama.cpp (llama-bench, llama-batched-bench, llama-quantize) from the llama-cpp-python sdist once into
target/llama.cpp (needs cmake and a C++ compiler; ~10-25 min on 2 cores), makes Q4_K_M and Q8_0 files from the
Q4_1 model with llama-quantize, then per model, infer kernel level and round runs
  single stream  `infer bench latency --batch-size 1 --input-len P --output-len G`
                 vs `llama-bench -p P -n 0` (prefill) and `llama-bench -p 0 -n G -d P` (decode after P tokens)
  32 at once     `infer bench throughput --num-prompts B --input-len P --output-len G`
                 vs `llama-batched-bench -npp P -ntg G -npl B` (total time; SmolLM2 only)
and prints a markdown table. Build infer first: cargo build --release -p infer-cli.

`--isa auto,avx2` runs infer at each kernel level (INFER_CPU_ISA), each beside a llama.cpp build of the same class:
its native build (GGML_NATIVE) beside `auto` and the AVX-512 levels, and an AVX2-only build (AVX2/FMA/F16C, built
into target/llama.cpp/build-avx2) beside `avx2`, so the AVX2 rows compare what an AVX2-only CPU runs of each.
`--sizes smollm2,1b,3b` adds Llama-shaped models of the configs/llama-3.2-1b and -3b shapes (with SmolLM2's
vocabulary) written as F16 GGUF with random weights (numpy and pyyaml, which these need, and llama.cpp's gguf-py) and
quantized by llama-quantize: speed does not depend on the values. Their rows also give the bytes read per token
(the file: the tied embedding is the output head) and the share of the memory bandwidth two threads measure.

    python3 scripts/bench_vs_llama_cpp.py --threads 2 --rounds 3 --isa auto,avx2 --sizes smollm2,1b
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST = "llama-cpp-python==0.3.36"
TOOLS = ["llama-bench", "llama-batched-bench", "llama-quantize"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("  $ " + " ".join(cmd))
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout + out.stderr


# CMake flags of llama.cpp's builds: `native` (GGML_NATIVE: every extension of this CPU) and
# `avx2` (AVX2/FMA/F16C only, what an AVX2-only CPU runs), compared with infer's levels below.
LLAMA_BUILDS = {
    "native": ["-DGGML_NATIVE=ON"],
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF"],
}


def llama_build_of(isa):
    """The llama.cpp build an infer kernel level is compared with: AVX2 with AVX2, else native."""
    return "avx2" if isa == "avx2" else "native"


def build_llama_cpp(work, build="native"):
    build_dir = os.path.join(work, "build" if build == "native" else f"build-{build}")
    bin_dir = os.path.join(build_dir, "bin")
    tools = TOOLS if build == "native" else [t for t in TOOLS if t != "llama-quantize"]
    if all(os.path.exists(os.path.join(bin_dir, t)) for t in tools):
        return bin_dir
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "src")
    if not os.path.isdir(src):
        log(f"llama.cpp: downloading the {SDIST} sdist")
        with tempfile.TemporaryDirectory() as tmp:
            # Only this package as source: `:all:` would build its build tools (cmake) from source too.
            run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                 "llama-cpp-python", SDIST, "-d", tmp])
            with tarfile.open(glob.glob(os.path.join(tmp, "llama_cpp_python-*.tar.gz"))[0]) as tar:
                tar.extractall(tmp, filter="data")
            shutil.move(glob.glob(os.path.join(tmp, "llama_cpp_python-*", "vendor", "llama.cpp"))[0], src)
    log(f"llama.cpp: building ({build}: {' '.join(LLAMA_BUILDS[build])})")
    run(["cmake", "-S", src, "-B", build_dir, *LLAMA_BUILDS[build], "-DLLAMA_CURL=OFF",
         "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_RUNTIME_OUTPUT_DIRECTORY=" + bin_dir])
    run(["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 2), "--target", *tools])
    return bin_dir


def quantized(bin_dir, work, source, kind):
    out = os.path.join(work, f"{os.path.basename(source).split('.')[0]}.{kind}.gguf")
    if not os.path.exists(out):
        log(f"llama-quantize: {kind}")
        run([os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", source, out, kind])
    return out


def random_llama(work, source, config, name):
    """An F16 GGUF of `config`'s Llama shape with random weights and `source`'s tokenizer (its vocabulary)."""
    out = os.path.join(work, f"{name}.F16.gguf")
    if os.path.exists(out):
        return out
    sys.path.insert(0, os.path.join(work, "src", "gguf-py"))
    import gguf
    import numpy as np
    c = json.load(open(config))
    h, ff, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", h // heads)
    tokenizer = {k: f for k, f in gguf.GGUFReader(source).fields.items() if k.startswith("tokenizer.")}
    vocab = len(tokenizer["tokenizer.ggml.tokens"].data)
    log(f"{name}: writing random F16 weights ({layers} layers, hidden {h}, vocabulary {vocab})")
    w = gguf.GGUFWriter(out, "llama")
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(h)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, f in tokenizer.items():
        array = f.types[0] == gguf.GGUFValueType.ARRAY
        w.add_key_value(key, f.contents(), f.types[0], f.types[-1] if array else None)
    rng = np.random.default_rng(0)

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(h, dtype=np.float32)).astype(np.float32)

    w.add_tensor("token_embd.weight", matrix(vocab, h))
    for i in range(layers):
        for part, t in [("attn_norm", norm()), ("attn_q", matrix(heads * hd, h)), ("attn_k", matrix(kv * hd, h)),
                        ("attn_v", matrix(kv * hd, h)), ("attn_output", matrix(h, heads * hd)),
                        ("ffn_norm", norm()), ("ffn_gate", matrix(ff, h)), ("ffn_up", matrix(ff, h)),
                        ("ffn_down", matrix(h, ff))]:
            w.add_tensor(f"blk.{i}.{part}.weight", t)
    w.add_tensor("output_norm.weight", norm())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


BANDWIDTH_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
int main(void) {
    size_t n = (size_t)1 << 28;  /* 1 GiB of floats: far past any cache */
    float *a = malloc(n * sizeof(float));
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) a[i] = 1.0f;
    double best = 1e9, sink = 0;
    for (int r = 0; r < 5; r++) {
        /* A float sum vectorizes (-ffast-math); a double one spends the time converting. */
        double t0 = omp_get_wtime();
        float s = 0;
        #pragma omp parallel for simd reduction(+:s)
        for (size_t i = 0; i < n; i++) s += a[i];
        double t = omp_get_wtime() - t0;
        if (t < best) best = t;
        sink += s;
    }
    printf("%f %f\n", n * sizeof(float) / best / 1e9, sink);
    return 0;
}
"""


def memory_bandwidth(work, threads):
    """GB/s that `threads` threads read from memory (the best of 5 sums over 1 GiB)."""
    exe = os.path.join(work, "bandwidth")
    if not os.path.exists(exe):
        src = os.path.join(work, "bandwidth.c")
        with open(src, "w") as f:
            f.write(BANDWIDTH_C)
        run(["cc", "-O3", "-march=native", "-ffast-math", "-fopenmp", src, "-o", exe])
    return float(run([exe], env=dict(os.environ, OMP_NUM_THREADS=str(threads))).split()[0])


def with_isa(isa):
    return dict(os.environ, INFER_CPU_ISA=isa)


def infer_latency(infer, model, a, isa):
    out = run([infer, "bench", "latency", "--model", model, "--batch-size", "1", "--input-len", str(a.prompt),
               "--output-len", str(a.gen), "--num-iters", "3", "--num-iters-warmup", "1", "--threads", str(a.threads),
               "--max-model-len", "1024"], env=with_isa(isa))
    m = re.search(r"decode per request p50: ([\d.]+) tok/s \| prompt ([\d.]+) tok/s", out)
    return float(m.group(2)), float(m.group(1))


def llama_bench(bin_dir, model, a, prompt, gen, depth):
    out = run([os.path.join(bin_dir, "llama-bench"), "-m", model, "-t", str(a.threads), "-p", str(prompt),
               "-n", str(gen), "-d", str(depth), "-r", "3", "-o", "json"])
    return json.loads(out[out.index("["):out.rindex("]") + 1])[0]["avg_ts"]


def infer_batch(infer, model, a, isa):
    out = run([infer, "bench", "throughput", "--model", model, "--num-prompts", str(a.batch), "--input-len",
               str(a.prompt), "--output-len", str(a.gen), "--threads", str(a.threads)], env=with_isa(isa))
    return float(re.search(r"\(([\d.]+) s, \d+ preemptions\)", out).group(1))


def llama_batch(bin_dir, model, a):
    ctx = a.batch * (a.prompt + a.gen)
    out = run([os.path.join(bin_dir, "llama-batched-bench"), "-m", model, "-t", str(a.threads), "-tb",
               str(a.threads), "-c", str(ctx), "-npp", str(a.prompt), "-ntg", str(a.gen), "-npl", str(a.batch)])
    row = [line for line in out.splitlines() if re.match(rf"\|\s+{a.prompt}\s+\|\s+{a.gen}\s+\|", line)][-1]
    return float(row.strip("|").split("|")[8])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--kinds", default="Q4_1,Q4_K_M,Q8_0", help="the model as is (its own type) and requantized")
    ap.add_argument("--sizes", default="smollm2", help="smollm2 (--model), 1b, 3b (random Llama-shaped weights)")
    ap.add_argument("--isa", default="auto", help="infer's kernel levels (INFER_CPU_ISA), comma-separated")
    ap.add_argument("--infer", default=os.path.join(ROOT, "target", "release", "infer"))
    ap.add_argument("--llama-cpp", default=os.path.join(ROOT, "target", "llama.cpp"), help="build folder")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--skip-batch", action="store_true", help="single stream only")
    a = ap.parse_args()
    if not os.path.exists(a.infer):
        sys.exit(f"{a.infer} is missing: cargo build --release -p infer-cli")
    bin_dir = build_llama_cpp(a.llama_cpp)
    configs = {"1b": "llama-3.2-1b", "3b": "llama-3.2-3b"}
    models = {}
    for size in a.sizes.split(","):
        if size == "smollm2":
            source, own = a.model, os.path.basename(a.model).split(".")[-2]
        elif size in configs:
            config = os.path.join(ROOT, "configs", configs[size], "config.json")
            source, own = random_llama(a.llama_cpp, a.model, config, f"llama-{size}"), "F16"
        else:
            sys.exit(f"--sizes: unknown size {size} (smollm2, 1b, 3b)")
        for k in a.kinds.split(","):
            models[(size, k)] = source if k == own else quantized(bin_dir, a.llama_cpp, source, k)
    levels = a.isa.split(",")
    llama_bins = {llama_build_of(isa): None for isa in levels}
    for build in llama_bins:
        llama_bins[build] = build_llama_cpp(a.llama_cpp, build)
    bandwidth = memory_bandwidth(a.llama_cpp, a.threads) if a.sizes != "smollm2" else None
    results = {}
    for r in range(a.rounds):
        for (size, kind), model in models.items():
            log(f"round {r + 1}/{a.rounds}: {size} {kind}")
            batch = not a.skip_batch and size == "smollm2"
            for build, llama_bin in llama_bins.items():
                llama = results.setdefault((size, kind, "llama.cpp " + build), {})
                llama.setdefault("prefill", []).append(llama_bench(llama_bin, model, a, a.prompt, 0, 0))
                llama.setdefault("decode", []).append(llama_bench(llama_bin, model, a, 0, a.gen, a.prompt))
                if batch:
                    llama.setdefault("batch", []).append(llama_batch(llama_bin, model, a))
            for isa in levels:
                res = results.setdefault((size, kind, isa), {})
                pp, tg = infer_latency(a.infer, model, a, isa)
                res.setdefault("prefill", []).append(pp)
                res.setdefault("decode", []).append(tg)
                if batch:
                    res.setdefault("batch", []).append(infer_batch(a.infer, model, a, isa))
    med = {key: {n: statistics.median(v) for n, v in res.items()} for key, res in results.items()}
    print(f"\n{a.threads} threads, medians of {a.rounds} interleaved rounds; prompt {a.prompt}, {a.gen} generated; "
          f"batch: {a.batch} requests at once (SmolLM2 only)" +
          (f"; memory read bandwidth {bandwidth:.1f} GB/s" if bandwidth else "") + "\n")
    head = ("| model | infer level / llama.cpp build | prefill tok/s infer / llama.cpp | ratio | decode tok/s infer / llama.cpp | ratio "
            f"| {a.batch} × ({a.prompt}+{a.gen}) s infer / llama.cpp | ratio | decode GB/s infer / llama.cpp "
            "| of bandwidth |")
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for (size, kind), model in models.items():
        gb = os.path.getsize(model) / 1e9
        for isa in levels:
            ll = med[(size, kind, "llama.cpp " + llama_build_of(isa))]
            m = med[(size, kind, isa)]
            line = (f"| {size} {kind} | {isa} / {llama_build_of(isa)} | {m['prefill']:.0f} / {ll['prefill']:.0f} | "
                    f"{m['prefill'] / ll['prefill']:.2f}× | {m['decode']:.1f} / {ll['decode']:.1f} | "
                    f"{m['decode'] / ll['decode']:.2f}× |")
            if "batch" in m:
                line += f" {m['batch']:.1f} / {ll['batch']:.1f} | {m['batch'] / ll['batch']:.2f}× |"
            else:
                line += " | |"
            if size != "smollm2" and bandwidth:
                line += (f" {m['decode'] * gb:.1f} / {ll['decode'] * gb:.1f} | "
                         f"{m['decode'] * gb / bandwidth:.0%} / {ll['decode'] * gb / bandwidth:.0%} |")
            else:
                line += " | |"
            print(line)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""infer next to llama.cpp on the same GGUF files, threads and shapes, runs interleaved, medians and ratios.

Builds llama.cpp (llama-bench, llama-batched-bench, llama-quantize) from the llama-cpp-python sdist once into
target/llama.cpp (needs cmake and a C++ compiler; ~10-25 min on 2 cores), makes Q4_K_M and Q8_0 files from the
Q4_1 model with llama-quantize, then per model and round runs
  single stream  `infer bench latency --batch-size 1 --input-len P --output-len G`
                 vs `llama-bench -p P -n 0` (prefill) and `llama-bench -p 0 -n G -d P` (decode after P tokens)
  32 at once     `infer bench throughput --num-prompts B --input-len P --output-len G`
                 vs `llama-batched-bench -npp P -ntg G -npl B` (total time)
and prints a markdown table. Build infer first: cargo build --release -p infer-cli.

    python3 scripts/bench_vs_llama_cpp.py --threads 2 --rounds 3
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


def build_llama_cpp(work):
    bin_dir = os.path.join(work, "build", "bin")
    if all(os.path.exists(os.path.join(bin_dir, t)) for t in TOOLS):
        return bin_dir
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "src")
    if not os.path.isdir(src):
        log(f"llama.cpp: downloading the {SDIST} sdist")
        with tempfile.TemporaryDirectory() as tmp:
            run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                 "--no-build-isolation", SDIST, "-d", tmp])
            with tarfile.open(glob.glob(os.path.join(tmp, "llama_cpp_python-*.tar.gz"))[0]) as tar:
                tar.extractall(tmp, filter="data")
            shutil.move(glob.glob(os.path.join(tmp, "llama_cpp_python-*", "vendor", "llama.cpp"))[0], src)
    log("llama.cpp: building (the same flags as a user's native build)")
    run(["cmake", "-S", src, "-B", os.path.join(work, "build"), "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
         "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_RUNTIME_OUTPUT_DIRECTORY=" + bin_dir])
    run(["cmake", "--build", os.path.join(work, "build"), "-j", str(os.cpu_count() or 2), "--target", *TOOLS])
    return bin_dir


def quantized(bin_dir, work, source, kind):
    out = os.path.join(work, f"{os.path.basename(source).split('.')[0]}.{kind}.gguf")
    if not os.path.exists(out):
        log(f"llama-quantize: {kind}")
        run([os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", source, out, kind])
    return out


def infer_latency(infer, model, a):
    out = run([infer, "bench", "latency", "--model", model, "--batch-size", "1", "--input-len", str(a.prompt),
               "--output-len", str(a.gen), "--num-iters", "3", "--num-iters-warmup", "1", "--threads", str(a.threads)])
    m = re.search(r"decode per request p50: ([\d.]+) tok/s \| prompt ([\d.]+) tok/s", out)
    return float(m.group(2)), float(m.group(1))


def llama_bench(bin_dir, model, a, prompt, gen, depth):
    out = run([os.path.join(bin_dir, "llama-bench"), "-m", model, "-t", str(a.threads), "-p", str(prompt),
               "-n", str(gen), "-d", str(depth), "-r", "3", "-o", "json"])
    return json.loads(out[out.index("["):out.rindex("]") + 1])[0]["avg_ts"]


def infer_batch(infer, model, a):
    out = run([infer, "bench", "throughput", "--model", model, "--num-prompts", str(a.batch), "--input-len",
               str(a.prompt), "--output-len", str(a.gen), "--threads", str(a.threads)])
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
    own = os.path.basename(a.model).split(".")[-2]
    models = {k: a.model if k == own else quantized(bin_dir, a.llama_cpp, a.model, k) for k in a.kinds.split(",")}
    results = {k: {} for k in models}
    for r in range(a.rounds):
        for kind, model in models.items():
            log(f"round {r + 1}/{a.rounds}: {kind}")
            res = results[kind]
            pp, tg = infer_latency(a.infer, model, a)
            res.setdefault("infer prefill", []).append(pp)
            res.setdefault("infer decode", []).append(tg)
            res.setdefault("llama prefill", []).append(llama_bench(bin_dir, model, a, a.prompt, 0, 0))
            res.setdefault("llama decode", []).append(llama_bench(bin_dir, model, a, 0, a.gen, a.prompt))
            if not a.skip_batch:
                res.setdefault("infer batch", []).append(infer_batch(a.infer, model, a))
                res.setdefault("llama batch", []).append(llama_batch(bin_dir, model, a))
    med = {k: {n: statistics.median(v) for n, v in res.items()} for k, res in results.items()}
    print(f"\n{a.threads} threads, medians of {a.rounds} interleaved rounds; prompt {a.prompt}, "
          f"{a.gen} generated; batch: {a.batch} requests at once\n")
    head = "| model | prefill tok/s infer / llama.cpp | ratio | decode tok/s infer / llama.cpp | ratio |"
    if not a.skip_batch:
        head += f" {a.batch} × ({a.prompt}+{a.gen}) s infer / llama.cpp | ratio |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for kind, m in med.items():
        line = (f"| {kind} | {m['infer prefill']:.0f} / {m['llama prefill']:.0f} | "
                f"{m['infer prefill'] / m['llama prefill']:.2f}× | {m['infer decode']:.1f} / {m['llama decode']:.1f} | "
                f"{m['infer decode'] / m['llama decode']:.2f}× |")
        if not a.skip_batch:
            line += f" {m['infer batch']:.1f} / {m['llama batch']:.1f} | {m['infer batch'] / m['llama batch']:.2f}× |"
        print(line)


if __name__ == "__main__":
    main()

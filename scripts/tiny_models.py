#!/usr/bin/env python3
"""Tiny random models that cover what SmolLM2 does not: Qwen2 (q/k/v bias, rotate-half RoPE in
GGUF), Llama 3.1 RoPE scaling (`rope_freqs`), an untied lm_head, other GQA ratios, and the
F16 / BF16 / Q8_0 / Q4_0 / Q4_1 tensor types, quantized by the `gguf` package. Each model is
written as GGUF the way llama.cpp's converter would (Q/K rows permuted for `llama`), read back
and run by reference.py's float64 forward.

Writes fixtures/tiny/<name>.gguf and fixtures/tiny/reference.json.
Re-run:  python3 scripts/tiny_models.py
"""
import json
import math
import pathlib
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from reference import Model  # noqa: E402

GREEDY_STEPS = 8
PROMPT = [40, 101, 108, 108, 111, 33, 300, 72, 32, 119, 111, 114, 108, 100, 7, 55, 200]

VARIANTS = [
    # name, arch, d, ff, layers, heads, kv_heads, linear type, embed type, tied, llama3 scaling
    ("llama_q4_0_gqa4", "llama", 64, 96, 2, 8, 2, T.Q4_0, T.Q8_0, True, False),
    ("llama3_q4_1_bf16_untied", "llama", 64, 128, 2, 4, 4, T.Q4_1, T.BF16, False, True),
    ("qwen2_q8_0_bias", "qwen2", 64, 96, 3, 4, 2, T.Q8_0, T.F16, True, False),
    # K-quants need rows of 256: random blocks (small f16 scales) stand in for quantized weights.
    ("llama_q4_k_q6_k", "llama", 256, 512, 1, 4, 2, T.Q4_K, T.Q6_K, True, False),
]

# byte offsets of the f16 scales inside each K-quant block, and their magnitude
K_SCALES = {T.Q4_K: ([0, 2], 1e-3), T.Q6_K: ([208], 2e-4)}

RNG = np.random.default_rng(20261121)
LLAMA3 = dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)


def byte_vocab():
    """GPT-2 byte-to-unicode symbols plus two specials, then filler tokens up to 320."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    tokens = ["<s>", "</s>"] + [chr(table[b]) for b in range(256)] + ["he", "ll"]
    tokens += [f"<extra_{i}>" for i in range(320 - len(tokens))]
    types = [3, 3] + [1] * 258 + [4] * (320 - 260)
    return tokens, types, ["h e", "l l"]


def permute(w, n_head):
    """llama.cpp convert's permute: HF rotate-half rows to adjacent-pair rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(head_dim, theta):
    """As convert_hf_to_gguf.py computes `rope_freqs` for Llama 3.1."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    f, lo, hi, old = (LLAMA3[k] for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(f)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / f + smooth))
    return np.array(out, dtype=np.float32)


def random_k_blocks(shape, qtype, rng):
    per_block, nbytes = GGML_QUANT_SIZES[qtype]
    n = shape[0] * shape[1] // per_block
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    fields, mag = K_SCALES[qtype]
    for at in fields:
        raw[:, at:at + 2] = rng.uniform(-mag, mag, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(shape[0], shape[1] // per_block * nbytes)


def add(writer, name, arr, qtype):
    arr = arr.astype(np.float32)
    if qtype in K_SCALES:
        writer.add_tensor(name, random_k_blocks(arr.shape, qtype, RNG), raw_dtype=qtype)
    elif qtype == T.F32:
        writer.add_tensor(name, arr)
    elif qtype == T.F16:
        writer.add_tensor(name, arr.astype(np.float16))
    else:
        writer.add_tensor(name, quantize(arr, qtype), raw_dtype=qtype)


def write_model(path, name, arch, d, ff, layers, heads, kv_heads, lin, emb, tied, llama3, rng):
    hd = d // heads
    tokens, types, merges = byte_vocab()
    vocab = len(tokens)
    w = GGUFWriter(str(path), arch)
    w.add_context_length(128)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    r = lambda *shape, s=0.25: rng.uniform(-s, s, size=shape)
    norm = lambda: 1.0 + r(d, s=0.2)
    add(w, "token_embd.weight", r(vocab, d, s=1.0), emb)
    if not tied:
        add(w, "output.weight", r(vocab, d, s=0.5), emb)
    add(w, "output_norm.weight", norm(), T.F32)
    if llama3:
        add(w, "rope_freqs.weight", llama3_rope_factors(hd, 10000.0), T.F32)
    fix = permute if arch == "llama" else (lambda x, n: x)
    for i in range(layers):
        b = f"blk.{i}."
        add(w, b + "attn_norm.weight", norm(), T.F32)
        add(w, b + "ffn_norm.weight", norm(), T.F32)
        add(w, b + "attn_q.weight", fix(r(heads * hd, d), heads), lin)
        add(w, b + "attn_k.weight", fix(r(kv_heads * hd, d), kv_heads), lin)
        add(w, b + "attn_v.weight", r(kv_heads * hd, d), lin)
        if arch == "qwen2":
            add(w, b + "attn_q.bias", r(heads * hd, s=0.5), T.F32)
            add(w, b + "attn_k.bias", r(kv_heads * hd, s=0.5), T.F32)
            add(w, b + "attn_v.bias", r(kv_heads * hd, s=0.5), T.F32)
        add(w, b + "attn_output.weight", r(d, heads * hd), lin)
        add(w, b + "ffn_gate.weight", r(ff, d), lin)
        add(w, b + "ffn_up.weight", r(ff, d), lin)
        add(w, b + "ffn_down.weight", r(d, ff), lin)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = pathlib.Path(__file__).parent.parent / "fixtures" / "tiny"
    out.mkdir(parents=True, exist_ok=True)
    rng = RNG
    cases = []
    for name, *spec in VARIANTS:
        path = out / f"{name}.gguf"
        write_model(path, name, *spec, rng)
        model = Model(GGUFReader(str(path)))
        cache = [None] * model.n_layer
        logits = model.forward(np.array(PROMPT), cache)
        greedy, margins, step = [], [], logits
        for _ in range(GREEDY_STEPS):
            top2 = np.argsort(step)[-2:]
            greedy.append(int(top2[1]))
            margins.append(float(step[top2[1]] - step[top2[0]]))
            step = model.forward(np.array([greedy[-1]]), cache)
        cases.append(dict(name=name, file=f"{name}.gguf", prompt_ids=PROMPT, last_logits=[float(x) for x in logits],
                          greedy_ids=greedy, greedy_margins=margins, llama3_rope_scaling=LLAMA3 if spec[-1] else None))
        print(f"{name}: {path.stat().st_size} bytes, greedy {greedy}, min margin {min(margins):.4f}")
    (out / "reference.json").write_text(json.dumps(dict(format_version=1, generator="scripts/tiny_models.py", cases=cases)) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Float64 reference for infer's CPU backend, independent of the Rust code.

Reads the GGUF with the `gguf` package, dequantizes with `gguf.quants`, undoes llama.cpp's Q/K
row permutation and runs the Llama forward in numpy float64 with HF-style "rotate half" RoPE
(the Rust side keeps GGUF rows and rotates adjacent pairs, so RoPE is checked both ways).
The tokenizer is the HF `tokenizer.json` structure of SmolLM2, built with the Python
`tokenizers` package; `--check-llama-cpp` also compares prompt ids with llama.cpp's tokenizer.

Writes fixtures/reference.json and fixtures/logits/<case>.f32 (last prompt position, f32 LE).
Re-run after changing the cases:  python3 scripts/reference.py models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import hashlib
import json
import pathlib

import jinja2
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

FORMAT_VERSION = 1
GREEDY_STEPS = 16

CASES = [
    ("raw", False, "The quick brown fox jumps over the lazy dog. In the morning, the fox"),
    ("chat", True, "What is the capital of France?"),
    ("code", False, 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("digits", False, "Compute 12345 + 67890 = 80235. Then 3.14159 * 2 ="),
    ("non_ascii", False, "Ça va? Привет, мир! 日本語のテキスト 🎉 naïve café — ñ"),
]

# Prompt-id-only cases: whitespace runs, contractions, specials inline, emoji, mixed scripts.
TOKENIZER_CASES = [
    "Hello world",
    " leading space and  double  spaces\n\nnew lines\ttabs",
    "I'm sure you'll see they've done it, don't you?",
    "Numbers: 0 7 42 1000000 3.14 -12e5 2024-11-21",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "Emoji 🎉🚀👩‍💻 and CJK 你好，世界 and Korean 안녕하세요",
    "Ελληνικά, العربية, עברית, हिन्दी",
    "fn main() { println!(\"{}\", x.iter().map(|v| v * 2).sum::<u32>()); }",
    "a",
    "   ",
]


def field(reader, key):
    return reader.fields[key].contents()


def hf_tokenizer(reader):
    """SmolLM2's tokenizer.json: byte-level BPE, digits split one by one, 17 special tokens."""
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    types = field(reader, "tokenizer.ggml.token_type")
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tok


def unpermute(w, n_head):
    """Inverse of llama.cpp convert's permute: adjacent-pair rows back to HF rotate-half rows."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Model:
    def __init__(self, reader):
        arch = field(reader, "general.architecture")
        g = lambda k: field(reader, f"{arch}.{k}")
        self.n_layer = int(g("block_count"))
        self.n_head = int(g("attention.head_count"))
        self.n_kv = int(g("attention.head_count_kv"))
        self.d = int(g("embedding_length"))
        self.hd = int(reader.fields[f"{arch}.attention.key_length"].contents()) if f"{arch}.attention.key_length" in reader.fields else self.d // self.n_head
        self.eps = float(g("attention.layer_norm_rms_epsilon"))
        theta = float(g("rope.freq_base"))
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        t = {}
        for tensor in reader.tensors:
            arr = dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
            t[tensor.name] = arr.reshape([int(x) for x in reversed(tensor.shape)])
        if "rope_freqs.weight" in t:  # Llama 3.1 scaling as GGUF stores it: per-pair divisors
            self.inv_freq = self.inv_freq / t["rope_freqs.weight"]
        # llama.cpp permutes Q/K rows of `llama` models only; qwen2 keeps HF's layout.
        fix = (lambda w, n: unpermute(w, n)) if arch == "llama" else (lambda w, n: w)
        zero = lambda n: np.zeros(n)
        self.embed = t["token_embd.weight"]
        self.lm_head = t.get("output.weight", self.embed)
        self.norm = t["output_norm.weight"]
        self.layers = []
        for i in range(self.n_layer):
            p = lambda n: t[f"blk.{i}.{n}.weight"]
            b = lambda n, size: t.get(f"blk.{i}.{n}.bias", zero(size))
            q_rows, kv_rows = self.n_head * self.hd, self.n_kv * self.hd
            self.layers.append(dict(
                attn_norm=p("attn_norm"), q=fix(p("attn_q"), self.n_head), k=fix(p("attn_k"), self.n_kv),
                v=p("attn_v"), o=p("attn_output"), ffn_norm=p("ffn_norm"), gate=p("ffn_gate"), up=p("ffn_up"),
                down=p("ffn_down"), bq=b("attn_q", q_rows), bk=b("attn_k", kv_rows), bv=b("attn_v", kv_rows),
            ))

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # x: [T, H, hd], rotate half
        ang = pos[:, None] * self.inv_freq[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
        half = self.hd // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def forward(self, ids, cache):
        """ids: new tokens; cache: list of (K, V) per layer, [T, n_kv, hd], extended in place."""
        start = cache[0][0].shape[0] if cache[0] is not None else 0
        pos = np.arange(start, start + len(ids), dtype=np.float64)
        x = self.embed[ids]
        T = len(ids)
        for i, L in enumerate(self.layers):
            h = self.rms(x, L["attn_norm"])
            q = self.rope((h @ L["q"].T + L["bq"]).reshape(T, self.n_head, self.hd), pos)
            k = self.rope((h @ L["k"].T + L["bk"]).reshape(T, self.n_kv, self.hd), pos)
            v = (h @ L["v"].T + L["bv"]).reshape(T, self.n_kv, self.hd)
            if cache[i] is not None:
                k = np.concatenate([cache[i][0], k])
                v = np.concatenate([cache[i][1], v])
            cache[i] = (k, v)
            S = k.shape[0]
            group = self.n_head // self.n_kv
            kk = np.repeat(k, group, axis=1)  # [S, H, hd]
            vv = np.repeat(v, group, axis=1)
            scores = np.einsum("thd,shd->hts", q, kk) / np.sqrt(self.hd)
            mask = (start + np.arange(T))[:, None] < np.arange(S)[None, :]
            scores = np.where(mask[None], -np.inf, scores)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            a = np.einsum("hts,shd->thd", scores, vv).reshape(T, self.d)
            x = x + a @ L["o"].T
            h = self.rms(x, L["ffn_norm"])
            g = h @ L["gate"].T
            x = x + ((g / (1 + np.exp(-g))) * (h @ L["up"].T)) @ L["down"].T
        return self.rms(x[-1], self.norm) @ self.lm_head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out", default="fixtures")
    ap.add_argument("--check-llama-cpp", action="store_true")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    (out / "logits").mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(args.model)
    tok = hf_tokenizer(reader)
    template = jinja2.Environment().from_string(field(reader, "tokenizer.chat_template"))
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    model = Model(reader)

    llama = None
    if args.check_llama_cpp:
        from llama_cpp import Llama
        llama = Llama(model_path=args.model, vocab_only=True, verbose=False)

    def encode(text):
        ids = tok.encode(text, add_special_tokens=False).ids
        if llama is not None:
            theirs = llama.tokenize(text.encode(), add_bos=False, special=True)
            assert ids == theirs, f"HF-structure tokenizer and llama.cpp disagree on {text!r}:\n{ids}\n{theirs}"
        return ids

    cases = []
    for name, chat, text in CASES:
        prompt = template.render(messages=[{"role": "user", "content": text}], add_generation_prompt=True) if chat else text
        ids = encode(prompt)
        cache = [None] * model.n_layer
        logits = model.forward(np.array(ids), cache)
        logits.astype("<f4").tofile(out / "logits" / f"{name}.f32")
        greedy, margins, step_logits = [], [], logits
        for _ in range(GREEDY_STEPS):
            top2 = np.argsort(step_logits)[-2:]
            greedy.append(int(top2[1]))
            margins.append(float(step_logits[top2[1]] - step_logits[top2[0]]))
            if greedy[-1] == eos:
                break
            step_logits = model.forward(np.array([greedy[-1]]), cache)
        cases.append(dict(
            name=name, chat=chat, user_text=text, prompt=prompt, prompt_ids=ids,
            greedy_ids=greedy, greedy_margins=margins, greedy_text=tok.decode(greedy),
            logits_file=f"logits/{name}.f32",
        ))
        print(f"{name}: {len(ids)} prompt tokens -> {tok.decode(greedy)!r} (min margin {min(margins):.4f})")

    tokenizer_cases = [dict(text=t, ids=encode(t)) for t in TOKENIZER_CASES]
    sha = hashlib.sha256(pathlib.Path(args.model).read_bytes()).hexdigest()
    doc = dict(
        format_version=FORMAT_VERSION, generator="scripts/reference.py", model_sha256=sha,
        checked_against_llama_cpp=llama is not None, cases=cases, tokenizer_cases=tokenizer_cases,
    )
    (out / "reference.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

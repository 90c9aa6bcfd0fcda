#!/usr/bin/env python3
"""Tiny random checkpoints of every family infer runs (dense and mixtures of experts), built by `transformers` and
converted to GGUF by llama.cpp's own `convert_hf_to_gguf.py`, with transformers' greedy tokens
and log-probabilities as the reference (float64 forward, eager attention).

Each model is seeded; norm weights and biases are drawn away from 1 / 0 so they are not
no-ops; long-context features are set so they matter in a 40-token prompt: sliding windows of
8 (Mistral, Gemma 2/3) and 16 (Phi-3), scaled RoPE with an original context of 32 (Llama 3.1,
YaRN on Qwen3, linear on Gemma 3's global layers, LongRoPE with partial rotary on Phi-3),
soft-caps small enough to bite (Gemma 2). Every model shares one 320-token byte-level
vocabulary (the one scripts/tiny_models.py writes), so the whole set stays small.

Writes fixtures/families/<name>/ (config.json, model.safetensors in f32, tokenizer.json),
fixtures/families/<name>.gguf (f32) and fixtures/families/reference.json.

Needs torch, transformers (>= 5), safetensors, tokenizers and llama.cpp's converter with its
gguf-py:
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    pip install llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py
    python3 scripts/family_models.py --llama-cpp llama_cpp_python-0.3.36/vendor/llama.cpp
"""
import argparse
import json
import math
import pathlib
import shutil
import subprocess
import sys

import torch
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tiny_models import byte_vocab  # noqa: E402

FORMAT_VERSION = 1
GREEDY_STEPS = 8
PROMPT_LEN = 40
SEED = 20261125
VOCAB = 320
ORIGINAL_CTX = 32
MAX_POS = 128


def common(**kw):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
    )
    base.update(kw)
    return base


# name, config class, architecture, config keywords, GGUF metadata the converter drops
CASES = [
    ("llama3", transformers.LlamaConfig, "LlamaForCausalLM", common(
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=4.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=ORIGINAL_CTX),
    ), {}),
    # llama.cpp's converter writes Mistral as `llama` without its window (llama.cpp does not run
    # it); we add the key other writers use, so the GGUF says what the model is.
    ("mistral", transformers.MistralConfig, "MistralForCausalLM", common(
        sliding_window=8, rope_parameters=dict(rope_type="default", rope_theta=10000.0),
    ), {"llama.attention.sliding_window": 8}),
    ("qwen2", transformers.Qwen2Config, "Qwen2ForCausalLM", common(
        num_hidden_layers=3, rope_parameters=dict(rope_type="default", rope_theta=1000000.0), tie_word_embeddings=True,
    ), {}),
    ("qwen3", transformers.Qwen3Config, "Qwen3ForCausalLM", common(
        head_dim=16,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=ORIGINAL_CTX),
    ), {}),
    ("gemma2", transformers.Gemma2Config, "Gemma2ForCausalLM", common(
        num_hidden_layers=3, head_dim=8, query_pre_attn_scalar=8, sliding_window=8,
        attn_logit_softcapping=2.0, final_logit_softcapping=5.0, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
    ), {}),
    ("gemma3", transformers.Gemma3TextConfig, "Gemma3ForCausalLM", common(
        num_hidden_layers=6, head_dim=8, query_pre_attn_scalar=8, sliding_window=8, tie_word_embeddings=True,
        rope_parameters={
            "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=100000.0),
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
        },
    ), {}),
    ("phi3", transformers.Phi3Config, "Phi3ForCausalLM", common(
        hidden_size=64, sliding_window=16, original_max_position_embeddings=ORIGINAL_CTX,
        rope_parameters=dict(
            rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
            short_factor=[1.0, 1.2, 1.5, 2.0, 2.5, 3.0], long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 8.0],
        ),
    ), {}),
    ("granite", transformers.GraniteConfig, "GraniteForCausalLM", common(
        embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
    ), {}),
    ("olmo2", transformers.Olmo2Config, "Olmo2ForCausalLM", common(
        rope_parameters=dict(rope_type="default", rope_theta=500000.0),
    ), {}),
    # OLMo 3: three sliding layers to one full (transformers' default pattern), YaRN on the full
    # layers only; llama.cpp's converter writes it as arch `olmo2` with window keys.
    ("olmo3", transformers.Olmo3Config, "Olmo3ForCausalLM", common(
        num_hidden_layers=4, sliding_window=8,
        rope_parameters={
            "full_attention": dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                   original_max_position_embeddings=ORIGINAL_CTX),
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
        },
    ), {}),
    # Mixtures of experts: 8 experts, 2 per token, so a 40-token prefill reaches every expert
    # and each decode step leaves most of them without a token.
    ("qwen3_moe", transformers.Qwen3MoeConfig, "Qwen3MoeForCausalLM", common(
        head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
    ), {}),
    ("mixtral", transformers.MixtralConfig, "MixtralForCausalLM", common(
        intermediate_size=48, num_local_experts=8, num_experts_per_tok=2,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
    ), {}),
    # gpt-oss: attention sinks, even layers sliding, untruncated YaRN, biased router and experts,
    # the clamped SwiGLU (expert weights large enough that the clamp bites), and MXFP4 experts
    # in the GGUF (the HF weights are MXFP4-exact, so both files hold the same model).
    ("gpt_oss", transformers.GptOssConfig, "GptOssForCausalLM", common(
        head_dim=16, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
        attention_bias=True, swiglu_limit=7.0,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                             truncate=False, original_max_position_embeddings=ORIGINAL_CTX),
    ), {}),
]

MXFP4_EXPERTS = ("gpt_oss",)

GEMMA_NORMS = ("gemma2", "gemma3")


def randomize(model, name, gen):
    """Weights that make every feature count: norms not at their identity, biases not zero,
    projections large enough that logits separate."""
    with torch.no_grad():
        for pname, p in model.named_parameters():
            u = lambda s: (torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1) * s
            if "norm" in pname:
                # Gemma scales by (1 + w): w near 0 is a real norm there.
                p.copy_(u(0.2) if name in GEMMA_NORMS else 1.0 + u(0.2))
            elif pname.endswith("bias"):
                p.copy_(u(0.5))
            elif name == "gpt_oss" and pname.endswith("gate_up_proj"):
                p.copy_(u(10.0 / math.sqrt(p.shape[1])))
            elif pname.endswith("sinks"):
                p.copy_(u(2.0))
            elif "embed_tokens" in pname:
                # Tied: the same rows also score the next token, and large ones make a model
                # repeat its input.
                p.copy_(u(0.3 if model.config.tie_word_embeddings else 1.0))
            else:
                p.copy_(u(1.5 / math.sqrt(p.shape[-1])))


def mxfp4_exact(model):
    """Rounds gpt-oss's expert weights to MXFP4 along the dimension GGUF blocks them (their
    input), so the GGUF's MXFP4 experts hold exactly the HF model's values."""
    import gguf  # noqa: E402
    from gguf.quants import dequantize, quantize  # noqa: E402

    def roundtrip(w):  # blocks along the last dimension
        q = quantize(w.detach().float().numpy(), gguf.GGMLQuantizationType.MXFP4)
        return torch.from_numpy(dequantize(q, gguf.GGMLQuantizationType.MXFP4)).reshape(w.shape)

    with torch.no_grad():
        for layer in model.model.layers:
            e = layer.mlp.experts
            # gate_up [experts, hidden, 2ff] and down [experts, ff, hidden] are stored [in, out].
            e.gate_up_proj.copy_(roundtrip(e.gate_up_proj.transpose(1, 2)).transpose(1, 2))
            e.down_proj.copy_(roundtrip(e.down_proj.transpose(1, 2)).transpose(1, 2))


def hf_tokenizer():
    tokens, _, merges = byte_vocab()
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return tok


def patch_converter(llama_cpp):
    """The converter derives the vocabulary from the tokenizer's pre-tokenizer hash, which knows
    only released models; write our byte vocabulary directly instead (as tiny_models.py does)."""
    sys.path.insert(0, str(llama_cpp))
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import conversion  # noqa: E402

    conversion.load_all_models()

    def set_vocab(self):
        tokens, types, merges = byte_vocab()
        w = self.gguf_writer
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(0)
        w.add_eos_token_id(1)

    stack = [conversion.TextModel]
    while stack:
        cls = stack.pop()
        if cls is conversion.TextModel or "set_vocab" in cls.__dict__:
            cls.set_vocab = set_vocab
        stack.extend(cls.__subclasses__())
    import convert_hf_to_gguf  # noqa: E402

    return convert_hf_to_gguf


def convert(converter, src, out):
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outtype", "f32", "--outfile", str(out)]
    try:
        converter.main()
    finally:
        sys.argv = argv


def rewrite_gguf(path, extra=None, mxfp4_experts=False):
    """Rewrites the GGUF at `path` (with gguf-py): extra integer metadata, and its
    `ffn_*_exps.weight` tensors quantized to MXFP4."""
    if not extra and not mxfp4_experts:
        return
    import gguf  # noqa: E402
    from gguf.quants import quantize  # noqa: E402

    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    tmp = path.with_suffix(".tmp.gguf")
    writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for k, v in (extra or {}).items():
        writer.add_uint32(k, v)
    for t in reader.tensors:
        if mxfp4_experts and "_exps.weight" in t.name:
            data = quantize(t.data.astype("float32"), gguf.GGMLQuantizationType.MXFP4)
            writer.add_tensor(t.name, data, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)


def reference(model, prompt):
    """Greedy tokens, each step's full log-softmax row (positions prompt-1 … end-1) and the
    margin between the best two logits, from full float64 recomputes."""
    ids = list(prompt)
    rows, greedy, margins = [], [], []
    with torch.no_grad():
        for step in range(GREEDY_STEPS + 1):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            rows.append(torch.log_softmax(logits, -1).tolist())
            if step == GREEDY_STEPS:
                break
            top = torch.topk(logits, 2)
            greedy.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(greedy[-1])
    return greedy, margins, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", type=pathlib.Path, required=True, help="llama.cpp source tree")
    ap.add_argument("--only", nargs="*", help="rewrite only these cases (the others are still built, so the "
                    "random stream and every committed fixture stay as they are)")
    args = ap.parse_args()
    converter = patch_converter(args.llama_cpp.resolve())
    out = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "families"
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(SEED)
    prompt = torch.randint(2, VOCAB, (PROMPT_LEN,), generator=gen).tolist()
    tok = hf_tokenizer()
    cases = []
    for name, cls, arch, kw, extra in CASES:
        config = cls(**kw, architectures=[arch])
        config._attn_implementation = "eager"
        # The per-expert loop: the grouped kernels do not take float64.
        config._experts_implementation = "eager"
        model = getattr(transformers, arch)(config).eval()
        randomize(model, name, gen)
        if name in MXFP4_EXPERTS:
            mxfp4_exact(model)
        if args.only and name not in args.only:
            continue
        d = out / name
        if d.exists():
            shutil.rmtree(d)
        model.save_pretrained(d, safe_serialization=True)
        tok.save(str(d / "tokenizer.json"))
        (d / "generation_config.json").unlink(missing_ok=True)
        gguf_path = out / f"{name}.gguf"
        convert(converter, d, gguf_path)
        rewrite_gguf(gguf_path, extra, mxfp4_experts=name in MXFP4_EXPERTS)
        model = model.double()
        greedy, margins, rows = reference(model, prompt)
        cases.append(dict(name=name, hf_dir=name, gguf=f"{name}.gguf", prompt_ids=prompt, greedy_ids=greedy,
                          greedy_margins=margins, logprobs=[[round(x, 7) for x in r] for r in rows]))
        print(f"{name}: greedy {greedy}, min margin {min(margins):.4f}", flush=True)
    if args.only:
        kept = json.loads((out / "reference.json").read_text())["cases"]
        fresh = {c["name"]: c for c in cases}
        order = [name for name, *_ in CASES]
        merged = {c["name"]: c for c in kept}
        merged.update(fresh)
        cases = [merged[n] for n in order if n in merged]
    (out / "reference.json").write_text(json.dumps(dict(
        format_version=FORMAT_VERSION, generator="scripts/family_models.py",
        transformers=transformers.__version__, torch=torch.__version__, cases=cases)) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A tiny Llama-style GGUF whose tokenizer is SentencePiece BPE (`tokenizer.ggml.model = llama`,
as in Llama 2 / Mistral v0.1 / TinyLlama GGUFs), trained here with the `sentencepiece` package
using Llama 2's settings (byte fallback, digits split, identity normalization). Expected ids
come from sentencepiece itself and are checked against llama.cpp's tokenizer.

Writes fixtures/spm/tiny_spm.gguf and fixtures/spm/cases.json.
Re-run:  pip install sentencepiece llama-cpp-python gguf && python3 scripts/spm_fixture.py
"""
import io
import json
import pathlib

import numpy as np
import sentencepiece as spm
from gguf import GGUFWriter

CORPUS = """The quick brown fox jumps over the lazy dog. Hello world, hello there!
In 2024 the model read 12345 tokens, then 678 more. Prices rose 3.5 percent.
def main():\n    print("hello")\n    return 0
She said: "don't stop", and they didn't. We're here; you'll see.
The theory of the thing is that the others think the same thing then.
""" * 20

CASES = [
    "Hello world",
    "The quick brown fox",
    " leading space",
    "double  space and\nnew line",
    "numbers 12345 and 3.14",
    "unicode é ü 日本 🎉 falls back to bytes",
    "def main():\n    return 0",
    "a",
]


def main():
    out = pathlib.Path(__file__).parent.parent / "fixtures" / "spm"
    out.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()), model_writer=buf, vocab_size=420, model_type="bpe",
        byte_fallback=True, split_digits=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, character_coverage=1.0, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]
    scores = [sp.get_score(i) for i in range(n)]
    # llama.cpp token types: 1 normal, 2 unknown, 3 control, 6 byte
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(n)]

    path = out / "tiny_spm.gguf"
    w = GGUFWriter(str(path), "llama")
    d, ff, heads = 64, 96, 4
    w.add_context_length(128)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_block_count(1)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    rng = np.random.default_rng(5)
    r = lambda *s: rng.uniform(-0.2, 0.2, size=s).astype(np.float32)
    w.add_tensor("token_embd.weight", r(n, d))
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    for name, shape in [("attn_q", (d, d)), ("attn_k", (d, d)), ("attn_v", (d, d)), ("attn_output", (d, d)),
                        ("ffn_gate", (ff, d)), ("ffn_up", (ff, d)), ("ffn_down", (d, ff))]:
        w.add_tensor(f"blk.0.{name}.weight", r(*shape))
    for name in ("attn_norm", "ffn_norm"):
        w.add_tensor(f"blk.0.{name}.weight", np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    from llama_cpp import Llama
    llama = Llama(model_path=str(path), vocab_only=True, verbose=False)
    cases = []
    for text in CASES:
        ids = [1] + sp.encode(text)
        theirs = llama.tokenize(text.encode(), add_bos=True, special=False)
        agree = ids == theirs
        print(f"{text!r}: {len(ids)} ids, llama.cpp {'agrees' if agree else 'DIFFERS: ' + str(theirs)}")
        cases.append(dict(text=text, ids=ids, decoded=sp.decode(ids[1:]), llama_cpp_agrees=agree))
    (out / "cases.json").write_text(json.dumps(dict(generator="scripts/spm_fixture.py", cases=cases), ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()

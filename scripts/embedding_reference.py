#!/usr/bin/env python3
"""Reference embeddings for `infer serve --runner pooling`, from transformers in float64.

For three of the tiny family checkpoints (scripts/family_models.py): Llama 3 (scaled RoPE),
Qwen3 (per-head q/k norms, YaRN past an original context of 32; Qwen3-Embedding's family) and
Mistral (a sliding window of 8), each input's final-normed hidden states
(`last_hidden_state`, eager attention) pooled three ways: MEAN over every token, LAST token,
and CLS (the first token). Vectors are written unnormalized; tests normalize them.

Writes fixtures/families/embeddings.json. Needs torch, transformers (>= 5) and tokenizers:
    python3 scripts/embedding_reference.py
"""
import json
import pathlib

import torch
import transformers
from tokenizers import Tokenizer

FAMILIES = ["llama3", "qwen3", "mistral"]
# The last runs past the checkpoints' original context of 32 tokens and the sliding window.
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors.",
    "A longer input that runs well past the original context of thirty-two tokens, so scaled RoPE counts.",
]
ROOT = pathlib.Path(__file__).resolve().parents[1]
FAMILY_DIR = ROOT / "fixtures" / "families"


def main():
    cases = []
    for name in FAMILIES:
        folder = FAMILY_DIR / name
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = transformers.AutoConfig.from_pretrained(folder)
        config._attn_implementation = "eager"
        model = transformers.AutoModel.from_pretrained(folder, config=config, dtype=torch.float64)
        model.eval()
        inputs = []
        for text in TEXTS:
            ids = tokenizer.encode(text, add_special_tokens=True).ids
            with torch.no_grad():
                hidden = model(torch.tensor([ids])).last_hidden_state[0]
            inputs.append({
                "text": text,
                "ids": ids,
                "mean": hidden.mean(dim=0).tolist(),
                "last": hidden[-1].tolist(),
                "cls": hidden[0].tolist(),
            })
        cases.append({"name": name, "hf_dir": name, "gguf": f"{name}.gguf", "inputs": inputs})
    out = {
        "format_version": 1,
        "generator": "scripts/embedding_reference.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "cases": cases,
    }
    path = FAMILY_DIR / "embeddings.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

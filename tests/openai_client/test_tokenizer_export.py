"""`infer tokenizer export`: the Hugging Face folder that guidellm (`--processor DIR`) and
aiperf (`--tokenizer DIR`) load with transformers' AutoTokenizer gives the ids the server's
`/tokenize` gives, for text and for chat messages through the template."""

import json
import os
import subprocess
import urllib.request

from transformers import AutoTokenizer

from conftest import KEY, ROOT, binary

TEXTS = [
    "Hello, world!",
    "  two leading spaces, tabs\tand\nnewlines",
    "accents é, CJK 日本語, emoji 😀",
    "<|im_start|>user\nhi<|im_end|>",
    "12345 + 678 = ?",
]


def tokenize(server, body):
    req = urllib.request.Request(
        f"{server}/tokenize", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    return json.load(urllib.request.urlopen(req))["tokens"]


def test_exported_tokenizer_gives_the_servers_ids(server, tmp_path):
    model = os.environ.get("INFER_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    subprocess.run([binary(), "tokenizer", "export", model, str(tmp_path)], check=True)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS:
        assert tok(text)["input_ids"] == tokenize(server, {"prompt": text}), text
        assert tok.decode(tokenize(server, {"prompt": text})) == text
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    hf = tok(rendered, add_special_tokens=False)["input_ids"]
    assert hf == tokenize(server, {"messages": messages})
    assert tok.eos_token and tok.model_max_length > 0

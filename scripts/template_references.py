#!/usr/bin/env python3
"""Chat templates of the families we run, rendered by transformers (its own Jinja renderer,
`render_jinja_template`, as `apply_chat_template` uses it), for infer's renderer to match byte
for byte: Qwen3 with thinking on and off and with tools, Phi-3.5, and Gemma 2 (whose template
raises on a system message).

The templates are the models' own, as llama.cpp's tree keeps them in models/templates/
(copied into fixtures/templates/). Writes fixtures/templates/cases.json.
Re-run:  pip install transformers jinja2 && python3 scripts/template_references.py
"""
import json
import pathlib

from transformers.utils.chat_template_utils import render_jinja_template

DIR = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}

CHAT = [{"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello! How can I help?"},
        {"role": "user", "content": "What is 2 + 2?"}]
SYSTEM = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
TOOL_TURN = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [CALL]},
             {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"}]

CASES = [
    # template, name, messages, tools, kwargs, bos, eos
    ("Qwen-Qwen3-0.6B.jinja", "qwen3 chat", CHAT, None, {}, "", "<|im_end|>"),
    ("Qwen-Qwen3-0.6B.jinja", "qwen3 no thinking", CHAT, None, {"enable_thinking": False}, "", "<|im_end|>"),
    ("Qwen-Qwen3-0.6B.jinja", "qwen3 system", SYSTEM, None, {}, "", "<|im_end|>"),
    ("Qwen-Qwen3-0.6B.jinja", "qwen3 tools", TOOL_TURN, [WEATHER], {}, "", "<|im_end|>"),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "phi3.5 system", SYSTEM, None, {}, "<s>", "<|endoftext|>"),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "phi3.5 chat", CHAT, None, {}, "<s>", "<|endoftext|>"),
    ("google-gemma-2-2b-it.jinja", "gemma2 chat", CHAT, None, {}, "<bos>", "<eos>"),
    ("google-gemma-2-2b-it.jinja", "gemma2 system", SYSTEM, None, {}, "<bos>", "<eos>"),
]


def main():
    out = []
    for file, name, messages, tools, kwargs, bos, eos in CASES:
        template = (DIR / file).read_text()
        case = dict(name=name, template=file, messages=messages, tools=tools, kwargs=kwargs,
                    bos_token=bos, eos_token=eos, add_generation_prompt=True)
        try:
            rendered = render_jinja_template(
                conversations=[messages], tools=tools, chat_template=template,
                add_generation_prompt=True, bos_token=bos, eos_token=eos, **kwargs)
            case["rendered"] = rendered[0][0] if isinstance(rendered, tuple) else rendered[0]
        except Exception as e:  # noqa: BLE001 - the template raised on purpose
            case["error"] = str(e)
        out.append(case)
        print(name, "error" if "error" in case else f"{len(case['rendered'])} chars")
    (DIR / "cases.json").write_text(json.dumps(dict(generator="scripts/template_references.py", cases=out), indent=1) + "\n")


if __name__ == "__main__":
    main()

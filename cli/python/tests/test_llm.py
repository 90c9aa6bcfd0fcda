"""`LLM`: vLLM's offline API over the engine, against `infer generate`, `infer serve` and the
committed reference tokens."""

import json
import subprocess

import pytest
from conftest import MODEL, ROOT, binary, post

from infer import (BeamSearchParams, RequestError, SamplingParams, StructuredOutputsParams)

REFERENCE = json.loads((ROOT / "fixtures" / "reference.json").read_text())


def test_greedy_equals_infer_generate_and_the_reference(llm, tmp_path):
    cases = [c for c in REFERENCE["cases"] if not c["chat"]]
    assert cases
    n = min(len(c["greedy_ids"]) for c in cases)
    outs = llm.generate([c["prompt"] for c in cases], SamplingParams(temperature=0, max_tokens=n,
                                                                      ignore_eos=True), use_tqdm=False)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": c["prompt"]}) + "\n" for c in cases))
    cli = subprocess.run([binary(), "generate", "--model", MODEL, "--prompts-file", str(prompts), "--json",
                          "--temperature", "0", "--max-tokens", str(n), "--ignore-eos", "--max-model-len", "512"],
                         capture_output=True, text=True, check=True)
    cli_outs = [json.loads(line) for line in cli.stdout.splitlines() if line.strip()]
    cli_outs = [o for o in cli_outs if "outputs" in o]  # the last line is a summary
    assert len(cli_outs) == len(cases)
    for case, out, ref in zip(cases, outs, cli_outs):
        assert out.prompt == case["prompt"]
        assert out.prompt_token_ids == case["prompt_ids"]
        assert out.outputs[0].token_ids == case["greedy_ids"][:n]
        assert out.outputs[0].token_ids == ref["outputs"][0]["token_ids"]
        assert out.outputs[0].text == ref["outputs"][0]["text"]
        assert out.finished and out.outputs[0].finish_reason == "length"


def test_token_id_prompts_and_prompt_dicts(llm):
    ids = llm.get_tokenizer().encode("The capital of France is")
    greedy = SamplingParams(temperature=0, max_tokens=6)
    a, b, c = llm.generate(["The capital of France is", {"prompt_token_ids": ids}, ids], greedy, use_tqdm=False)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == c.outputs[0].token_ids
    assert b.prompt is None and b.prompt_token_ids == ids


@pytest.mark.parametrize("seed", [1, 7])
def test_seeded_sampling_equals_the_server(llm, server, seed):
    fields = {"temperature": 0.9, "top_p": 0.95, "max_tokens": 12, "seed": seed, "n": 2}
    status, reply = post(server, "/v1/completions", dict(fields, prompt="Once upon a time"))
    assert status == 200, reply
    (out,) = llm.generate("Once upon a time", SamplingParams(**fields), use_tqdm=False)
    assert [o.text for o in out.outputs] == [c["text"] for c in reply["choices"]]


def test_n_logprobs_and_stop_strings(llm, server):
    params = SamplingParams(temperature=0.8, seed=3, n=3, max_tokens=10, logprobs=2)
    (out,) = llm.generate("List three colors:", params, use_tqdm=False)
    assert [o.index for o in out.outputs] == [0, 1, 2]
    for o in out.outputs:
        assert len(o.logprobs) == len(o.token_ids)
        for tok, pos in zip(o.token_ids, o.logprobs):
            assert tok in pos and len(pos) <= 3
            best = max(lp.logprob for lp in pos.values())
            assert pos[tok].rank == 1 + sum(1 for lp in pos.values() if lp.logprob > pos[tok].logprob)
            assert best <= 0
        assert o.cumulative_logprob == pytest.approx(sum(p[t].logprob for t, p in zip(o.token_ids, o.logprobs)),
                                                     abs=1e-3)
    # A stop string ends the text before it; with include_stop_str_in_output it stays.
    greedy = SamplingParams(temperature=0, max_tokens=20, stop=["."])
    (cut,) = llm.generate("The capital of France is", greedy, use_tqdm=False)
    assert cut.outputs[0].stop_reason == "." and cut.outputs[0].finish_reason == "stop"
    assert "." not in cut.outputs[0].text
    kept = SamplingParams(temperature=0, max_tokens=20, stop=["."], include_stop_str_in_output=True)
    (with_stop,) = llm.generate("The capital of France is", kept, use_tqdm=False)
    assert with_stop.outputs[0].text == cut.outputs[0].text + "."
    status, reply = post(server, "/v1/completions", {"prompt": "The capital of France is", "temperature": 0,
                                                     "max_tokens": 20, "stop": ["."]})
    assert reply["choices"][0]["text"] == cut.outputs[0].text


def test_prompt_logprobs(llm):
    (out,) = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1),
                          use_tqdm=False)
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for tok, pos in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
        assert tok in pos and pos[tok].rank >= 1


def test_structured_outputs(llm):
    choice = SamplingParams(temperature=0.7, seed=0, max_tokens=8,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    outs = llm.generate(["Is the sky blue?", "Is fire cold?"], choice, use_tqdm=False)
    assert all(o.outputs[0].text in ("yes", "no") for o in outs)
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"],
              "additionalProperties": False}
    (out,) = llm.generate("Alice is 30. As JSON:", SamplingParams(
        temperature=0, max_tokens=30, structured_outputs=StructuredOutputsParams(json=schema)), use_tqdm=False)
    assert isinstance(json.loads(out.outputs[0].text)["age"], int)


def test_beam_search_matches_the_server(llm, server):
    prompts = ["The capital of France is", "My favourite colour is"]
    outs = llm.beam_search(prompts, BeamSearchParams(beam_width=3, max_tokens=5))
    assert len(outs) == 2
    for prompt, out in zip(prompts, outs):
        assert len(out.sequences) == 3
        scores = [s.cum_logprob for s in out.sequences]
        assert scores == sorted(scores, reverse=True)
        status, reply = post(server, "/v1/completions", {"prompt": prompt, "use_beam_search": True,
                                                         "n": 3, "max_tokens": 5, "temperature": 0})
        assert status == 200, reply
        assert [s.text for s in out.sequences] == [c["text"] for c in reply["choices"]]


def test_a_batch_is_admitted_at_one_step(llm):
    """All prompts of a `generate` call start together and prefill in one step when the token
    budget holds them (the server's step pacing is off offline), then one step per token (a
    step more if the engine woke between two of the prompts' arrivals). Submitting them one by
    one waited a step each; paced steps took a prompt or two each."""
    prompts = [f"Item {i}: " + "a long list of words " * 50 for i in range(6)]
    lengths = [len(llm.get_tokenizer().encode(p)) for p in prompts]
    assert 1000 < sum(lengths) < llm.engine_config()["max_num_batched_tokens"]
    before = llm.stats()["steps"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)
    assert llm.stats()["steps"] - before <= 6 + 1


def test_chat_through_the_template(llm, server):
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "What is the capital of France?"}]
    (out,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    status, reply = post(server, "/v1/chat/completions", {"messages": messages, "temperature": 0, "max_tokens": 12})
    assert reply["choices"][0]["message"]["content"] == out.outputs[0].text
    template = llm.get_tokenizer().apply_chat_template(messages, tokenize=True)
    assert out.prompt_token_ids == template
    text = llm.get_tokenizer().apply_chat_template(messages, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    # Tools are shown to the model through the template.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    (with_tools,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4), tools=tools, use_tqdm=False)
    assert len(with_tools.prompt_token_ids) > len(out.prompt_token_ids)
    assert "get_weather" in llm.get_tokenizer().decode(with_tools.prompt_token_ids)
    # Several conversations at once, in order.
    batch = llm.chat([messages, messages[1:]], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert batch[0].outputs[0].text == out.outputs[0].text


@pytest.mark.parametrize("fields", [
    {"temperature": -1},
    {"top_p": 0},
    {"top_k": -5},
    {"n": 2, "temperature": 0},
    {"logit_bias": {"999999": 1.0}},
    {"stop_token_ids": [10 ** 9]},
    {"logprobs": 100},
    {"structured_outputs": {"choice": []}},
])
def test_bad_parameters_raise_the_servers_message(llm, server, fields):
    status, reply = post(server, "/v1/completions", dict(fields, prompt="Hi", max_tokens=4))
    assert status == 400, reply
    with pytest.raises(RequestError) as caught:
        structured = fields.get("structured_outputs")
        rest = {k: v for k, v in fields.items() if k != "structured_outputs"}
        if "logit_bias" in rest:
            rest["logit_bias"] = {int(k): v for k, v in rest["logit_bias"].items()}
        params = SamplingParams(max_tokens=4, **rest, structured_outputs=(
            StructuredOutputsParams(**structured) if structured is not None else None))
        llm.generate("Hi", params, use_tqdm=False)
    assert str(caught.value) == reply["error"]["message"]
    assert caught.value.param == reply["error"]["param"]
    assert caught.value.status == 400


def test_context_and_unsupported_settings(llm):
    with pytest.raises(RequestError, match="context"):
        llm.generate("word " * 600, SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(RequestError, match="logits processors"):
        SamplingParams(logits_processors=[lambda ids, logits: logits])
    from infer import LLM
    with pytest.raises(ValueError, match="bfloat16"):
        LLM(model=MODEL, dtype="bfloat16")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(model=MODEL, tensor_parallel_size=2)


def test_detokenize_false_and_tokenizer(llm):
    (out,) = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4, detokenize=False), use_tqdm=False)
    assert out.outputs[0].text == "" and len(out.outputs[0].token_ids) == 4
    tok = llm.get_tokenizer()
    ids = tok.encode("Hello world")
    assert tok.decode(ids) == "Hello world"
    with pytest.raises(RequestError):
        tok.decode([10 ** 9])

"""/v1/completions through the official client: JSON, streaming, n, logprobs, echo, stop."""

import math

import json
import urllib.request

from conftest import KEY, MODEL

PROMPT = "The capital of France is"


def complete(client, **kw):
    return client.completions.create(model=MODEL, prompt=PROMPT, **kw)


def test_greedy_completion_and_usage(client):
    r = complete(client, max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.model == MODEL
    assert len(r.choices) == 1
    assert "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == 5
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_stream_with_usage_equals_the_json_reply(client):
    whole = complete(client, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    chunks = list(
        complete(client, max_tokens=12, temperature=0, stream=True,
                 stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_n_2_gives_two_indexed_choices(client):
    r = complete(client, max_tokens=6, temperature=1.0, n=2, seed=7, logprobs=1)
    assert sorted(c.index for c in r.choices) == [0, 1]
    # Usage counts both choices' tokens.
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    again = complete(client, max_tokens=6, temperature=1.0, n=2, seed=7, logprobs=1)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]


def test_logprobs(client):
    r = complete(client, max_tokens=4, temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0
        assert 1 <= len(top) <= 3
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(max(top.values()), logprob, abs_tol=1e-5)
        assert token in top


def test_echo_with_logprobs_scores_the_prompt(client):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs, max_tokens 1 (or 0)."""
    for max_tokens in (1, 0):
        r = complete(client, max_tokens=max_tokens, temperature=0, logprobs=1, echo=True)
        c = r.choices[0]
        assert c.text.startswith(PROMPT)
        lp = c.logprobs
        assert len(lp.tokens) == 5 + max_tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(x < 0 for x in lp.token_logprobs[1:])
        assert "".join(lp.tokens) == c.text
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        if max_tokens == 0:
            assert c.text == PROMPT
            assert r.usage.completion_tokens == 0
    # The prompt's scores are the same whatever follows.
    a = complete(client, max_tokens=1, temperature=0, logprobs=1, echo=True)
    b = complete(client, max_tokens=0, temperature=0, logprobs=1, echo=True)
    assert a.choices[0].logprobs.token_logprobs[:5] == b.choices[0].logprobs.token_logprobs[:5]


def test_echo_json_and_streamed(client):
    whole = complete(client, max_tokens=5, temperature=0, echo=True)
    assert whole.choices[0].text.startswith(PROMPT)
    plain = complete(client, max_tokens=5, temperature=0)
    assert whole.choices[0].text == PROMPT + plain.choices[0].text
    chunks = list(complete(client, max_tokens=5, temperature=0, echo=True, stream=True))
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text


def test_stop_string_cuts_the_text(client):
    full = complete(client, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    stop = text.strip().split()[1] if len(text.strip().split()) > 1 else text.strip()[-2:]
    r = complete(client, max_tokens=10, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index(stop)]


def test_several_prompts_and_token_ids(client):
    r = client.completions.create(model=MODEL, prompt=["Hello", "1, 2, 3,"], max_tokens=3, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1]
    ids = client.completions.create(model=MODEL, prompt=[504, 3575, 282, 4649, 314], max_tokens=3, temperature=0)
    assert ids.usage.prompt_tokens == 5


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_stop_reason_is_vllms(client, server):
    # The stop string itself, the stop token's id, or None (EOS, length), on both endpoints.
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                  temperature=0, stop=["Paris"])
    assert r.choices[0].finish_reason == "stop"
    assert getattr(r.choices[0], "stop_reason", "missing") == "Paris", r
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=2,
                                  temperature=0)
    assert getattr(r.choices[0], "stop_reason", "missing") is None, r
    first = client.completions.create(model=MODEL, prompt="The capital of France is",
                                      max_tokens=1, temperature=0, logprobs=0)
    req = urllib.request.Request(
        f"{server}/tokenize",
        data=json.dumps({"prompt": first.choices[0].text, "add_special_tokens": False}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    stop_id = json.load(urllib.request.urlopen(req))["tokens"][0]
    c = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0,
                                       messages=[{"role": "user", "content": "Say hello."}],
                                       stop=["hello", "Hello"])
    assert getattr(c.choices[0], "stop_reason", "missing") in ("hello", "Hello", None), c
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4,
                                  temperature=0, extra_body={"stop_token_ids": [stop_id]})
    assert getattr(r.choices[0], "stop_reason", "missing") == stop_id, r


def test_logprob_tokens_as_token_ids(client):
    # vLLM's `return_tokens_as_token_ids` (lm-eval asks for it): tokens named token_id:N.
    named = client.completions.create(model=MODEL, prompt="The capital of France is",
                                      max_tokens=4, temperature=0, logprobs=2)
    by_id = client.completions.create(model=MODEL, prompt="The capital of France is",
                                      max_tokens=4, temperature=0, logprobs=2,
                                      extra_body={"return_tokens_as_token_ids": True})
    tokens = by_id.choices[0].logprobs.tokens
    assert len(tokens) == len(named.choices[0].logprobs.tokens)
    assert all(t.startswith("token_id:") for t in tokens), tokens
    assert by_id.choices[0].text == named.choices[0].text
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=1, extra_body={"return_tokens_as_token_ids": True})
    assert all(c.token.startswith("token_id:") for c in chat.choices[0].logprobs.content)

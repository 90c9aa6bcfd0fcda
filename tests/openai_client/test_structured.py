"""Structured outputs and request shapes through the official client: `.parse()` with a
Pydantic model, `json_schema` under sampling, vLLM's guided fields (through `extra_body`),
content parts, and every field we do not implement refused by name."""

import json
import re
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pydantic

from conftest import KEY, MODEL
from test_errors import expect, raw_post

ASK = [{"role": "user", "content": "Describe Paris as JSON."}]


class City(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=16)
    country: str = pydantic.Field(max_length=16)
    population_millions: int = pydantic.Field(ge=0, le=50)
    capital: bool


def city_format():
    return {"type": "json_schema",
            "json_schema": {"name": "city", "schema": City.model_json_schema(), "strict": True}}


def test_parse_returns_a_valid_object(client):
    r = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=City,
                                      max_tokens=120, temperature=0)
    city = r.choices[0].message.parsed
    assert isinstance(city, City), r
    assert r.choices[0].finish_reason == "stop"


def test_json_schema_output_always_validates_when_sampling(client):
    def one(seed):
        r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=1.0, seed=seed,
                                           max_tokens=150, response_format=city_format())
        return r.choices[0]
    with ThreadPoolExecutor(8) as pool:
        choices = list(pool.map(one, range(20)))
    texts = set()
    for c in choices:
        assert c.finish_reason == "stop", c
        City.model_validate_json(c.message.content)
        texts.add(c.message.content)
    assert len(texts) > 5, texts  # sampled, not one forced answer


def test_streamed_json_is_the_same_valid_json(client):
    kw = dict(model=MODEL, messages=ASK, temperature=0, max_tokens=120,
              response_format=city_format())
    whole = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(stream=True, **kw) if c.choices)
    assert streamed == whole
    City.model_validate_json(streamed)


def test_json_object_and_guided_fields(client):
    r = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=60, response_format={"type": "json_object"},
        messages=[{"role": "user",
                   "content": "What is 2+2? Reply with a JSON object whose key \"answer\" holds the number."}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    for seed in range(6):
        for body in ({"guided_choice": ["yes", "no", "maybe"]},
                     {"structured_outputs": {"choice": ["yes", "no", "maybe"]}}):
            r = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Is it raining?"}],
                temperature=1.0, seed=seed, max_tokens=8, extra_body=body)
            assert r.choices[0].message.content in ("yes", "no", "maybe")
    # Parallel samples each follow the constraint from the shared prompt.
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Is it raining?"}], n=4,
        temperature=1.0, seed=5, max_tokens=8, extra_body={"guided_choice": ["yes", "no", "maybe"]})
    assert len(r.choices) == 4
    assert all(c.message.content in ("yes", "no", "maybe") for c in r.choices)
    r = client.completions.create(model=MODEL, prompt="Today's date is", temperature=1.0, seed=1,
                                  max_tokens=20,
                                  extra_body={"guided_regex": r" [0-9]{4}-[0-9]{2}-[0-9]{2}"})
    assert re.fullmatch(r" [0-9]{4}-[0-9]{2}-[0-9]{2}", r.choices[0].text), r.choices[0].text
    r = client.completions.create(model=MODEL, prompt="Answer:", temperature=0, max_tokens=10,
                                  extra_body={"guided_grammar": 'start: " yes" | " no"'})
    assert r.choices[0].text in (" yes", " no")


def test_bad_constraints_are_400_naming_the_field(client):
    chat = client.chat.completions.create
    bad_schema = {"type": "json_schema",
                  "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
    expect(openai.BadRequestError, 400, lambda: chat(
        model=MODEL, messages=ASK, max_tokens=4, response_format=bad_schema), "response_format")
    expect(openai.BadRequestError, 400, lambda: chat(
        model=MODEL, messages=ASK, max_tokens=4, extra_body={"guided_regex": "(unclosed"}),
        "guided_regex")
    expect(openai.BadRequestError, 400, lambda: chat(
        model=MODEL, messages=ASK, max_tokens=4,
        extra_body={"guided_regex": "a", "guided_choice": ["a"]}))


# Fields of OpenAI's and vLLM's request schemas that infer does not implement yet: each must
# be refused by name, never ignored.
UNSUPPORTED_CHAT = {
    "functions": [{"name": "f", "parameters": {}}],
    "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "web_search_options": {},
    "chat_template": "{{ messages }}",
    "logit_processors": ["x"],
    "frobnicate": 1,
}
UNSUPPORTED_COMPLETIONS = {"suffix": "x", "frobnicate": 1}
# Fields that cannot change the output: accepted (docs/vllm.md has the policy).
IGNORED = {"user": "u-1", "store": False, "metadata": {"k": "v"}, "service_tier": "auto",
           "prediction": {"type": "content", "content": "x"}, "audio": None,
           "spaces_between_special_tokens": False, "modalities": ["text"]}


def test_chat_template_kwargs_reach_the_template(client):
    # SmolLM2's template reads no extra variable: the reply is the same with or without one.
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=6, temperature=0)
    kw = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=6, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert kw.choices[0].message.content == plain.choices[0].message.content
    # Names the request sets itself may not be overridden.
    expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=2,
        extra_body={"chat_template_kwargs": {"messages": []}}), "chat_template_kwargs")


def test_every_unsupported_field_is_400_naming_it(client):
    for name, value in UNSUPPORTED_CHAT.items():
        expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=2, extra_body={name: value}), name)
    for name, value in UNSUPPORTED_COMPLETIONS.items():
        expect(openai.BadRequestError, 400, lambda: client.completions.create(
            model=MODEL, prompt="x", max_tokens=2, extra_body={name: value}), name)
    # Stream options that would mean nothing as given.
    expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=2, stream=True,
        stream_options={"continuous_usage_stats": True}), "stream_options")
    expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=2, stream_options={"include_usage": True}),
        "stream_options")
    expect(openai.BadRequestError, 400, lambda: client.completions.create(
        model=MODEL, prompt="x", max_tokens=2, stream=True, extra_body={"prompt_logprobs": 1}),
        "prompt_logprobs")
    # The documented bookkeeping fields are accepted.
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, extra_body=IGNORED)
    assert r.choices[0].message.content is not None


def test_content_parts_equal_the_same_text_as_a_string(client):
    parts = [{"type": "text", "text": "What is the capital"}, {"type": "text", "text": "of France?"}]
    joined = "What is the capital\nof France?"
    a = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12,
                                       messages=[{"role": "user", "content": parts}])
    b = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12,
                                       messages=[{"role": "user", "content": joined}])
    assert a.choices[0].message.content == b.choices[0].message.content
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": image}]),
        "messages[0].content[0].type")


def test_continue_final_message_continues_the_assistant_turn(client, server):
    msgs = [{"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": "My favourite color is"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=6,
                                       extra_body={"continue_final_message": True,
                                                   "add_generation_prompt": False})
    assert r.choices[0].message.content
    status, tokens = raw_post(f"{server}/tokenize", json.dumps(
        {"messages": msgs, "continue_final_message": True, "add_generation_prompt": False}
    ).encode(), {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    assert status == 200, tokens
    plain = client.completions.create(model=MODEL, temperature=0, max_tokens=6,
                                      prompt=tokens["tokens"])
    assert plain.choices[0].text == r.choices[0].message.content


def test_model_card_and_tokenizer_info(client, server):
    assert client.models.retrieve(MODEL).id == MODEL
    expect(openai.NotFoundError, 404, lambda: client.models.retrieve("gpt-9"), "model")
    # Behind the key: it holds the chat template.
    try:
        urllib.request.urlopen(f"{server}/tokenizer_info", timeout=30)
        raise AssertionError("/tokenizer_info answered without the key")
    except urllib.error.HTTPError as e:
        assert e.code == 401
    with urllib.request.urlopen(urllib.request.Request(
            f"{server}/tokenizer_info", headers={"Authorization": f"Bearer {KEY}"}), timeout=30) as r:
        info = json.load(r)
    assert info["eos_token"] == "<|im_end|>"
    assert "{% for message in messages %}" in info["chat_template"]
    assert info["model_max_length"] > 0


def test_cache_salt_partitions_the_prefix_cache(client):
    # Unlike every other prompt of the suite, and several 16-token blocks long.
    prompt = "A salted tenant's prompt blocks are shared only with its own requests. " * 4

    def cached(**extra):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, extra_body=extra)
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached(cache_salt="tenant-a") == 0
    assert cached() == 0
    assert cached(cache_salt="tenant-b") == 0
    assert cached(cache_salt="tenant-a") >= 16
    assert cached() >= 16
    expect(openai.BadRequestError, 400, lambda: client.completions.create(
        model=MODEL, prompt="x", max_tokens=1, extra_body={"cache_salt": ""}), "cache_salt")


def test_vllm_metric_names_and_cached_tokens(client, server):
    long_prompt = "Once upon a time, in a city by the sea, " * 8
    client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=2)
    again = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=2)
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens >= 16, again.usage
    with urllib.request.urlopen(f"{server}/metrics", timeout=30) as r:
        text = r.read().decode()
    for family in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                   "request_success_total", "inter_token_latency_seconds",
                   "request_prefill_time_seconds", "request_decode_time_seconds",
                   "prefix_cache_queries_total", "prefix_cache_hits_total",
                   "time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert f"# TYPE vllm:{family} " in text, family
    assert 'vllm:request_success_total{finished_reason="length",model_name="smol"}' in text


def test_continuous_usage_stats_put_usage_on_every_chunk(client):
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8,
                                                 temperature=0, stream=True,
                                                 stream_options=opts))
    assert all(c.usage is not None for c in chunks), chunks
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 8, counts
    assert len({c.usage.prompt_tokens for c in chunks}) == 1
    chunks = list(client.completions.create(model=MODEL, prompt=["a", "b c"], max_tokens=4,
                                            temperature=0, stream=True, stream_options=opts))
    body = [c for c in chunks if c.choices]
    assert all(c.usage is not None for c in body)
    assert chunks[-1].usage.completion_tokens == 8


def test_prompt_logprobs_match_the_echoed_prompt_scores(client):
    prompt = "The capital of France is Paris"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 3})
    plps = r.choices[0].model_extra["prompt_logprobs"]
    echo = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True,
                                     logprobs=3, temperature=0)
    lp = echo.choices[0].logprobs
    assert plps[0] is None and len(plps) == len(lp.token_logprobs)
    ids = raw_post_tokens(client, prompt)
    for i in range(1, len(plps)):
        entry = plps[i][str(ids[i])]
        assert abs(entry["logprob"] - lp.token_logprobs[i]) < 1e-4, (i, entry)
        assert entry["decoded_token"] == lp.tokens[i]
        best = max(v["logprob"] for v in plps[i].values())
        assert (entry["rank"] == 1) == (entry["logprob"] >= best), plps[i]
        assert 3 <= len(plps[i]) <= 4


def raw_post_tokens(client, prompt):
    status, body = raw_post(f"{str(client.base_url).rstrip('/').removesuffix('/v1')}/tokenize",
                            json.dumps({"prompt": prompt}).encode(),
                            {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    assert status == 200, body
    return body["tokens"]

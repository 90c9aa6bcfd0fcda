"""`embeddings.create` against `infer serve --runner pooling` on the tiny Qwen3 checkpoint,
checked against transformers' mean-pooled hidden states (fixtures/families/embeddings.json,
written by scripts/embedding_reference.py): batches, `dimensions`, both encodings, token-id
inputs, and the errors a pooling or a generating server gives for the other's endpoints."""

import base64
import json
import math
import os
import struct

import openai
import pytest

from conftest import KEY, MODEL, ROOT, binary, start

FIXTURE = ROOT / "fixtures" / "families" / "embeddings.json"
TOLERANCE = 1e-5


def reference():
    cases = json.loads(FIXTURE.read_text())["cases"]
    return next(c for c in cases if c["name"] == "qwen3")


def unit(v):
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


def close(got, want, tol=TOLERANCE):
    assert len(got) == len(want)
    worst = max(abs(g - w) for g, w in zip(got, want))
    assert worst <= tol, worst


@pytest.fixture(scope="module")
def embedder():
    args = [
        binary(), "serve", str(ROOT / "fixtures" / "families" / "qwen3"), "--runner", "pooling",
        "--pooler-config", '{"pooling_type": "MEAN"}', "--port", "0", "--api-key", KEY,
        "--served-model-name", "embedder", "--block-size", "4", "--max-num-batched-tokens", "32", "--max-num-seqs", "4",
    ]
    proc, url = start(args)
    yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)
    os.kill(proc.pid, 15)
    assert proc.wait(timeout=30) == 0


def test_a_batch_of_texts_gives_the_mean_pooled_hidden_states(embedder):
    case = reference()
    texts = [i["text"] for i in case["inputs"]]
    # The client asks for base64 by default and decodes it.
    got = embedder.embeddings.create(model="embedder", input=texts)
    assert [d.index for d in got.data] == list(range(len(texts)))
    assert got.model == "embedder"
    assert got.usage.prompt_tokens == sum(len(i["ids"]) for i in case["inputs"])
    assert got.usage.total_tokens == got.usage.prompt_tokens
    for d, i in zip(got.data, case["inputs"]):
        assert d.object == "embedding"
        close(d.embedding, unit(i["mean"]))
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1) < 1e-5


def test_float_and_base64_encodings_agree(embedder):
    text = reference()["inputs"][1]["text"]
    floats = embedder.embeddings.create(model="embedder", input=text, encoding_format="float")
    raw = embedder.embeddings.with_raw_response.create(
        model="embedder", input=text, encoding_format="base64").http_response.json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    decoded = list(struct.unpack(f"<{len(packed) // 4}f", packed))
    assert decoded == floats.data[0].embedding


def test_dimensions_cut_then_normalize(embedder):
    i = reference()["inputs"][0]
    got = embedder.embeddings.create(model="embedder", input=i["text"], dimensions=8)
    close(got.data[0].embedding, unit(i["mean"][:8]))
    with pytest.raises(openai.BadRequestError) as e:
        embedder.embeddings.create(model="embedder", input=i["text"], dimensions=33)
    assert "dimensions" in str(e.value)


def test_token_id_inputs_and_vllm_fields(embedder):
    case = reference()
    ids = [i["ids"] for i in case["inputs"][:2]]
    got = embedder.embeddings.create(model="embedder", input=ids, encoding_format="float")
    for d, i in zip(got.data, case["inputs"]):
        close(d.embedding, unit(i["mean"]))
    # vLLM's `normalize: false` gives the pooled vector itself.
    raw = embedder.embeddings.create(model="embedder", input=ids[:1], encoding_format="float",
                                     extra_body={"normalize": False})
    close(raw.data[0].embedding, case["inputs"][0]["mean"])
    # vLLM's `truncate_prompt_tokens` keeps the last tokens.
    cut = embedder.embeddings.create(model="embedder", input=ids[:1], encoding_format="float",
                                     extra_body={"truncate_prompt_tokens": 5})
    assert cut.usage.prompt_tokens == 5


def test_bad_embedding_requests_name_the_field(embedder):
    for body, param in [
        ({"input": ""}, "input"),
        ({"input": [[]]}, "input"),
        # A field infer does not know is refused by name, never ignored.
        ({"input": "x", "extra_body": {"pooling": "mean"}}, None),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            embedder.embeddings.create(model="embedder", **body)
        if param:
            assert e.value.body.get("param") == param, e.value.body
        else:
            assert "pooling" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        embedder.embeddings.create(model="other", input="x")


def test_a_pooling_server_does_not_generate(embedder):
    with pytest.raises(openai.BadRequestError) as e:
        embedder.chat.completions.create(
            model="embedder", messages=[{"role": "user", "content": "hi"}])
    assert "does not support Chat Completions API" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        embedder.completions.create(model="embedder", prompt="hi")


def test_a_generating_server_does_not_embed(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input="hi")
    assert "does not support Embeddings API" in str(e.value)

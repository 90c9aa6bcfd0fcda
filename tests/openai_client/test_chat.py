"""/v1/chat/completions through the official client."""

from conftest import MODEL

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def chat(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, **kw)


def test_chat_reply(client):
    r = chat(client, max_tokens=20, temperature=0)
    assert r.object == "chat.completion"
    m = r.choices[0].message
    assert m.role == "assistant"
    assert "Paris" in m.content
    assert r.usage.prompt_tokens > 10


def test_chat_stream_role_first_then_content_with_usage(client):
    whole = chat(client, max_completion_tokens=16, temperature=0)
    chunks = list(chat(client, max_completion_tokens=16, temperature=0, stream=True,
                       stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_chat_logprobs_n_and_stop(client):
    r = chat(client, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert abs(item.top_logprobs[0].logprob - item.logprob) < 1e-5
    two = chat(client, max_tokens=5, temperature=1.0, n=2, seed=3)
    assert sorted(c.index for c in two.choices) == [0, 1]
    full = chat(client, max_tokens=20, temperature=0).choices[0].message.content
    word = full.split()[2]
    cut = chat(client, max_tokens=20, temperature=0, stop=word)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == full[: full.index(word)]

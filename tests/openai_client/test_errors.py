"""Each error case, as the official client sees it: the right status and OpenAI's body."""

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

import openai
import pytest

from conftest import KEY, MAX_MODEL_LEN, MODEL


def raw_post(url, body: bytes, headers):
    """(status, JSON body) of a POST the client library would not send."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def expect(error, status, call, param=None):
    with pytest.raises(error) as e:
        call()
    assert e.value.status_code == status
    body = e.value.body
    assert set(body) >= {"message", "type", "param", "code"}, body
    assert body["message"]
    if param is not None:
        assert body["param"] == param, body
    return body


def test_bad_parameters_are_400(client):
    c = client.completions
    expect(openai.BadRequestError, 400,
           lambda: c.create(model=MODEL, prompt="x", temperature=-1), "temperature")
    expect(openai.BadRequestError, 400, lambda: c.create(model=MODEL, prompt="x", n=0), "n")
    expect(openai.BadRequestError, 400,
           lambda: c.create(model=MODEL, prompt="x", top_p=1.5), "top_p")
    expect(openai.BadRequestError, 400,
           lambda: client.chat.completions.create(model=MODEL, messages=[], max_tokens=2))


def test_prompt_plus_max_tokens_beyond_the_context_is_400(client):
    expect(openai.BadRequestError, 400,
           lambda: client.completions.create(model=MODEL, prompt="Hello there",
                                             max_tokens=MAX_MODEL_LEN), "max_tokens")
    long_prompt = " ".join(["word"] * (MAX_MODEL_LEN + 10))
    expect(openai.BadRequestError, 400,
           lambda: client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=1), "prompt")


def test_unknown_model_is_404(client):
    expect(openai.NotFoundError, 404,
           lambda: client.completions.create(model="gpt-9", prompt="x", max_tokens=1), "model")


def test_missing_or_wrong_api_key_is_401(server):
    for key in ("wrong", ""):
        bad = openai.OpenAI(base_url=f"{server}/v1", api_key=key or "unused", max_retries=0)
        if not key:
            # No Authorization header at all.
            status, body = raw_post(f"{server}/v1/completions", b'{"prompt": "x"}',
                                    {"Content-Type": "application/json"})
            assert status == 401 and body["error"]["message"], body
            continue
        expect(openai.AuthenticationError, 401,
               lambda: bad.completions.create(model=MODEL, prompt="x", max_tokens=1))


def test_invalid_json_is_400_and_oversized_bodies_413(server):
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    status, body = raw_post(f"{server}/v1/completions", b"{not json", auth)
    assert status == 400 and body["error"]["message"], body
    # The server answers from the declared length, before the body: send headers only.
    host = urllib.parse.urlsplit(server).netloc
    conn = http.client.HTTPConnection(host, timeout=60)
    conn.putrequest("POST", "/v1/completions")
    for k, v in auth.items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(9 << 20))
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413
    assert json.load(r)["error"]["message"]
    conn.close()


def test_unknown_fields_are_refused_by_name(client):
    # (The full table of fields is in test_structured.py.)
    expect(openai.BadRequestError, 400, lambda: client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=2, extra_body={"some_vendor_extra": {"x": 1}}),
        "some_vendor_extra")


def test_server_still_serves_after_errors(client):
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens > 0

"""Tool calling through the official client: `tool_choice` `required` and a named function
(grammar-constrained, so always a call that parses), `auto` read back from the model's text
(Hermes's `<tool_call>` format; the server reads it for SmolLM2's template), streamed
`delta.tool_calls` reassembling into the non-streamed calls, `.parse()` with a Pydantic tool,
and past calls and tool results sent back in `messages`."""

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pydantic

from conftest import MODEL
from test_errors import expect

ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tools."}]


class GetWeather(pydantic.BaseModel):
    """Current weather in a city."""
    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(max_length=20)
    unit: str = pydantic.Field(json_schema_extra={"enum": ["celsius", "fahrenheit"]})


class GetTime(pydantic.BaseModel):
    """Local time in a city."""
    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(max_length=20)


TOOLS = [openai.pydantic_function_tool(GetWeather, name="get_weather"),
         openai.pydantic_function_tool(GetTime, name="get_time")]
MODELS = {"get_weather": GetWeather, "get_time": GetTime}


def check_call(call):
    assert call.type == "function" and call.id, call
    MODELS[call.function.name].model_validate_json(call.function.arguments)


def test_required_always_yields_a_parseable_call_when_sampling(client):
    def one(seed):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                           tool_choice="required", temperature=1.0, seed=seed,
                                           max_tokens=180)
        return r.choices[0]
    with ThreadPoolExecutor(8) as pool:
        choices = list(pool.map(one, range(12)))
    for c in choices:
        # A small model at temperature 1 may go on calling until max_tokens: the calls that
        # completed are still returned, the cut one is dropped.
        assert c.finish_reason in ("tool_calls", "length"), c
        assert c.message.content is None and c.message.tool_calls, c
        for call in c.message.tool_calls:
            check_call(call)
    ids = [call.id for c in choices for call in c.message.tool_calls]
    assert len(set(ids)) == len(ids), ids


def test_named_function_and_no_parallel_calls(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named,
                                       temperature=0, max_tokens=60)
    c = r.choices[0]
    assert c.finish_reason == "stop", c  # as OpenAI ends a forced function
    assert [t.function.name for t in c.message.tool_calls] == ["get_time"]
    check_call(c.message.tool_calls[0])
    for seed in range(4):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                           tool_choice="required", parallel_tool_calls=False,
                                           temperature=1.0, seed=seed, max_tokens=120)
        assert len(r.choices[0].message.tool_calls) == 1, r


def reassemble(chunks):
    """What a client rebuilds from `delta.tool_calls`: each call's id, name and arguments."""
    calls, content, finish = {}, "", None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                if d.function:
                    call["name"] += d.function.name or ""
                    call["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], content, finish


def as_dicts(tool_calls):
    return [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
            for t in tool_calls or []]


# `auto` reads what the model writes. SmolLM2-135M rarely calls a tool of its own accord, so
# the tests make it write one in Hermes's format with a regex, then check what is read back.
HERMES_CALL = (r'<tool_call>\n\{"name": "get_weather", "arguments": '
               r'\{"city": "(Paris|Rome)", "unit": "(celsius|fahrenheit)"\}\}\n</tool_call>')


def test_streamed_tool_call_deltas_reassemble_into_the_non_streamed_call(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    cases = [dict(tool_choice="required"), dict(tool_choice=named),
             dict(tool_choice="auto", extra_body={"guided_regex": HERMES_CALL})]
    for kw in cases:
        kw = dict(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=120, **kw)
        whole = client.chat.completions.create(**kw).choices[0]
        chunks = list(client.chat.completions.create(stream=True, **kw))
        calls, content, finish = reassemble(chunks)
        want = as_dicts(whole.message.tool_calls)
        assert want, whole
        # Ids are per request; names and arguments must match exactly.
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(c["name"], c["arguments"]) for c in want], (kw, calls, want)
        assert all(c["id"] for c in calls)
        assert finish == whole.finish_reason
        assert (content or None) == whole.message.content
        # Arguments arrive over several chunks, not in one piece at the end.
        pieces = [d for ch in chunks for c in ch.choices for d in c.delta.tool_calls or []]
        assert len(pieces) > 2, pieces


def test_auto_reads_calls_and_leaves_prose_as_content(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0,
                                       max_tokens=120, extra_body={"guided_regex": HERMES_CALL})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None, c
    assert json.loads(c.message.tool_calls[0].function.arguments)["city"] in ("Paris", "Rome")
    prose = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                           temperature=0, max_tokens=8,
                                           extra_body={"guided_regex": "It is sunny[.]"})
    assert prose.choices[0].message.content == "It is sunny."
    assert not prose.choices[0].message.tool_calls
    assert prose.choices[0].finish_reason == "stop"


def test_parse_with_a_pydantic_tool(client):
    r = client.chat.completions.parse(model=MODEL, messages=ASK, tools=TOOLS,
                                      tool_choice="required", temperature=0, max_tokens=120)
    call = r.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, MODELS[call.function.name]), call


def test_calls_and_results_round_trip_in_messages(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                       tool_choice="required", temperature=0, max_tokens=120)
    msg = r.choices[0].message
    # The assistant message goes back as the client returned it, then each call's result.
    history = ASK + [msg] + [{"role": "tool", "tool_call_id": t.id, "content": "18 C, sunny"}
                             for t in msg.tool_calls]
    again = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=16)
    assert again.choices[0].message.content and not again.choices[0].message.tool_calls
    # `none` keeps the tools out of the prompt; the call and its result are in it.
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    assert again.usage.prompt_tokens > plain.usage.prompt_tokens + 20


def test_bad_tool_requests_are_400_naming_the_field(client):
    chat = client.chat.completions.create
    expect(openai.BadRequestError, 400, lambda: chat(
        model=MODEL, messages=ASK, max_tokens=4, tool_choice="required"), "tool_choice")
    expect(openai.BadRequestError, 400, lambda: chat(
        model=MODEL, messages=ASK, max_tokens=4, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice")
    expect(openai.BadRequestError, 400, lambda: chat(
        model=MODEL, messages=ASK, max_tokens=4, tools=TOOLS, tool_choice="required",
        response_format={"type": "json_object"}), "tool_choice")
    bad_tool = [{"type": "retrieval", "function": {"name": "f"}}]
    expect(openai.BadRequestError, 400, lambda: chat(
        model=MODEL, messages=ASK, max_tokens=4, tools=bad_tool), "tools[0].type")
    history = ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{oops"}}]}]
    expect(openai.BadRequestError, 400, lambda: chat(
        model=MODEL, messages=history, max_tokens=4),
        "messages[1].tool_calls[0].function.arguments")


# LangChain's `bind_tools(tool_choice="name")` and openai-node's `runTools` send schemas
# without `additionalProperties: false`; as vLLM's default grammar does, infer allows no
# property a schema does not list, so a small model cannot ramble into invented keys.
LOOSE = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}]


def test_named_calls_with_the_clients_default_schemas_parse(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=LOOSE,
                                       tool_choice=named, temperature=0, max_tokens=80)
    c = r.choices[0]
    assert c.message.tool_calls, c
    args = json.loads(c.message.tool_calls[0].function.arguments)
    assert set(args) == {"city", "unit"}, args

"""`/v1/responses` through the official client (`responses.create`, JSON and streamed): the
same text and token counts as a chat completion of the same messages (`instructions` as the
system message), streamed events that rebuild the response, a forced function call and its
output sent back as input items, and the stateless server's limits refused by name."""

import json

import openai

from conftest import MODEL
from test_errors import expect

ASK = "What is the capital of France?"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city.",
          "parameters": {"type": "object", "required": ["city"],
                         "properties": {"city": {"type": "string", "maxLength": 20}}}}]


def test_a_response_is_the_chat_reply(client):
    r = client.responses.create(model=MODEL, input=ASK, instructions="Answer briefly.",
                                max_output_tokens=12, temperature=0)
    c = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=12,
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": ASK}])
    assert r.output_text == c.choices[0].message.content
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == ("incomplete" if c.choices[0].finish_reason == "length" else "completed")
    assert r.usage.input_tokens == c.usage.prompt_tokens
    assert r.usage.output_tokens == c.usage.completion_tokens


def test_streamed_events_rebuild_the_response(client):
    kinds, text, final = [], "", None
    for event in client.responses.create(model=MODEL, input=ASK, max_output_tokens=12,
                                         temperature=0, stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert "response.output_item.added" in kinds and "response.output_item.done" in kinds
    assert final is not None and final.output_text == text
    whole = client.responses.create(model=MODEL, input=ASK, max_output_tokens=12, temperature=0)
    assert whole.output_text == text


def test_a_forced_function_call_and_its_output_round_trip(client):
    r = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"},
                                max_output_tokens=60, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather", r.output
    assert set(json.loads(calls[0].arguments)) == {"city"}
    call = calls[0]
    again = client.responses.create(
        model=MODEL, tools=TOOLS, max_output_tokens=8, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "Sunny, 21 C"}])
    assert again.status in ("completed", "incomplete")


def test_a_streamed_function_call_arrives_as_argument_deltas(client):
    events = list(client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60,
        temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e for e in events if e.type == "response.output_item.added"
             and e.item.type == "function_call"]
    assert len(added) == 1 and added[0].item.name == "get_weather", kinds
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    # Streamed as the model writes them: several pieces, each after the item was added.
    assert len(deltas) > 1, kinds
    assert kinds.index("response.output_item.added") < kinds.index(
        "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "".join(d.delta for d in deltas) == done.arguments
    assert set(json.loads(done.arguments)) == {"city"}
    final = events[-1].response
    call = next(o for o in final.output if o.type == "function_call")
    assert call.arguments == done.arguments and call.id == added[0].item.id
    whole = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60,
        temperature=0)
    assert next(o for o in whole.output if o.type == "function_call").arguments == call.arguments


def test_what_a_stateless_server_cannot_do_is_refused_by_name(client):
    expect(openai.BadRequestError, 400, lambda: client.responses.create(
        model=MODEL, input=ASK, previous_response_id="resp_1"), "previous_response_id")
    expect(openai.BadRequestError, 400, lambda: client.responses.create(
        model=MODEL, input=ASK, store=True), "store")
    expect(openai.BadRequestError, 400, lambda: client.responses.create(
        model=MODEL, input=ASK, tools=[{"type": "web_search"}]), "tools[0].type")

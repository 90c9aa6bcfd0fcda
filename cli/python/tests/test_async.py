"""`AsyncLLM`: concurrent streams, output kinds, abort and cancellation, the OpenAI routes."""

import asyncio
import json

import pytest
from conftest import ENGINE, MODEL

from infer import AsyncLLM, RequestOutputKind, SamplingParams

PROMPTS = [f"Story {i}: once upon a time, a {w}" for i, w in enumerate(
    ["cat", "dog", "king", "robot", "tree", "ship", "bird", "child", "wizard", "river", "star", "farmer",
     "queen", "fox", "storm", "city"])]


@pytest.fixture(scope="module")
def engine():
    e = AsyncLLM(MODEL, **ENGINE)
    yield e
    e.shutdown()


async def final(engine, prompt, params, request_id):
    last = None
    async for out in engine.generate(prompt, params, request_id):
        last = out
    return last


def test_sixteen_concurrent_streams_equal_their_solo_runs(engine):
    # Seeded sampling and the chosen tokens' logprobs, bit for bit: the CPU backend's results
    # do not depend on the batch, how a prompt was chunked, or the step pacing under load.
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=16, logprobs=0) for i in range(16)]

    async def run():
        solo = [await final(engine, p, sp, f"solo-{i}") for i, (p, sp) in enumerate(zip(PROMPTS, params))]
        together = await asyncio.gather(*[final(engine, p, sp, f"many-{i}")
                                          for i, (p, sp) in enumerate(zip(PROMPTS, params))])
        return solo, together

    solo, together = asyncio.run(run())
    for a, b in zip(solo, together):
        assert a.finished and b.finished
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
        chosen = [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in (a, b)]
        assert chosen[0] == chosen[1]


def test_output_kinds(engine):
    async def collect(kind):
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, output_kind=kind)
        return [o async for o in engine.generate("The capital of France is", params, f"kind-{kind.name}")]

    cumulative = asyncio.run(collect(RequestOutputKind.CUMULATIVE))
    delta = asyncio.run(collect(RequestOutputKind.DELTA))
    final_only = asyncio.run(collect(RequestOutputKind.FINAL_ONLY))
    full = cumulative[-1].outputs[0]
    assert len(final_only) == 1 and final_only[0].outputs[0].token_ids == full.token_ids
    assert len(cumulative) > 1 and all(not o.finished for o in cumulative[:-1])
    lengths = [len(o.outputs[0].token_ids) for o in cumulative]
    assert lengths == sorted(lengths)
    assert "".join(o.outputs[0].text for o in delta) == full.text
    assert sum((o.outputs[0].token_ids for o in delta), []) == full.token_ids


def test_cancelling_the_consumer_frees_its_blocks_within_a_step(engine):
    async def run():
        params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        started = asyncio.Event()

        async def consume():
            async for out in engine.generate("Count: 1, 2, 3,", params, "to-cancel"):
                if len(out.outputs[0].token_ids) >= 3:
                    started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        busy = await engine.get_stats()
        assert busy["num_running"] == 1 and busy["kv_usage"] > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        at_cancel = busy["steps"]
        for _ in range(200):
            stats = await engine.get_stats()
            if stats["num_running"] == 0:
                return at_cancel, stats
            await asyncio.sleep(0.005)
        raise AssertionError(f"still running: {stats}")

    at_cancel, stats = asyncio.run(run())
    assert stats["num_waiting"] == 0
    # The request was dropped at the next loop iteration: a step or two after it was seen
    # running (the consumer's reads lag the engine by the outputs in flight).
    assert stats["steps"] - at_cancel <= 4, stats


def test_abort_ends_the_stream(engine):
    async def run():
        params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        seen = []
        async for out in engine.generate("Count: 1, 2, 3,", params, "to-abort"):
            seen.append(out)
            if len(seen) == 2:
                await engine.abort("to-abort")
        return seen

    seen = asyncio.run(run())
    assert 2 <= len(seen) < 400 and not seen[-1].finished


def test_openai_routes_answer_as_the_server(engine):
    async def run():
        body = json.dumps({"prompt": "Hi", "max_tokens": 4, "temperature": 0, "stream": True}).encode()
        reply = await engine.openai("POST", "/v1/completions", body, [("content-type", "application/json")])
        chunks = [c async for c in reply]
        bad = await engine.openai("POST", "/v1/completions", json.dumps({"prompt": "Hi", "top_p": 0}).encode())
        models = await engine.openai("GET", "/v1/models")
        return reply, b"".join(chunks), bad, await bad.body(), json.loads(await models.body())

    reply, sse, bad, bad_body, models = asyncio.run(run())
    assert reply.status == 200 and reply.header("content-type").startswith("text/event-stream")
    events = [line[6:] for line in sse.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])
    assert len(text) > 0
    assert bad.status == 400 and json.loads(bad_body)["error"]["param"] == "top_p"
    assert models["data"][0]["id"] == engine.model_name


def test_from_engine_args_and_what_it_refuses():
    from infer import AsyncEngineArgs

    args = AsyncEngineArgs(MODEL, **ENGINE)
    for bad, message in [({"start_engine_loop": False}, "start_engine_loop"),
                         ({"stat_loggers": [object()]}, "stat_loggers"), ({"log_requests": True}, "log_requests")]:
        with pytest.raises((TypeError, ValueError), match=message):
            AsyncLLM.from_engine_args(args, **bad)
    engine = AsyncLLM.from_engine_args(args, usage_context="ENGINE_CONTEXT")
    try:
        assert engine.max_model_len == ENGINE["max_model_len"]
        greedy = SamplingParams(temperature=0, max_tokens=4, output_kind=RequestOutputKind.FINAL_ONLY)
        out = asyncio.run(final(engine, "The capital of France is", greedy, "from-args"))
        assert out.finished and len(out.outputs[0].token_ids) == 4
    finally:
        engine.shutdown()

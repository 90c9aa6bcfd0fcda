"""Ray: two Serve replicas behind one HTTP entry (the official openai client against them, load
spread over both, a dead engine's replica replaced while the other answers), and Ray Data
through two engine actors. One local cluster (`ray start --head`) for the module."""

import concurrent.futures
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest
from conftest import ENGINE, MODEL

# A cluster on loopback: without this Ray advertises (and its driver dials) the host's routable
# address. Ray reads it when imported, so it is set first.
os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

from infer import SamplingParams  # noqa: E402

# The openai client suite's server settings (tests/openai_client/conftest.py).
KEY = "test-key"
REPLICA = dict(ENGINE, threads=1, served_model_name="smol", api_key=KEY, metrics_prefix="vllm")
SUITE = pathlib.Path(__file__).resolve().parents[3] / "tests" / "openai_client"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    ray_bin = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    port = free_port()
    subprocess.run([ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=6",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True, stdout=subprocess.DEVNULL)
    try:
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        subprocess.run([ray_bin, "stop", "--force"], stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def app(cluster):
    from ray import serve

    from infer.ray.serve import build_openai_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_openai_app({"model": MODEL, "engine_kwargs": REPLICA,
                                "deployment_config": {"num_replicas": 2, "health_check_period_s": 1}}),
              name="infer", route_prefix="/")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def replica(raw) -> str:
    return raw.headers.get("x-infer-replica")


def test_openai_client_json_sse_tools(app, llm):
    c = client(app)
    assert [m.id for m in c.models.list().data] == ["smol"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = c.chat.completions.create(model="smol", messages=messages, temperature=0, max_tokens=12)
    (local,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert chat.choices[0].message.content == local.outputs[0].text
    stream = c.completions.create(model="smol", prompt="The capital of France is", temperature=0, max_tokens=8,
                                  stream=True)
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    (greedy,) = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert text == greedy.outputs[0].text
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    called = c.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                       tools=tools, tool_choice={"type": "function", "function": {
                                           "name": "get_weather"}}, max_tokens=40, temperature=0)
    call = called.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in call.function.arguments
    with pytest.raises(openai.BadRequestError, match="top_p"):
        c.completions.create(model="smol", prompt="Hi", top_p=0)


def test_the_openai_client_suite_through_two_replicas(app):
    """The official client's suite (chat, completions, tools, structured outputs, Responses)
    against the Serve entry, as it runs against `infer serve`."""
    files = ["test_chat.py", "test_completions.py", "test_tools.py", "test_structured.py", "test_responses.py"]
    # Per-replica state: each replica has its own prefix cache and /metrics, so a repeated
    # prompt is cached only when the same replica takes it.
    deselect = ["test_structured.py::test_vllm_metric_names_and_cached_tokens",
                "test_structured.py::test_cache_salt_partitions_the_prefix_cache"]
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    for d in deselect:
        args += ["--deselect", d]
    run = subprocess.run(args, cwd=SUITE, env=dict(os.environ, INFER_URL=app), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_load_is_spread_over_both_replicas(app):
    c = client(app)

    def one(i):
        raw = c.completions.with_raw_response.create(model="smol", prompt=f"Number {i}:", max_tokens=8,
                                                     temperature=0)
        return replica(raw)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        replicas = list(pool.map(one, range(32)))
    assert None not in replicas
    counts = {r: replicas.count(r) for r in set(replicas)}
    assert len(counts) == 2, counts


def test_a_dead_engine_is_replaced_while_the_other_answers(app):
    from ray import serve

    c = client(app)
    handle = serve.get_app_handle("infer")
    dead = str(handle.shutdown_engine.remote().result())
    answered, failures, replaced = set(), 0, None
    deadline = time.time() + 90
    while time.time() < deadline and replaced is None:
        try:
            raw = c.completions.with_raw_response.create(model="smol", prompt="Hi", max_tokens=2)
            who = replica(raw)
            assert who != dead, "the replica whose engine stopped answered"
            answered.add(who)
        except (openai.APIStatusError, openai.APIConnectionError):
            failures += 1
        status = serve.status().applications["infer"].deployments["InferServer"]
        live = status.replica_states.get("RUNNING", 0)
        if live == 2 and len(answered) == 2:
            replaced = answered
        time.sleep(0.2)
    assert replaced is not None, f"no replacement within 90 s; answered by {answered}, {failures} failures"
    assert dead not in replaced


def test_ray_data_rows_equal_llm_generate(cluster, llm):
    import ray.data

    from infer.ray.data import InferProcessorConfig, build_llm_processor

    prompts = [f"Fact {i}: the number {i} is" for i in range(64)]
    config = InferProcessorConfig(model_source=MODEL, engine_kwargs=dict(ENGINE, threads=1), concurrency=2,
                                  batch_size=8)
    processor = build_llm_processor(
        config,
        preprocess=lambda row: {"id": row["id"], "prompt": row["text"],
                                "sampling_params": {"temperature": 0, "max_tokens": 6}},
        postprocess=lambda row: {"id": row["id"], "answer": row["generated_text"],
                                 "tokens": row["num_generated_tokens"]})
    ds = processor(ray.data.from_items([{"id": i, "text": p} for i, p in enumerate(prompts)]))
    rows = sorted(ds.take_all(), key=lambda r: r["id"])
    expected = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    assert [r["answer"] for r in rows] == [o.outputs[0].text for o in expected]
    assert all(r["tokens"] == len(o.outputs[0].token_ids) for r, o in zip(rows, expected))

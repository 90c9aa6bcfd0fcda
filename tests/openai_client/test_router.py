"""Two `infer serve` replicas behind sglang-router (round robin) on loopback: requests spread
over both, each answers correctly, and with one replica stopped the router keeps serving from
the other. Also the worker endpoints the router reads at registration."""

import os
import re
import socket
import subprocess
import sys
import time

import json
import urllib.error
import urllib.request
import openai
import pytest

from conftest import ROOT, binary

MODEL = "smol"


def http_get(url: str, timeout=5):
    """(status, body) of a GET; (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def get_json(url: str):
    status, body = http_get(url)
    assert status == 200, (url, status, body)
    return json.loads(body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, what: str, path: str = "/health", timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if http_get(url + path, timeout=2)[0] == 200:
            return
        time.sleep(0.3)
    raise RuntimeError(f"{what} not ready after {timeout} s")


def served_requests(url: str) -> int:
    text = http_get(url + "/metrics")[1]
    return sum(
        int(float(m.group(1)))
        for m in re.finditer(r'^vllm:request_success_total\{[^}]*\} (\S+)$', text, re.M)
    )


@pytest.fixture(scope="module")
def replicas():
    model = os.environ.get("INFER_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    procs, urls = [], []
    for _ in range(2):
        port = free_port()
        args = [binary(), "serve", "--model", model, "--port", str(port), "--served-model-name",
                MODEL, "--max-model-len", "512", "--num-kv-blocks", "128", "--threads", "1",
                "--metrics-prefix", "vllm"]
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      env=dict(os.environ, HF_HUB_OFFLINE="1")))
        urls.append(f"http://127.0.0.1:{port}")
    for url, p in zip(urls, procs):
        wait_ready(url, p, "infer serve")
    yield urls, procs
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def router(replicas):
    urls, _ = replicas
    port = free_port()
    args = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", str(port), "--policy", "round_robin", "--worker-urls", *urls,
            "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
            "--prometheus-port", str(free_port())]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, "sglang-router", path="/v1/models")
    # Registration runs in the background: wait until both workers are routable.
    deadline = time.time() + 60
    while time.time() < deadline:
        status, workers = http_get(url + "/workers")
        if status == 200 and workers.count("127.0.0.1") >= 2:
            break
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def ask(client: openai.OpenAI) -> str:
    r = client.completions.create(model=MODEL, prompt="The capital of France is",
                                  max_tokens=4, temperature=0)
    return r.choices[0].text


def test_worker_endpoints_the_router_reads(replicas):
    url = replicas[0][0]
    info = get_json(url + "/server_info")
    assert info["served_model_name"] == MODEL and info["dp_size"] == 1
    assert info["context_length"] == 512
    assert get_json(url + "/get_server_info")["model_path"] == MODEL
    model = get_json(url + "/model_info")
    assert model["is_generation"] is True and model["model_path"] == MODEL
    load = get_json(url + "/get_load")
    assert load[0]["num_reqs"] == 0 and load[0]["num_waiting_reqs"] == 0
    metrics = http_get(url + "/metrics")[1]
    for name in ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"]:
        assert name in metrics
    # The Kubernetes inference gateway reads the KV block size (prefix-aware routing) from here.
    assert re.search(r'^vllm:cache_config_info\{block_size="16",[^}]*num_gpu_blocks="\d+"[^}]*\} 1$',
                     metrics, re.M), metrics


def test_requests_spread_over_both_replicas_and_survive_one_stopping(replicas, router):
    urls, procs = replicas
    client = openai.OpenAI(base_url=f"{router}/v1", api_key="none", max_retries=0, timeout=60)
    before = [served_requests(u) for u in urls]
    for _ in range(8):
        assert ask(client) == " Paris.\n\n"
    served = [served_requests(u) - b for u, b in zip(urls, before)]
    assert sum(served) == 8 and min(served) >= 2, served
    # Chat goes through too (the router adds SGLang's default fields to what it forwards).
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12, temperature=0)
    assert "Paris" in chat.choices[0].message.content

    procs[0].terminate()
    procs[0].wait(timeout=30)
    # The router notices within a health-check interval; then every request goes to the other.
    deadline, ok_in_a_row = time.time() + 30, 0
    while ok_in_a_row < 6:
        assert time.time() < deadline, "the router did not recover from a stopped replica"
        try:
            assert ask(client) == " Paris.\n\n"
            ok_in_a_row += 1
        except openai.APIError:
            ok_in_a_row = 0
            time.sleep(0.5)

"""Starts `infer serve` on SmolLM2 (CPU backend, a free port, an API key) once per session and
hands tests an official `openai` client pointed at it."""

import os
import pathlib
import subprocess
import threading

import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEY = "test-key"
MODEL = "smol"
# Small on purpose: the context check (prompt + max_tokens) is tested against it.
MAX_MODEL_LEN = 512


def binary() -> str:
    path = pathlib.Path(os.environ.get("INFER_BIN", ROOT / "target" / "release" / "infer"))
    if not path.exists():
        pytest.exit(f"{path} not found: build it with `cargo build --release --bin infer`", 2)
    return str(path)


@pytest.fixture(scope="session")
def server():
    # INFER_URL: a server started elsewhere with this suite's settings (the Python package's Ray
    # Serve replicas run the suite this way).
    if os.environ.get("INFER_URL"):
        yield os.environ["INFER_URL"]
        return
    model = os.environ.get("INFER_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = [
        binary(), "serve", "--model", model, "--port", "0", "--api-key", KEY,
        "--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
        "--num-kv-blocks", "256", "--max-num-seqs", "16",
        # vLLM's metric names, as dashboards and the inference gateway read them.
        "--metrics-prefix", "vllm",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    # INFER_TP=N: the same suite against a tensor-parallel server (`mpirun -np N ... -tp N`).
    tp = int(os.environ.get("INFER_TP", "1"))
    if tp > 1:
        args = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(tp)] + args
        args += ["-tp", str(tp), "--threads", "1"]
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc, url = start(args, env)
    yield url
    # Under mpirun, rank 0 is the server: its SIGTERM shutdown releases the other ranks, and
    # mpirun exits 0 once all have (mpirun itself exits 1 whenever it is signalled).
    stop = rank0_pid(proc.pid) if tp > 1 else proc.pid
    os.kill(stop, 15)
    assert proc.wait(timeout=30) == 0, "infer serve did not exit cleanly on SIGTERM"


def start(args, env=None):
    """Starts `infer serve` with `args` and returns the process and its URL once it listens
    (the suite stops, with the server's last lines, if it does not start)."""
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env or dict(os.environ, HF_HUB_OFFLINE="1"))
    url, seen = None, []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("infer serve: "):
            url = line.split()[2]
            break
    if url is None:
        proc.kill()
        pytest.exit("infer serve did not start:\n" + "".join(seen[-20:]), 2)
    # Keep draining stderr so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, url


def rank0_pid(launcher: int) -> int:
    with open(f"/proc/{launcher}/task/{launcher}/children") as f:
        for pid in f.read().split():
            with open(f"/proc/{pid}/environ", "rb") as env:
                if b"OMPI_COMM_WORLD_RANK=0" in env.read().split(b"\0"):
                    return int(pid)
    raise RuntimeError("no rank 0 under mpirun")


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)

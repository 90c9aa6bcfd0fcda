"""The Python package against SmolLM2 on the CPU backend: one `LLM` per session, and the
`infer` binary's server and `generate` as the references it must agree with."""

import json
import os
import pathlib
import subprocess
import threading
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODEL = os.environ.get("INFER_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
MAX_MODEL_LEN = 512
# The engine settings every test uses, and the server they are compared with.
ENGINE = {"max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 256, "max_num_seqs": 16}


def binary() -> str:
    path = pathlib.Path(os.environ.get("INFER_BIN", ROOT / "target" / "release" / "infer"))
    if not path.exists():
        pytest.exit(f"{path} not found: build it with `cargo build --release --bin infer`", 2)
    return str(path)


@pytest.fixture(scope="session")
def llm():
    from infer import LLM

    return LLM(model=MODEL, **ENGINE)


@pytest.fixture(scope="session")
def server():
    """`infer serve` with the same settings: the reference for seeded sampling and errors."""
    args = [binary(), "serve", "--model", MODEL, "--port", "0", "--max-model-len", str(MAX_MODEL_LEN),
            "--num-kv-blocks", "256", "--max-num-seqs", "16"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    url, seen = None, []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("infer serve: "):
            url = line.split()[2]
            break
    if url is None:
        proc.kill()
        pytest.exit("infer serve did not start:\n" + "".join(seen[-20:]), 2)
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def post(url: str, path: str, body: dict):
    """(status, JSON reply) of a POST to the server."""
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

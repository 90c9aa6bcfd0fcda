"""The Python package against SmolLM2 on the CPU backend: one `LLM` per session, and the
`infer` binary's server and `generate` as the references it must agree with."""

import importlib.util
import json
import os
import pathlib
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODEL = os.environ.get("INFER_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
MAX_MODEL_LEN = 512
# The engine settings every test uses, and the server they are compared with.
ENGINE = {"max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 256, "max_num_seqs": 16}


def binary() -> str:
    """The `infer` binary (`INFER_BIN`), as the openai client suite finds it."""
    return _suite().binary()


@pytest.fixture(scope="session")
def llm():
    from infer import LLM

    return LLM(model=MODEL, **ENGINE)


def _suite():
    """The openai client suite's helpers (`start`, `binary`): one way to start `infer serve`."""
    spec = importlib.util.spec_from_file_location("openai_suite", ROOT / "tests" / "openai_client" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def server():
    """`infer serve` with the same settings: the reference for seeded sampling and errors."""
    suite = _suite()
    proc, url = suite.start([binary(), "serve", "--model", MODEL, "--port", "0", "--max-model-len",
                             str(MAX_MODEL_LEN), "--num-kv-blocks", "256", "--max-num-seqs", "16"])
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

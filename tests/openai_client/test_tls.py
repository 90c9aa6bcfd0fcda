"""`infer serve --ssl-certfile/--ssl-keyfile` (vLLM's flags) as the official client meets it:
the client trusts a CA file it is given and completes a chat over HTTPS; a client that does not
trust it fails at the handshake. The certificate is made here by the `openssl` command."""

import http.client
import ssl
import subprocess
import urllib.error
import urllib.request

import openai
import pytest

from conftest import KEY, MODEL, ROOT, binary, start


def make_certificate(dir):
    key, cert = dir / "key.pem", dir / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def https_server(tmp_path_factory):
    cert, key = make_certificate(tmp_path_factory.mktemp("tls"))
    args = [
        binary(), "serve", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"), "--port", "0",
        "--api-key", KEY, "--served-model-name", MODEL, "--max-model-len", "512",
        "--num-kv-blocks", "64", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
    ]
    proc, url = start(args)
    yield url, cert
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_chat_over_https(https_server):
    url, cert = https_server
    assert url.startswith("https://")
    # The printed address is an IP; the certificate names 127.0.0.1 too.
    trust = ssl.create_default_context(cafile=str(cert))
    with openai.DefaultHttpxClient(verify=trust) as http:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, http_client=http,
                               max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4,
            temperature=0)
        assert reply.usage.completion_tokens == 4
        assert reply.choices[0].message.content
        stream = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, stream=True)
        assert len([c for c in stream if c.choices and c.choices[0].text]) >= 1


def test_untrusted_certificate_fails_at_the_handshake(https_server):
    url, _ = https_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


def test_plain_http_client_gets_no_reply(https_server):
    url, _ = https_server
    plain = url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        urllib.request.urlopen(f"{plain}/health", timeout=30)


def test_bad_key_file_stops_the_start(tmp_path):
    cert, _ = make_certificate(tmp_path)
    (tmp_path / "bad.pem").write_text("not a key")
    proc = subprocess.run(
        [binary(), "serve", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
         "--ssl-certfile", str(cert), "--ssl-keyfile", str(tmp_path / "bad.pem")],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "bad.pem" in proc.stderr and "private key" in proc.stderr, proc.stderr

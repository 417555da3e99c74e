"""The project's own vLLM servers answer its own clients whatever the environment holds: VLLM_API_KEY exported
(vLLM would turn on its key check from it, and no client here sends one) and an http_proxy that points nowhere
(urllib would send requests for 127.0.0.1 to it). And a regen run against an endpoint with a key writes the key
nowhere: not in its files, not on its terminal.

The fast tests run the fake vLLM of tests/fake_vllm.py; the one marked `serve` starts the real vLLM of
.venv-serve once (~25 s on CPU) and queries it with every client of the project's own servers: the health wait,
regen's endpoint checks and backend (capture's VllmRows sends through the same post_json), and serve's client.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON
from blockdraft.vllm_runtime.server import VllmServer
from tests.fake_vllm import recorded_fake_python

KEY = "sk-own-servers-0123456789-secret"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def hostile_env(monkeypatch):
    """VLLM_API_KEY exported and every proxy variable pointing at a closed port, no no_proxy."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    # urlopen's cached opener read the proxies when first built: a fresh one, as a process started with them has.
    monkeypatch.setattr(urllib.request, "_opener", None)
    proxy = f"http://127.0.0.1:{closed_port()}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    yield from recorded_fake_python(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    # head_dim 32: vLLM's CPU attention has no kernel for the default tiny target's 16.
    return save_tiny_target(tmp_path_factory.mktemp("own-servers") / "target", hidden_size=128)


def regen_settings(target, out, fake, **overrides):
    from blockdraft.regen.config import RegenConfig

    base = dict(target_dir=str(target), out=str(out), prompts="tiny_prompts", num_train=8, num_heldout=0, max_tokens=4,
                backend="vllm", vllm_python=str(fake), workers=2, shard_size=8, progress=False, startup_timeout_s=30,
                retry_backoff_s=0.01)
    return RegenConfig(**{**base, **overrides})


def test_a_server_regen_starts_is_reached_past_a_proxy_and_gets_no_api_key(target, fake, tmp_path, hostile_env):
    from blockdraft.regen.app import run_regen

    with VllmServer(fake, "/models/tiny", log_path=tmp_path / "server.log", startup_timeout_s=30) as server:
        environ = Path(f"/proc/{server.process.pid}/environ")
        if environ.exists():
            assert b"VLLM_API_KEY=" not in environ.read_bytes()
    # Started by regen: health-waited, checked (/v1/models) and asked, all on loopback past the proxy.
    out = run_regen(regen_settings(target, tmp_path / "regen", fake, servers=1))
    assert len((out / "train.jsonl").read_text().splitlines()) == 8


def test_a_keyed_endpoint_run_writes_the_key_nowhere(target, fake, tmp_path, monkeypatch, capfd):
    from blockdraft.regen.app import run_regen

    monkeypatch.setenv("BD_ENDPOINT_KEY", KEY)
    with VllmServer(fake, "/models/tiny", log_path=tmp_path / "endpoint.log", startup_timeout_s=30,
                    args=["--served-model-name", "tiny-served", "--max-model-len", "1024"]) as endpoint:
        out = run_regen(regen_settings(target, tmp_path / "regen", fake, servers=0, endpoints=[endpoint.url],
                                       endpoint_api_key_env="BD_ENDPOINT_KEY"))
    assert len((out / "train.jsonl").read_text().splitlines()) == 8
    written = [p for p in Path(out).rglob("*") if p.is_file()]
    assert written and not [p for p in written if KEY.encode() in p.read_bytes()]
    said = capfd.readouterr()
    assert KEY not in said.out and KEY not in said.err


needs_vllm = pytest.mark.skipif(not DEFAULT_VLLM_PYTHON.is_file(),
                                reason=f"no serving env at {DEFAULT_VLLM_PYTHON}; run `make setup-serve`")


@pytest.mark.slow  # make test-slow: the fake-server test above catches the same faults (the key inherited, a proxy
@pytest.mark.serve  # taken for loopback) in make test; this one proves real vLLM would have answered 401 otherwise
@needs_vllm
def test_real_vllm_started_here_answers_every_own_client_despite_vllm_api_key_and_a_proxy(target, tmp_path, hostile_env):
    from transformers import AutoTokenizer

    from blockdraft.regen.endpoints import check_endpoint, still_answers
    from blockdraft.regen.vllm_backend import vllm_reply
    from blockdraft.serve.client import complete, read_spec_metrics
    from blockdraft.serve.prompts import EncodedPrompt

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    args = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "2"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    with VllmServer(DEFAULT_VLLM_PYTHON, str(target), log_path=tmp_path / "vllm.log", args=args, env=env,
                    startup_timeout_s=300) as server:  # health-waited through the proxy-free opener
        check = check_endpoint(server.url, None, tokenizer, None, 64, {})  # /v1/models and /tokenize, no 401
        assert check.tokenizer_checked and still_answers(server.url, {})
        reply = vllm_reply(server.url, check.model, tokenizer, max_tokens=4, max_prompt_tokens=128, timeout_s=120)
        assert reply([{"role": "user", "content": "hello"}]).tokens > 0
        done = complete(server.url, check.model, EncodedPrompt(0, "test", [1, 2, 3]), 4, 120)
        assert len(done.token_ids) > 0
        read_spec_metrics(server.url, 30)  # /metrics read (no drafts: zeros)

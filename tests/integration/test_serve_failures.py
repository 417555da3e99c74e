"""The server is stopped in every outcome and leaves no process behind.

The first tests stand a small fake in for vLLM (same command line, a child process, a
/health route), so start, stop, timeout, crash, Ctrl-C and port retries are checked in
seconds anywhere. Those marked `serve` run the real vLLM of .venv-serve.
"""

import json
import os
import socket
from pathlib import Path

import pytest

from blockdraft.errors import ConfigError
from blockdraft.vllm_runtime import server as server_module
from blockdraft.serve.config import DEFAULT_VLLM_PYTHON, ServeConfig
from blockdraft.vllm_runtime.server import ServerError, ServerStartTimeout, VllmServer, group_members
from tests.fake_vllm import started_pids, write_fake_python

psutil = pytest.importorskip("psutil")

needs_vllm = pytest.mark.skipif(
    not DEFAULT_VLLM_PYTHON.is_file(), reason=f"no serving env at {DEFAULT_VLLM_PYTHON}; run `make setup-serve`"
)

@pytest.fixture
def fake_vllm(tmp_path):
    return write_fake_python(tmp_path / "fake_python")


def fake_server(script, tmp_path, mode, **kwargs):
    env = {"FAKE_MODE": mode, "FAKE_DIR": str(tmp_path)}
    return VllmServer(script, "tiny", log_path=tmp_path / "server.log", env=env, **kwargs)


def assert_nothing_left(server_pid_group, tmp_path):
    assert group_members(server_pid_group) == []
    for pid in started_pids(tmp_path):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE] == []


def test_a_healthy_server_is_stopped_with_its_children(fake_vllm, tmp_path):
    with fake_server(fake_vllm, tmp_path, "serve", startup_timeout_s=30) as server:
        group = server.process.pid
        assert server.startup_s is not None and server.startup_s < 30
        assert server.url.startswith("http://127.0.0.1:") and group_members(group)
    assert_nothing_left(group, tmp_path)


def test_a_server_that_exits_shows_its_log_tail(fake_vllm, tmp_path):
    with pytest.raises(ServerError, match=r"(?s)exited with code 3.*cannot load the model"):
        with fake_server(fake_vllm, tmp_path, "crash", startup_timeout_s=30):
            pass
    assert_nothing_left(-1, tmp_path)


def test_a_start_up_timeout_stops_everything(fake_vllm, tmp_path):
    with pytest.raises(ServerStartTimeout, match="startup_timeout_s=1.5"):
        with fake_server(fake_vllm, tmp_path, "hang", startup_timeout_s=1.5):
            pass
    assert started_pids(tmp_path)
    assert_nothing_left(-1, tmp_path)


def test_a_server_ignoring_sigterm_is_killed_after_the_grace_period(fake_vllm, tmp_path):
    server = fake_server(fake_vllm, tmp_path, "stubborn", startup_timeout_s=1.5, grace_s=1.0)
    with pytest.raises(ServerStartTimeout):
        server.start()
    assert_nothing_left(-1, tmp_path)


def test_ctrl_c_inside_the_block_stops_the_server(fake_vllm, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with fake_server(fake_vllm, tmp_path, "serve", startup_timeout_s=30) as server:
            group = server.process.pid
            raise KeyboardInterrupt
    assert_nothing_left(group, tmp_path)


def test_a_taken_port_is_retried_on_another(fake_vllm, tmp_path, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], server_module.free_port()])
        monkeypatch.setattr(server_module, "free_port", lambda: next(ports))
        with fake_server(fake_vllm, tmp_path, "serve", startup_timeout_s=30) as server:
            assert server.port != taken.getsockname()[1]
            group = server.process.pid
    assert "Address already in use" in (tmp_path / "server.log").read_text()
    assert_nothing_left(group, tmp_path)


# --- the real vLLM --------------------------------------------------------------------
CPU_ARGS = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "2"]
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def served_target(tmp_path_factory):
    from blockdraft.models.tiny_target import save_tiny_target

    # head_dim 32: vLLM's CPU attention has no kernel for the default tiny target's 16.
    return save_tiny_target(tmp_path_factory.mktemp("serve") / "target", hidden_size=128)


# Slow (make test-slow): make test checks the log tail of a vLLM that dies on a stand-in server
# (tests/faults/test_serving_faults.py).
@pytest.mark.slow
@pytest.mark.serve
@needs_vllm
def test_vllm_with_a_bad_target_path_ends_with_its_log_tail(tmp_path):
    missing = str(tmp_path / "no-such-target")
    server = VllmServer(DEFAULT_VLLM_PYTHON, missing, log_path=tmp_path / "vllm.log", args=CPU_ARGS,
                        env=CPU_ENV, startup_timeout_s=300)
    with pytest.raises(ServerError, match=r"(?s)exited with code \d+ before it was ready.*last lines.*no-such-target"):
        server.start()
    assert server.process is None
    assert_nothing_left(-1, tmp_path)


@pytest.mark.serve
@needs_vllm
def test_vllm_start_up_timeout_ends_cleanly(tmp_path, served_target):
    server = VllmServer(DEFAULT_VLLM_PYTHON, str(served_target), log_path=tmp_path / "vllm.log", args=CPU_ARGS,
                        env=CPU_ENV, startup_timeout_s=1)  # vLLM imports for longer: it is stopped mid-start
    with pytest.raises(ServerStartTimeout, match=r"did not answer .*/health within startup_timeout_s=1"):
        server.start()
    assert_nothing_left(-1, tmp_path)


@pytest.mark.serve
@needs_vllm
def test_a_mismatching_draft_is_refused_before_launch(tmp_path, served_target):
    from blockdraft.serve.harness import run

    draft = tmp_path / "draft"
    draft.mkdir()
    config = json.loads((served_target / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 128,
        "num_attention_heads": 4, "head_dim": 32, "vocab_size": config["vocab_size"] + 8,
        "dflash_config": {"mask_token_id": 262, "target_layer_ids": [1, 3], "block_size": 4},
    }))
    out = tmp_path / "out"
    cfg = ServeConfig(draft_dir=str(draft), target_dir=str(served_target), out=str(out))
    with pytest.raises(ConfigError, match="vocab_size=276 but the target has 268"):
        run(cfg)
    assert not out.exists()  # no server log, no report: nothing was launched
    assert_nothing_left(-1, tmp_path)


def test_group_members_reads_this_process_group():
    assert os.getpid() in group_members(os.getpgid(0)) or not Path("/proc").is_dir()

"""A frozen server (SIGSTOP of its process group while the other of a pair is measured) is always
continued or stopped: on a normal stop, an exception, Ctrl-C, and when its owner is SIGKILLed."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from blockdraft.vllm_runtime.server import VllmServer, group_members, group_states as states
from tests.fake_vllm import write_fake_python


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BUSY", "1")  # its child spins: a frozen one must take no CPU
    return write_fake_python(tmp_path / "fake_python")


def start(fake, tmp_path) -> VllmServer:
    return VllmServer(fake, "model", log_path=tmp_path / "server.log", startup_timeout_s=30, grace_s=5)


def test_a_frozen_server_takes_no_cpu_and_runs_again_when_thawed(fake, tmp_path):
    with start(fake, tmp_path) as server:
        group = server.process.pid
        server.freeze()
        assert server.frozen and set(states(group)) == {"T"}
        before = server.cpu_seconds()
        time.sleep(0.5)
        assert server.cpu_seconds() == before
        server.thaw()
        time.sleep(0.5)
        assert not server.frozen and "T" not in states(group) and server.cpu_seconds() > before
    assert group_members(group) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_server_frozen_when_the_run_fails_or_is_interrupted_is_stopped(fake, tmp_path, error):
    with pytest.raises(error):
        with start(fake, tmp_path) as server:
            group = server.process.pid
            server.freeze()
            raise error("the run stops here")
    assert group_members(group) == []  # continued, so it acted on the SIGTERM: nothing left, stopped or not


def test_a_server_frozen_when_its_owner_is_killed_is_not_left_stopped(fake, tmp_path):
    # The owner dies at once (SIGKILL: no clean-up runs); the freeze guard continues the group, which then
    # acts on the parent-death SIGTERM that was pending while it was stopped.
    owner = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path.cwd())!r})
        from blockdraft.vllm_runtime.server import VllmServer
        server = VllmServer({str(fake)!r}, "model", log_path={str(tmp_path / 'owner.log')!r}, startup_timeout_s=30)
        server.start()
        server.freeze()
        print(server.process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", owner], capture_output=True, text=True, timeout=60)
    group = int(done.stdout.split()[0])
    try:
        deadline = time.monotonic() + 10
        while "T" in states(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "T" not in states(group), "a server of the killed owner was left stopped"
    finally:
        for pid in group_members(group):  # the fake's child has no parent-death signal of its own
            os.kill(pid, signal.SIGKILL)

"""A pipeline that dies outright (SIGKILL, the OOM killer) leaves no stage running: the stage gets its parent-death
SIGTERM, and the stage's guard stops the rest of its group (SIGTERM, then SIGKILL after the grace), as torchrun's
workers or a loader that ignores SIGTERM would need."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.integration.conftest import REPO

# A stage as torchrun is one: a launcher with workers in its process group. One worker ignores SIGTERM (training's
# batch-loader workers do), so only the guard's SIGKILL after the grace ends it.
STAGE = """
import subprocess, sys, time
tag = sys.argv[1]
worker = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[2] == 'deaf' else signal.SIG_DFL); time.sleep(120)"
for kind in ("plain", "deaf"):
    subprocess.Popen([sys.executable, "-c", worker, tag, kind])
print("stage ready", flush=True)
time.sleep(120)
"""
PIPELINE = """
import sys
from blockdraft.pipeline import process
process.STOP_GRACE_S = float(sys.argv[3])
process.run_command([sys.executable, "-c", sys.argv[1], sys.argv[2]])
"""


def running(tag: str) -> list:
    found = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found if int(pid) != os.getpid()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_pipeline_killed_mid_stage_leaves_nothing_of_the_stage_running():
    tag = f"blockdraft-stage-{uuid.uuid4().hex}"
    pipeline = subprocess.Popen([sys.executable, "-c", PIPELINE, STAGE, tag, "1.0"], cwd=REPO, stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
    try:
        for _ in range(40):  # past the runner's echo of the command
            if pipeline.stdout.readline().strip() == "stage ready":
                break
        else:
            pytest.fail("the stage never started")
        deadline = time.monotonic() + 10
        while len(running(tag)) < 4 and time.monotonic() < deadline:  # the pipeline, the stage, its two workers
            time.sleep(0.05)
        assert len(running(tag)) == 4, running(tag)
        pipeline.kill()
        pipeline.wait()
        deadline = time.monotonic() + 6  # the grace (1 s) and the guard's polls
        while running(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running(tag) == [], "left running after the pipeline died"
    finally:
        for pid in running(tag):
            os.kill(pid, signal.SIGKILL)
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)


def test_a_stage_that_ends_dismisses_its_guard_without_a_signal(monkeypatch):
    """The guard of a stage that ended leaves at once, by the pipeline's word, not by a signal of its own."""
    from blockdraft.pipeline import process

    guards = []

    class Recorded(process.StageGuard):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            guards.append(self)

    monkeypatch.setattr(process, "StageGuard", Recorded)
    tag = f"blockdraft-stage-{uuid.uuid4().hex}"
    assert process.run_command([sys.executable, "-c", "import sys; sys.exit(3)", tag]) == 3
    assert running(tag) == []
    assert len(guards) == 1 and guards[0].process.returncode == 0  # dismissed: it left without stopping anything

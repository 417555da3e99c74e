"""A stopped pipeline gives the running stage the time to stop its own servers: the terminal's Ctrl-C
reaches the stage itself, a SIGTERM sent to the pipeline alone is passed on."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import REPO

# A stage whose clean-up takes a second, longer than the 0.25 s subprocess.run would give it.
STAGE = """
import pathlib, signal, sys, time
def clean_up(*_):
    time.sleep(1.0)
    pathlib.Path(sys.argv[1]).write_text("cleaned up")
    sys.exit(130)
signal.signal(signal.SIGINT, clean_up)
signal.signal(signal.SIGTERM, clean_up)
print("stage ready", flush=True)
time.sleep(60)
"""
# The pipeline's process: the runner's command, with the handlers its __main__ installs (a job started
# in the background inherits SIGINT ignored, so the default is restored as a terminal would have it).
PIPELINE = """
import signal, sys
from blockdraft.pipeline import process as runner
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, runner.on_sigterm)
try:
    runner.run_command([sys.executable, "-c", sys.argv[1], sys.argv[2]])
except KeyboardInterrupt:
    print("pipeline stopped", flush=True)
"""


@pytest.mark.parametrize("how", ["ctrl-c to the group", "sigterm to the pipeline"])
def test_the_stage_finishes_its_clean_up_before_the_pipeline_returns(tmp_path, how):
    marker = tmp_path / "marker"
    pipeline = subprocess.Popen([sys.executable, "-c", PIPELINE, STAGE, str(marker)], cwd=REPO, stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
    try:
        for _ in range(40):  # past the runner's echo of the command
            if pipeline.stdout.readline().strip() == "stage ready":
                break
        else:
            pytest.fail("the stage never started")
        time.sleep(0.2)
        if how == "ctrl-c to the group":
            os.killpg(pipeline.pid, signal.SIGINT)  # what the terminal does: every process of the group
        else:
            os.kill(pipeline.pid, signal.SIGTERM)  # a scheduler stopping the pipeline alone
        rest, _ = pipeline.communicate(timeout=30)
    finally:
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)
    assert "pipeline stopped" in rest and marker.read_text() == "cleaned up"


# A stage with a worker of its own, as torchrun has: the worker writes its marker when the stop reaches it.
LAUNCHER = """
import signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]])
signal.signal(signal.SIGTERM, lambda *_: (worker.wait(), sys.exit(143)))
signal.signal(signal.SIGINT, lambda *_: (worker.wait(), sys.exit(130)))
print("stage ready", flush=True)
time.sleep(60)
"""
WORKER = """
import pathlib, signal, sys, time
def stopped(signum, _):
    pathlib.Path(sys.argv[1]).write_text(signal.Signals(signum).name)
    sys.exit(1)
signal.signal(signal.SIGINT, stopped)
signal.signal(signal.SIGTERM, stopped)
time.sleep(60)
"""
# A stage whose clean-up hangs: only a kill of its group ends it.
STUCK = """
import signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"])
open(sys.argv[1], "w").write(str(worker.pid))
signal.signal(signal.SIGINT, lambda *_: time.sleep(60))
print("stage ready", flush=True)
time.sleep(60)
"""
PIPELINE_WITH_ARGS = PIPELINE.replace("[sys.executable, \"-c\", sys.argv[1], sys.argv[2]]", "[sys.executable, \"-c\", *sys.argv[1:]]")


def started(argv):
    pipeline = subprocess.Popen([sys.executable, "-c", PIPELINE_WITH_ARGS, *argv], cwd=REPO, stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
    for _ in range(40):
        if pipeline.stdout.readline().strip() == "stage ready":
            time.sleep(0.2)
            return pipeline
    pipeline.kill()
    pytest.fail("the stage never started")


def test_a_sigterm_to_the_pipeline_reaches_every_process_of_the_stage(tmp_path):
    marker = tmp_path / "marker"
    pipeline = started([LAUNCHER, str(marker), WORKER])
    try:
        os.kill(pipeline.pid, signal.SIGTERM)
        rest, _ = pipeline.communicate(timeout=30)
    finally:
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)
    assert "pipeline stopped" in rest and marker.read_text() == "SIGTERM"


def test_a_second_ctrl_c_kills_the_stage_group(tmp_path):
    pid_file = tmp_path / "worker.pid"
    pipeline = started([STUCK, str(pid_file)])
    try:
        os.kill(pipeline.pid, signal.SIGINT)  # the clean-up hangs
        time.sleep(0.5)
        began = time.monotonic()
        os.kill(pipeline.pid, signal.SIGINT)  # the second Ctrl-C
        rest, _ = pipeline.communicate(timeout=30)
    finally:
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)
    assert "pipeline stopped" in rest and time.monotonic() - began < 10
    worker = int(pid_file.read_text())
    for _ in range(50):
        if not os.path.exists(f"/proc/{worker}") or "Z" in open(f"/proc/{worker}/stat").read().split(")")[1].split()[:1]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the stage's worker outlived the second Ctrl-C")

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

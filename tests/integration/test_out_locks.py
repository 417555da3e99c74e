"""One writer per output directory, through each app's own command: two regens, two exports and two pipelines
started at once on the same out: one runs, the other is refused at once, naming the holder, having written nothing.
A pipeline SIGKILLed while a stage runs leaves nothing of that stage running; its locks are taken over by a rerun."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blockdraft import faults
from blockdraft.out_lock import OutLock, beside
from tests.integration.conftest import REPO

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
BLOCKDRAFT = REPO / ".venv" / "bin" / "blockdraft"
# As tests/integration/test_pipeline.py runs it: the reference engine, no gate, no probe.
PIPELINE = ["prompts=tiny", "experiment=tiny_cpu", "regen.num_train=32", "regen.num_heldout=4", "regen.max_tokens=32",
            "regen.backend=transformers", "regen.progress=false", "train.max_steps=30", "serve.engine=reference",
            "round_cost=false"]


@pytest.fixture(scope="module", autouse=True)
def tiny_target():
    from blockdraft.models.tiny_target import save_tiny_target

    save_tiny_target(TARGET, "qwen3")


def start(argv, log: Path, point: str, mark: Path) -> subprocess.Popen:
    """The command, paused at `point` (fault sleep) once it holds its lock; `mark` names the point when it is there."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1",
           faults.ENV: f"{point}:sleep=600", faults.MARK_ENV: str(mark)}
    with open(log, "w") as fh:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def race(tmp_path, argv, point: str, timeout: float = 90.0):
    """Both started at once; returns (the one holding the lock, paused; the refused one's output)."""
    mark = tmp_path / "mark"
    procs = [start(argv, tmp_path / f"{i}.log", point, mark) for i in range(2)]
    try:
        deadline = time.monotonic() + timeout
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        refused = next((i for i, p in enumerate(procs) if p.poll() is not None), None)
        assert refused is not None, "neither was refused"
        holder = procs[1 - refused]
        said = (tmp_path / f"{refused}.log").read_text()
        assert procs[refused].returncode == 2, said[-3000:]
        while not (mark.exists() and point in mark.read_text()) and holder.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert holder.poll() is None and mark.read_text().split() == [point], (tmp_path / f"{1 - refused}.log").read_text()[-3000:]
        return holder, said
    except BaseException:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        raise


def refusal_names(said: str, holder: subprocess.Popen, app: str) -> None:
    line = next(line for line in said.splitlines() if line.startswith("error:"))
    assert f"is in use by pid {holder.pid} on {os.uname().nodename}, a{'n' if app[0] in 'aeiou' else ''} {app} started at " in line, line
    assert f"kill {holder.pid} on" in line and "use another out=" in line and "delete " in line, line


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_two_regens_on_one_out_one_runs_and_one_is_refused(tmp_path):
    out = tmp_path / "regen"
    argv = [sys.executable, "-m", "blockdraft.regen", f"target={TARGET}", f"out={out}", "prompts=tiny_prompts",
            "backend=transformers", "num_train=4", "num_heldout=2"]
    holder, said = race(tmp_path, argv, "regen.after_lock")
    try:
        refusal_names(said, holder, "regen")
        assert "resumes from the rows it wrote" in said
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # the refused one wrote nothing
        assert json.loads((out / ".lock").read_text())["pid"] == holder.pid
    finally:
        stop(holder)
    assert holder.returncode == 130  # SIGTERM unwinds regen as Ctrl-C does: its lock is released on the way out
    assert not out.exists()  # made for the lock alone, removed with it


def test_two_exports_to_one_out_one_runs_and_one_is_refused(tmp_path):
    out = tmp_path / "export"
    # No checkpoint is needed: the holder pauses as soon as it holds the lock, the other is refused before reading it.
    argv = [sys.executable, "-m", "blockdraft.export", f"checkpoint={tmp_path / 'no-run'}", f"out={out}"]
    holder, said = race(tmp_path, argv, "export.after_lock")
    try:
        refusal_names(said, holder, "export")
        assert f"delete {beside(out)}" in said
        assert not out.exists() and not (tmp_path / "export.tmp").exists()  # the lock lies beside out
        assert json.loads(beside(out).read_text())["pid"] == holder.pid
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    # A dead holder's lock is taken over at once on this host.
    with OutLock(out, lock_path=beside(out), app="export") as lock:
        assert json.loads(beside(out).read_text())["token"] == lock.token


def pgrep(pattern: str) -> list:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found if int(pid) != os.getpid()]


def test_two_pipelines_on_one_out_one_runs_then_killed_leaves_no_stage_running(tmp_path):
    out = tmp_path / "pipeline-out"
    argv = [str(BLOCKDRAFT), "pipeline", f"target={TARGET}", f"out={out}", *PIPELINE]
    # The holder runs on into its regen stage, which pauses once it holds the regen lock.
    holder, said = race(tmp_path, argv, "regen.after_lock", timeout=120)
    try:
        refusal_names(said, holder, "pipeline")
        assert "stages.json says where it stopped" in said
        assert json.loads((out / ".lock").read_text())["pid"] == holder.pid
        regen_lock = json.loads((out / "regen" / ".lock").read_text())  # the stage's own, below the pipeline's
        assert regen_lock["app"] == "regen" and regen_lock["pid"] != holder.pid
        assert regen_lock["pid"] in pgrep(str(out))
        holder.kill()  # the pipeline alone, outright: its stage is in a process group of its own
        holder.wait()
        deadline = time.monotonic() + 10
        while pgrep(str(out)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pgrep(str(out)) == [], "a stage outlived its pipeline"
    finally:
        for pid in pgrep(str(out)):
            os.kill(pid, signal.SIGKILL)
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
    # What the dead left is taken over by the rerun: both holders are gone from this host.
    for directory in (out, out / "regen"):
        with OutLock(directory) as lock:
            assert json.loads((directory / ".lock").read_text())["token"] == lock.token


def test_a_capture_into_a_store_in_use_is_refused_before_it_loads_anything(tmp_path):
    from blockdraft.capture.app import run_capture
    from blockdraft.config import compose

    out = tmp_path / "store"
    with OutLock(out, lock_path=beside(out), app="capture"):
        began = time.monotonic()
        with pytest.raises(Exception) as err:
            run_capture(compose("capture", ["experiment=tiny_cpu", f"out={out}", "train.progress=false"]))
        assert f"out={out} is in use by pid {os.getpid()}" in str(err.value) and "a capture started at" in str(err.value)
        assert "resumes at its unfinished shards" in str(err.value)
        assert time.monotonic() - began < 5 and not out.exists()  # no target loaded, no store begun

"""Kill a training run (or an export) at chosen moments; nothing may be lost.

A killed run is checked as it lies (only verified checkpoints count as complete; metrics
readable line by line, a torn last line excepted), then resumed with resume=auto, and
must end on the uninterrupted run's weights and losses. The moments come from named
fault points (blockdraft/faults.py): the child pauses there and the test SIGKILLs it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.draft_format.importer import import_draft
from blockdraft.integrity import verify_checksums
from blockdraft.train.checkpoint import complete_checkpoints
from blockdraft.train.logger import read_metrics
from tests.faults.conftest import (LOG_EVERY, MAX_STEPS, REPO, TRAIN_ARGS, Run, compare_with_reference, inspect_killed,
                                   raw_metric_lines, run_to_end, train_losses)

KILLS = {
    # fault name in the report: (fault point, fast subset?)
    # make test-slow: a resume from the last checkpoint after a kill is the mid-checkpoint case's in make test.
    "SIGKILL mid-step (after backward, before the optimizer step)": ("train.after_backward@23:sleep=600", False),
    "SIGKILL mid-checkpoint write (weights written, trainer state not)": ("checkpoint.after_weights@2:sleep=600", True),
    "SIGKILL after a checkpoint is written, before its rename": ("checkpoint.before_rename@2:sleep=600", False),
    "SIGKILL during the final save (the last step saved twice)": ("checkpoint.before_rename@5:sleep=600", False),
    "SIGKILL during the final save, its old copy set aside, the new one not yet renamed": ("checkpoint.after_set_aside@1:sleep=600", False),
    "SIGKILL before the first checkpoint": ("train.after_backward@7:sleep=600", False),
}


def _id(point: str) -> str:
    return point.split(":")[0].replace("@", "-hit")  # `-k` cannot take "@"


def _kill_cases():
    return [pytest.param(name, point, id=_id(point), marks=[] if fast else [pytest.mark.slow])
            for name, (point, fast) in KILLS.items()]


def resume_and_check(run_dir, reference, survived, problems, record, fault):
    """Resume the killed run to the end, compare it with the uninterrupted one, record the row."""
    resumed = Run(run_dir, *TRAIN_ARGS, "resume=auto", log_name="resume")
    code = resumed.finish()
    out = resumed.output()
    resumed_from = re.search(r"^\[resume\] continuing from (\S+) at step (\d+)", out, re.M)
    if code != 0:
        problems.append(f"resume=auto exited {code}: {out[-1500:]}")
    else:
        closeness, differing = compare_with_reference(run_dir, reference, int(resumed_from[2]) if resumed_from else 0)
        survived.append(closeness)
        problems += differing
        if (run_dir / ".lock").exists():
            problems.append("the run lock outlived the resumed run")
    survived.append(f"{os.path.basename(resumed_from[1])} picked by resume=auto" if resumed_from
                    else "resume=auto started afresh (no checkpoint)")
    record(fault, "; ".join(survived), problems, resumed.seconds, "rerun with resume=auto to the end")
    assert not problems, "\n".join(problems)
    return out


@pytest.mark.parametrize("fault,point", _kill_cases())
def test_sigkill_at_a_fault_point_loses_nothing(fault, point, rep, tmp_path, reference_run, record):
    run = Run(tmp_path / "run", *TRAIN_ARGS, fault=point)
    run.wait_mark()
    run.kill()
    survived, problems = inspect_killed(run.run_dir)
    newest = newest_whole_step(run.run_dir)
    out = resume_and_check(run.run_dir, reference_run, survived, problems, record, fault)
    if newest:
        assert f"continuing from {run.run_dir / 'checkpoints' / newest}" in out, out[-2000:]
    assert "[lock] taking over" in out and "no longer" in out  # SIGKILL left its lock; the dead owner is recognised


def newest_whole_step(run_dir):
    """The step a resume must continue from: the newest complete checkpoint, or a newer step a kill left whole
    (a re-save's old copy set aside, or a save whose checksums were written before its rename)."""
    root = run_dir / "checkpoints"
    steps = [int(p.name[len("step_"):]) for p in complete_checkpoints(run_dir)]
    steps += [int(p.name[len("step_"):-len(".old")]) for p in root.glob("step_*.old")]
    steps += [int(p.name[len("step_"):-len(".tmp")]) for p in root.glob("step_*.tmp") if (p / "checksums.json").exists()]
    return f"step_{max(steps)}" if steps else None


@pytest.mark.slow
def test_sigkill_between_checkpoints_with_a_torn_metrics_line(rep, tmp_path, reference_run, record, capsys):
    run = Run(tmp_path / "run", *TRAIN_ARGS)
    run.wait_for(lambda: any(s >= 25 for s in _logged_steps(run.run_dir)), "step 25 in metrics.jsonl")
    run.kill()  # somewhere after step 25: a moment chosen by the clock, not by a fault point
    # A kill inside write() would tear the last line; one write cannot be cut from outside on
    # demand, so the tear is made here, exactly as a cut write would leave it.
    with open(run.run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 999, "loss": 1.2')
    survived, problems = inspect_killed(run.run_dir)
    read_metrics(run.run_dir, report_torn=True)
    if "skipped 1 torn line" not in capsys.readouterr().out:
        problems.append("the torn metrics line was not reported")
    out = resume_and_check(run.run_dir, reference_run, survived, problems, record,
                           "SIGKILL between checkpoints (torn last metrics line)")
    assert "dropped" in out  # the resume says it cut the lines after its checkpoint, the torn one included


def _logged_steps(run_dir):
    return [r.get("step", 0) for r in read_metrics(run_dir)]


SIGTERMS = {
    "SIGTERM mid-step": ("train.after_backward@17:sleep=5", 17, True),
    "SIGTERM mid-checkpoint write": ("checkpoint.after_weights@1:sleep=5", 10, False),
}


@pytest.mark.parametrize("fault", [pytest.param(k, marks=[] if v[2] else [pytest.mark.slow], id=_id(v[0]))
                                   for k, v in SIGTERMS.items()])
def test_sigterm_saves_a_checkpoint_then_exits_143(fault, rep, tmp_path, reference_run, record):
    point, step, _ = SIGTERMS[fault]
    run = Run(tmp_path / "run", *TRAIN_ARGS, fault=point)
    run.wait_mark()
    run.proc.send_signal(signal.SIGTERM)  # as a scheduler does: the process, not its group
    code = run.finish()
    assert code == 143, run.output()[-3000:]
    survived, problems = inspect_killed(run.run_dir)
    saved = [p.name for p in complete_checkpoints(run.run_dir)]
    if not saved or saved[-1] != f"step_{step}":
        problems.append(f"SIGTERM at step {step} left checkpoints {saved}, not step_{step}")
    if (run.run_dir / ".lock").exists():
        problems.append("the lock was not released on SIGTERM")
    if step % LOG_EVERY and step not in train_losses(run.run_dir):
        problems.append(f"the losses of the steps since the last metrics line (up to step {step}) were never logged")
    resume_and_check(run.run_dir, reference_run, survived, problems, record, fault)


# --- export ---------------------------------------------------------------------------------
def export(checkpoint, out, *extra, fault=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BLOCKDRAFT_FAULT_MARK": str(out) + ".mark"}
    env.pop("BLOCKDRAFT_FAULT", None)
    if fault:
        env["BLOCKDRAFT_FAULT"] = fault
    return subprocess.Popen([sys.executable, "-m", "blockdraft.export", f"checkpoint={checkpoint}", f"out={out}", "dtype=float32", *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _tree(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())} if path.is_dir() else None


EXPORT_KILLS = {
    "SIGKILL mid-export (weights written to staging, not yet checked)": ("export.after_weights:sleep=600", False, True),
    "SIGKILL during export, before its rename": ("export.before_rename:sleep=600", False, False),
    "SIGKILL during an export replacing an earlier one (overwrite=true)": ("export.before_rename:sleep=600", True, False),
}


@pytest.mark.parametrize("fault", [pytest.param(k, marks=[] if v[2] else [pytest.mark.slow], id=_id(v[0]) + ("-overwrite" if v[1] else ""))
                                   for k, v in EXPORT_KILLS.items()])
def test_sigkill_during_export_leaves_out_untouched(fault, rep, tmp_path, reference_run, record):
    point, replacing, _ = EXPORT_KILLS[fault]
    checkpoint = reference_run / "checkpoints" / f"step_{MAX_STEPS}"
    out = tmp_path / "export"
    extra = ["overwrite=true"] if replacing else []
    if replacing:
        first = export(reference_run / "checkpoints" / "step_20", out)
        assert first.wait(300) == 0, first.stdout.read().decode()[-3000:]
    before = _tree(out)
    proc = export(checkpoint, out, *extra, fault=point)
    mark = tmp_path / "export.mark"
    deadline = time.monotonic() + 300
    while not mark.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-3000:]
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    problems = []
    if _tree(out) != before:
        problems.append(f"{out} changed under a killed export")
    survived = ["earlier export intact" if replacing else "no half export under out",
                f"staging {out.name}.tmp left" if (tmp_path / "export.tmp").exists() else "no staging left"]
    began = time.monotonic()
    rerun = export(checkpoint, out, *extra)
    code, log = rerun.wait(300), rerun.stdout.read().decode()
    seconds = time.monotonic() - began
    if code != 0:
        problems.append(f"the rerun export exited {code}: {log[-1500:]}")
    else:
        verify_checksums(out)
        exported, _ = import_draft(out)
        want = load_file(str(checkpoint / "model.safetensors"))
        if any(not torch.equal(v, want[k]) for k, v in exported.state_dict().items()):
            problems.append("the re-export does not hold the checkpoint's weights")
        if (tmp_path / "export.tmp").exists():
            problems.append("the rerun left the staging directory behind")
        survived.append("rerun export verified (checksums, weights = checkpoint)")
    record(fault, "; ".join(survived), problems, seconds, "rerun the same export command")
    assert not problems, "\n".join(problems)


# --- two runs, one run directory ----------------------------------------------------------
@pytest.mark.slow
def test_a_second_run_on_a_busy_run_dir_is_refused(rep, tmp_path, record):
    first = Run(tmp_path / "run", "train.max_steps=100000", "train.log_every=5", "data.val=null")
    first.wait_for(lambda: raw_metric_lines(first.run_dir), "the first metrics line")
    lines_before = len(raw_metric_lines(first.run_dir))
    second = Run(first.run_dir, "train.max_steps=100000", "data.val=null", "resume=auto", log_name="second")
    code = second.finish()
    problems = []
    owner = json.loads((first.run_dir / ".lock").read_text())
    expected = f"in use by pid {first.proc.pid} on {socket.gethostname()}"
    if code != 2 or expected not in second.output():
        problems.append(f"the second run was not refused naming its owner (exit {code}): {second.output()[-1500:]}")
    if owner["pid"] != first.proc.pid or first.proc.poll() is not None:
        problems.append("the first run lost its lock or died")
    first.proc.send_signal(signal.SIGTERM)
    if first.finish() != 143 or not complete_checkpoints(first.run_dir):
        problems.append("the first run did not save and exit on SIGTERM after the refusal")
    if len(raw_metric_lines(first.run_dir)) < lines_before or (first.run_dir / ".lock").exists():
        problems.append("the first run's metrics shrank or its lock was left")
    survived = "the first run trained on, then saved on SIGTERM; the lock names its pid and host"
    record("a second run on the same run_dir", survived, problems, second.seconds, "the second run exits 2 naming the owner")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_a_corrupt_latest_checkpoint_is_named_and_an_older_one_resumes(rep, tmp_path, reference_run, record):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    latest = run_dir / "checkpoints" / f"step_{MAX_STEPS}"
    weights = latest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, inside a tensor: the file still parses
    weights.write_bytes(bytes(data))
    refused = Run(run_dir, *TRAIN_ARGS, "resume=auto", log_name="refused")
    code = refused.finish()
    problems = []
    if code != 2 or f"{weights} is corrupt" not in refused.output():
        problems.append(f"the corrupt file was not named (exit {code}): {refused.output()[-1500:]}")
    began = time.monotonic()
    older = run_to_end(run_dir, *TRAIN_ARGS, f"resume={run_dir / 'checkpoints' / 'step_30'}")
    closeness, differing = compare_with_reference(run_dir, reference_run, resumed_from=30)
    problems += differing
    record("a flipped bit in the latest checkpoint", f"named {weights.name}; step_30 resumed; {closeness}", problems,
           time.monotonic() - began, "resume=<the previous checkpoint>")
    assert older.proc.returncode == 0 and not problems, "\n".join(problems)


def test_a_mistyped_fault_spec_is_refused_not_ignored():
    from blockdraft.faults import parse

    assert parse("checkpoint.after_weights@2:sleep=30, train.after_backward:kill") == {
        "checkpoint.after_weights": (2, False, "sleep", 30.0), "train.after_backward": (1, False, "kill", 0.0)}
    assert parse("train.loss@3+:nan=1, x:nan") == {"train.loss": (3, True, "nan", 1.0), "x": (1, False, "nan", -1.0)}
    for typo in ("checkpoint.after_weights:sleep", "train.after_backward:explode", "x@two:kill", "x:nan=one", "x@+:nan"):
        with pytest.raises(ValueError, match="cannot read"):
            parse(typo)


def test_nan_fires_only_at_a_value_point_and_on_the_rank_asked(monkeypatch):
    import torch

    from blockdraft import faults

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(faults.ENV, "v.one@2+:nan=1, v.all:nan, p.kill:nan")
    assert torch.isfinite(faults.corrupt("v.one", torch.ones(2))).all()
    assert torch.isfinite(faults.corrupt("v.one", torch.ones(2))).all()  # fires from hit 2, but on rank 1 only
    monkeypatch.setenv("RANK", "1")
    assert torch.isnan(faults.corrupt("v.one", torch.ones(2))).all()
    assert torch.isnan(faults.corrupt("v.all", torch.ones(2))).all()
    assert torch.isfinite(faults.corrupt("v.all", torch.ones(2))).all()  # hit 1 only
    with pytest.raises(ValueError, match="not a value point"):
        faults.point("p.kill")

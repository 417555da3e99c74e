"""No step writes non-finite weights: a NaN loss (injected at the `train.loss` fault point) is skipped
with nothing applied, and a run of them stops the run with the last good checkpoint the newest."""

import contextlib
import io
import json

import pytest
import torch
from safetensors.torch import load_file

from blockdraft import faults
from blockdraft.train.checkpoint import complete_checkpoints
from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO, tiny_overrides
from tests.integration.test_train_tiny import _launch


def _run(run_dir, fault, *args, nproc=1):
    """(exit status, output) of `blockdraft train` with the fault plan `fault`: one rank in this process (a new
    interpreter's imports would cost more than its few steps), more under torchrun."""
    words = ["data.val=null", "train.log_every=1", "train.save_every=1", "train.keep_last=10", *args]
    if nproc == 1:
        return _train_here(run_dir, fault, *words)
    proc = _launch(words, run_dir, nproc=nproc, extra_env={faults.ENV: fault})
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out.decode()


def _train_here(run_dir, fault, *words):
    from blockdraft import cli

    out = io.StringIO()
    faults._hits.clear()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        mp.chdir(REPO)
        mp.setenv(faults.ENV, fault)
        code = cli.main(["train", *tiny_overrides(run_dir, *words)])
    faults._hits.clear()
    return code, out.getvalue()


def _checkpoint(run_dir, step):
    path = run_dir / "checkpoints" / f"step_{step}"
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    return load_file(str(path / "model.safetensors")), state


def _skips(run_dir):
    return [r for r in read_metrics(run_dir) if r.get("event") == "nonfinite_step_skipped"]


def _assert_step_changed_nothing(run_dir, before, after):
    (w0, s0), (w1, s1) = _checkpoint(run_dir, before), _checkpoint(run_dir, after)
    for name, t in w0.items():
        assert torch.isfinite(w1[name]).all(), name
        assert torch.equal(w1[name], t), f"{name} changed in a skipped step"
    assert s1["scheduler"] == s0["scheduler"]
    for key, moments in s0["optimizer"]["state"].items():
        for field, value in moments.items():
            assert torch.equal(s1["optimizer"]["state"][key][field], value), f"optimizer {field} changed"


def test_a_nan_step_is_skipped_counted_and_logged_with_its_rows(tmp_path):
    run = tmp_path / "run"
    code, out = _run(run, "train.loss@3:nan", "train.max_steps=4")
    assert code == 0, out[-3000:]
    skips = _skips(run)
    assert [s["step"] for s in skips] == [3] and skips[0]["nonfinite"] == "loss and gradient norm"
    assert len(skips[0]["rows"]) == 4 and "step 3: non-finite loss and gradient norm" in out  # the recipe's 4 rows a step
    # Step 3 changed nothing (its end-of-window checkpoint is not written while skipping); step 4 learns on.
    assert [c.name for c in complete_checkpoints(run)] == ["step_1", "step_2", "step_4"]
    logged = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in logged] == [1, 2, 4] and all(r["loss"] is not None for r in logged)
    w4, _ = _checkpoint(run, 4)
    assert all(torch.isfinite(t).all() for t in w4.values())


def test_a_skipped_last_step_leaves_weights_optimizer_and_schedule_as_they_were(tmp_path):
    run = tmp_path / "run"
    code, out = _run(run, "train.loss@3:nan", "train.max_steps=3")
    assert code == 0, out[-3000:]
    _assert_step_changed_nothing(run, 2, 3)  # the final save holds step 2's state, unchanged


def test_nan_steps_in_a_row_stop_the_run_naming_the_rows_with_the_last_good_checkpoint_newest(tmp_path):
    run = tmp_path / "run"
    code, out = _run(run, "train.loss@3+:nan", "train.max_steps=50", "train.max_nonfinite_steps=2")
    assert code == 1, out[-3000:]
    rows = [s["rows"] for s in _skips(run)]
    assert [s["step"] for s in _skips(run)] == [3, 4]
    assert "stopped at step 4: the last 2 steps were not finite" in out
    assert f"step 3: loss and gradient norm, rows {rows[0]}" in out and "resume=auto" in out
    assert complete_checkpoints(run)[-1].name == "step_2"  # the newest: nothing saved while skipping
    assert json.loads((run / "checkpoints" / "step_2" / "draft_config.json").read_text())


def test_a_nan_on_one_rank_is_skipped_by_both(tmp_path):
    # Rank 1's loss alone turns NaN at step 3 (the last): rank 0, which saves, must skip it too.
    run = tmp_path / "run"
    code, out = _run(run, "train.loss@3:nan=1", "train.max_steps=3", "train.micro_batch_size=1", nproc=2)
    assert code == 0, out[-3000:]
    assert "[fault] train.loss: nan on rank 1" in out
    skips = _skips(run)
    assert [s["step"] for s in skips] == [3] and len(skips[0]["rows"]) == 2  # the step's rows of both ranks
    _assert_step_changed_nothing(run, 2, 3)

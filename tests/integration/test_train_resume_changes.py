"""A resume takes this run's settings where they may change: a larger train.max_steps trains on under that
run's schedule, a smaller one leaves the run as it is, a lower optim.lr (the advice after non-finite steps)
is the rate the run continues at; and the trainer state is loaded as data, never as code."""

import contextlib
import io
import json
import math

import pytest
import torch

from blockdraft.integrity import write_checksums
from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO, tiny_overrides

BASE = ["data.val=null", "train.log_every=1", "train.save_every=10", "train.keep_last=10", "optim.warmup_ratio=0.1"]


def train(run_dir, *args, fault=None):
    """`blockdraft train` with these words, in this process: the same entry, exit status and output as the
    command (tests/unit/test_cli.py holds the command to its module), without importing torch again for
    each of the runs here and in test_train_max_minutes.py."""
    from blockdraft import cli, faults

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        mp.chdir(REPO)  # the recipe's relative .cache paths
        mp.setattr(faults, "_hits", {})  # a fault point counts its passes from this run's start
        if fault:
            mp.setenv("BLOCKDRAFT_FAULT", fault)
        else:
            mp.delenv("BLOCKDRAFT_FAULT", raising=False)
        code = cli.main(["train", *tiny_overrides(run_dir, *BASE, *args)])
    return code, out.getvalue()


def logged_lr(run_dir):
    return {r["step"]: r["lr"] for r in read_metrics(run_dir) if "lr" in r}


def cosine(step, max_steps, lr, warmup_ratio=0.1, min_ratio=0.1):
    """The lr after `step` optimizer steps of a max_steps run (optim.build_scheduler's factor at `step`)."""
    from blockdraft.config.recipe import OptimConfig
    from blockdraft.train.optim import build_scheduler

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=lr)
    sched = build_scheduler(opt, OptimConfig(lr=lr, warmup_ratio=warmup_ratio, min_lr_ratio=min_ratio), max_steps)
    for _ in range(step):
        opt.step()
        sched.step()
    return sched.get_last_lr()[0]


def test_more_steps_continue_the_run_on_the_longer_schedule_and_fewer_leave_it_as_it_is(tmp_path):
    from blockdraft.config.recipe import OptimConfig

    run = tmp_path / "run"
    code, out = train(run, "train.max_steps=20")
    assert code == 0, out[-3000:]
    code, out = train(run, "train.max_steps=30", "resume=auto")
    assert code == 0, out[-3000:]
    assert "continuing from" in out and "train.max_steps 20 -> 30" in out and "learning rate at step 20" in out
    lrs, min_ratio = logged_lr(run), OptimConfig().min_lr_ratio
    assert max(lrs) == 30 and all(s in lrs for s in range(1, 31))
    # The steps after the resume follow the 30-step run's schedule, not the 20-step one's (which ended at its floor).
    for step in (21, 25, 30):
        assert math.isclose(lrs[step], cosine(step, 30, 3e-3, min_ratio=min_ratio), rel_tol=1e-6), step
    final = run / "checkpoints" / "step_30"
    before = {p.name: p.read_bytes() for p in final.iterdir()}
    metrics = (run / "metrics.jsonl").read_bytes()
    code, out = train(run, "train.max_steps=25", "resume=auto")
    assert code == 0 and "already at step 30, past train.max_steps=25: nothing to train" in out, out[-3000:]
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before and (run / "metrics.jsonl").read_bytes() == metrics


def test_the_advice_after_non_finite_steps_works_as_printed(tmp_path):
    run = tmp_path / "run"
    code, out = train(run, "train.max_steps=30", "train.max_nonfinite_steps=2", fault="train.loss@14+:nan")
    assert code != 0 and "lower optim.lr, or set optim.grad_clip; rerun with resume=auto" in out, out[-3000:]
    code, out = train(run, "train.max_steps=30", "resume=auto", "optim.lr=1e-3", "optim.grad_clip=1.0")
    assert code == 0, out[-3000:]
    assert "continuing from" in out and "step_10" in out and "optim peak learning rate 0.003 -> 0.001" in out
    lrs = logged_lr(run)
    assert math.isclose(lrs[20], cosine(20, 30, 1e-3), rel_tol=1e-6)  # the new peak's schedule
    assert all("grad_norm" in r for r in read_metrics(run) if r.get("step", 0) > 10 and "lr" in r)


class Payload:
    """A pickle that runs code when loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_trainer_state_that_is_not_plain_data_is_refused(tmp_path):
    run = tmp_path / "run"
    code, out = train(run, "train.max_steps=10")
    assert code == 0, out[-3000:]
    ckpt = run / "checkpoints" / "step_10"
    marker = tmp_path / "ran"
    torch.save({"step": 10, "payload": Payload(marker)}, ckpt / "trainer_state.pt")
    write_checksums(ckpt)  # a crafted checkpoint, its checksums made to match
    code, out = train(run, "train.max_steps=20", "resume=auto")
    assert code == 2 and "holds more than plain data and was not loaded" in out, out[-3000:]
    assert not marker.exists()


def test_a_log_window_takes_steps_without_a_gradient_norm():
    from blockdraft.train.loop import merge_sums

    with_norm = {"loss_sum": torch.tensor(1.0), "grad_norm": torch.tensor(2.0), "grad_norm_steps": torch.tensor(1.0)}
    without = {"loss_sum": torch.tensor(1.0)}  # a global batch with no valid anchor: no gradient, no norm
    for merged in (merge_sums(with_norm, without), merge_sums(without, with_norm)):
        assert json.loads(json.dumps({k: float(v) for k, v in merged.items()})) == {
            "loss_sum": 2.0, "grad_norm": 2.0, "grad_norm_steps": 1.0}

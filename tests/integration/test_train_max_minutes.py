"""train.max_minutes stops a run at its next checkpoint once its time is spent, records why, and a resume
continues the same budget: untouched when it is spent, on to a larger one when it is raised."""

import torch

from blockdraft.train import checkpoint as ckpt
from blockdraft.train.logger import read_metrics
from tests.integration.test_train_resume_changes import train

MANY_STEPS = "train.max_steps=100000"  # time, not steps, ends these runs


def last_step(run):
    return int(ckpt.complete_checkpoints(run)[-1].name.split("_")[1])


def spent_s(run):
    state = torch.load(ckpt.complete_checkpoints(run)[-1] / "trainer_state.pt", weights_only=True)
    return state["train_seconds"]


def test_time_budget_stops_at_a_checkpoint_records_why_and_resumes(tmp_path):
    run = tmp_path / "run"
    code, out = train(run, MANY_STEPS, "train.save_every=5", "train.max_minutes=0.01")
    assert code == 0, out[-3000:]
    step = last_step(run)
    assert 0 < step < 100000 and step % 5 == 0, step
    stops = [r for r in read_metrics(run) if r.get("event") == "stopped"]
    assert len(stops) == 1 and stops[0]["step"] == step and "train.max_minutes=0.01 spent" in stops[0]["reason"]
    assert f"[train] stopping: train.max_minutes=0.01 spent" in out
    assert 0.6 <= spent_s(run) < 60

    # The same budget, resumed: nothing to train, every file as it was.
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, out = train(run, MANY_STEPS, "train.save_every=5", "train.max_minutes=0.01", "resume=auto")
    assert code == 0 and "has spent its train.max_minutes=0.01" in out and "nothing to train" in out, out[-3000:]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before

    # A larger budget continues from the checkpoint, counting the time already spent.
    code, out = train(run, MANY_STEPS, "train.save_every=5", "train.max_minutes=0.03", "resume=auto")
    assert code == 0 and f"continuing from" in out, out[-3000:]
    assert last_step(run) > step and last_step(run) % 5 == 0
    assert 1.8 <= spent_s(run) < 120
    assert [r["step"] for r in read_metrics(run) if r.get("event") == "stopped"][-1] == last_step(run)


def test_a_budget_that_is_not_positive_is_refused_before_training(tmp_path):
    code, out = train(tmp_path / "run", "train.max_minutes=0")
    assert code == 2 and "train.max_minutes=0" in out and "positive number of minutes" in out, out[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()

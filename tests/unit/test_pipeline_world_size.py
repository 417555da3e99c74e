"""The train key holds the global batch, not the world size: the same global batch on more or fewer ranks is the
same training and keeps every key; another global batch is another recipe. A run recorded on another world size
is continued with its global batch (grad_accum handed to training), unless the run would not continue anyway or
train.grad_accum is given; a world size that cannot split it is refused before any stage runs. A record keyed
before the key held the global batch (world size and grad_accum) is the same run, and keeps every later stage."""

import copy

import pytest
import torch

from blockdraft.errors import ConfigError
from blockdraft.pipeline import app, keys
from blockdraft.pipeline.records import StageRecords, stage_key
from blockdraft.pipeline.runner import chain_key, choose, planned_keys, settings_changed
from blockdraft.pipeline.settings import parse_overrides
from blockdraft.pipeline.stages import pipeline_stages
from blockdraft.pipeline.train_stage import train_batches, train_stage
from tests.unit.test_pipeline_keys import TARGET, target  # noqa: F401 (the fixture that writes the tiny target)

RDZV = {"rdzv_endpoint": "node0:29500"}


@pytest.fixture(scope="module")
def composed(target, tmp_path_factory):  # noqa: F811
    """The tiny recipe composed once (micro_batch_size 4, grad_accum 1); each case below varies its copy."""
    s = parse_overrides([f"target={TARGET}", "prompts=tiny", "experiment=tiny_cpu", f"out={tmp_path_factory.mktemp('o')}"])
    return s, app.prepare(s)


def variant(composed, nproc=1, nnodes=1, grad_accum=None, given=False, lr=None, out=None):
    """(settings, train config, every config) on nproc x nnodes ranks; grad_accum as the recipe's, or `given` on the
    command line; `out`: where the run lies."""
    s, cfgs = copy.deepcopy(composed)
    s.out = str(out or s.out)
    s.torchrun = {"nproc": str(nproc), "nnodes": str(nnodes), **(RDZV if nnodes > 1 else {})}
    cfg = cfgs["train"]
    if grad_accum is not None:
        cfg.train.grad_accum = grad_accum
        if given:
            s.recipe.append(f"train.grad_accum={grad_accum}")
    if lr is not None:
        cfg.optim.lr = lr
    return s, cfg, cfgs


def chain(s, cfgs):
    return planned_keys(pipeline_stages(s, cfgs, True, "a store"))


def test_the_same_global_batch_on_another_world_size_keeps_the_train_and_resume_keys(composed):
    s, cfg, cfgs = variant(composed, nproc=2)  # 2 ranks x grad_accum 1 x 4 rows
    stage = train_stage(s, cfg, True)
    assert stage.inputs["global_batch"] == 8
    for other_s, other_cfg, other_cfgs in (variant(composed, grad_accum=2), variant(composed, nnodes=2)):
        other = train_stage(other_s, other_cfg, True)
        assert (other.inputs, other.resume_inputs) == (stage.inputs, stage.resume_inputs)
        assert chain(other_s, other_cfgs) == chain(s, cfgs)  # and so every later stage's
    smaller_micro = variant(composed, nproc=2, nnodes=2)
    smaller_micro[1].train.micro_batch_size = 2  # 8 rows too, in micro-batches of 2: each is its own loss mean
    for other_s, other_cfg, other_cfgs in (variant(composed, nproc=2, grad_accum=2), variant(composed), smaller_micro):
        other = train_stage(other_s, other_cfg, True)
        assert other.inputs != stage.inputs and other.resume_inputs != stage.resume_inputs
        assert chain(other_s, other_cfgs)["export"] != chain(s, cfgs)["export"]


def checkpoint(s, micro_batch_size, grad_accum, world_size):
    """<out>/run's checkpoint as training writes it, as far as the pipeline reads it (its batch)."""
    step = s.paths()["run"] / "checkpoints" / "step_10"
    step.mkdir(parents=True)
    torch.save({"step": 10, "world_size": world_size}, step / "trainer_state.pt")
    (step / "config.yaml").write_text(f"train:\n  micro_batch_size: {micro_batch_size}\n  grad_accum: {grad_accum}\n")


def recorded(s, inputs, done=True, **notes):
    """The train stage's record as the runner writes it (no stage before it, here)."""
    records = StageRecords(s.root / "stages.json")
    records.mark("train", chain_key({}, inputs), done=done, seconds=1.0, inputs_key=stage_key(inputs), **notes)
    return records


def chosen(s, cfg, records):
    """The form of the train stage the runner takes against the record, and whether it continues it."""
    form, found = choose(train_stage(s, cfg, True, records), {}, records.get("train"), False)
    return form, found.match(records.get("train"))


def test_a_run_recorded_on_two_ranks_continues_on_one_with_its_global_batch(composed, tmp_path):
    s2, cfg2, _ = variant(composed, nproc=2, out=tmp_path)
    two = train_stage(s2, cfg2, True)
    checkpoint(s2, 4, 1, 2)
    records = recorded(s2, two.inputs, **two.notes)
    s1, cfg1, _ = variant(composed, out=tmp_path)
    form, continues = chosen(s1, cfg1, records)
    assert continues and form.inputs == two.inputs
    assert train_batches(s1, cfg1, True, records)[0].words() == ["train.grad_accum=2"]
    assert form.notes["batch"] == {"rows": 8, "micro_batch_size": 4, "grad_accum": 2, "asked_grad_accum": 1,
                                   "world_size": 1}
    # Continued there, its record says so: the next rerun on one rank, or back on two, is the same run again.
    records = recorded(s1, form.inputs, **form.notes)
    for s, cfg, words in ((s1, cfg1, ["train.grad_accum=2"]), (s2, cfg2, [])):
        form, continues = chosen(s, cfg, records)
        assert continues and form.inputs == two.inputs and train_batches(s, cfg, True, records)[0].words() == words


def test_a_new_recipe_or_a_given_grad_accum_is_a_new_run_at_its_own_global_batch(composed, tmp_path):
    s2, cfg2, _ = variant(composed, nproc=2, out=tmp_path)
    two = train_stage(s2, cfg2, True)
    checkpoint(s2, 4, 1, 2)
    records = recorded(s2, two.inputs, **two.notes)
    # Another learning rate on one rank: not this run, so the recipe's 4 rows, not the old run's 8.
    form, continues = chosen(*variant(composed, lr=1e-3, out=tmp_path)[:2], records)
    assert not continues and form.inputs["global_batch"] == 4 and form.notes["batch"]["grad_accum"] == 1
    # train.grad_accum=1 given on one rank: used as given, a new global batch, said when the run is moved aside.
    form, continues = chosen(*variant(composed, grad_accum=1, given=True, out=tmp_path)[:2], records)
    assert not continues and form.inputs["global_batch"] == 4
    assert settings_changed(form, records.get("train")) == "its settings changed (the global batch: 8 -> 4 rows per step)"
    # Given as the value that keeps the global batch, it continues the run.
    assert chosen(*variant(composed, grad_accum=2, given=True, out=tmp_path)[:2], records)[1]


def test_a_world_size_that_cannot_split_the_runs_global_batch_is_refused_before_any_stage(composed, tmp_path):
    s2, cfg2, _ = variant(composed, nproc=2, out=tmp_path)
    two = train_stage(s2, cfg2, True)
    checkpoint(s2, 4, 1, 2)
    for done in (True, False):  # finished, or stopped part way (a stopped run continues under a new optim.lr)
        records = recorded(s2, two.inputs, done=done, **two.notes)
        for lr in ((None, 1e-3) if not done else (None,)):
            s3, cfg3, _ = variant(composed, nproc=3, lr=lr, out=tmp_path)
            with pytest.raises(ConfigError) as err:
                train_stage(s3, cfg3, True, records)
            message = str(err.value)
            assert message.startswith(f"3 ranks (train.nproc=3 x train.nnodes=1) cannot continue the run in {s3.paths()['run']}")
            assert "its global batch of 8 rows per step" in message and "continue it on 1 or 2 ranks" in message
            assert "give train.grad_accum= for a new run" in message and "\n" not in message
    # A finished run that would not continue anyway (a new learning rate): a new run at 3 x 4 rows, no refusal.
    records = recorded(s2, two.inputs, **two.notes)
    form, continues = chosen(*variant(composed, nproc=3, lr=1e-3, out=tmp_path)[:2], records)
    assert not continues and form.inputs["global_batch"] == 12


def test_a_run_recorded_before_the_key_held_the_global_batch_is_the_same_run(composed, tmp_path):
    s2, cfg2, _ = variant(composed, nproc=2, out=tmp_path)
    checkpoint(s2, 4, 1, 2)
    records = recorded(s2, keys.former_train_inputs(s2, cfg2, True, grad_accum=1, world_size=2))  # no batch noted
    for s, cfg, words in (variant(composed, nproc=2, out=tmp_path)[:2] + ([],),
                          variant(composed, out=tmp_path)[:2] + (["train.grad_accum=2"],)):
        form, continues = chosen(s, cfg, records)
        assert continues and form.inputs["global_batch"] == 8
        assert train_batches(s, cfg, True, records)[0].words() == words
    assert not chosen(*variant(composed, nproc=2, lr=1e-3, out=tmp_path)[:2], records)[1]

"""The train stage: the recipe trained under torchrun where asked, keyed by its global batch (train_batch.py). Where
the run in <out>/run was trained on another world size, the stage has two forms: the first continues that run with
its global batch (grad_accum following), the other, taken where the run would not continue (its settings or the
rows changed), is a new run at the recipe's."""

from __future__ import annotations

from typing import List, Optional

from blockdraft.pipeline import commands, keys
from blockdraft.pipeline.process import command_stage
from blockdraft.pipeline.records import StageRecords, stage_key
from blockdraft.pipeline.runner import Stage
from blockdraft.pipeline.settings import PipelineSettings
from blockdraft.pipeline.train_batch import TrainBatch, plan_train_batch, unsplittable

RERUN_ADVICE = ("fix what it says, then rerun the same command (with a lower optim.lr or optim.grad_clip set, where it "
                "says so): a stopped run resumes from its last checkpoint")


def train_stage(s: PipelineSettings, cfg, use_store: bool, records: Optional[StageRecords] = None) -> Stage:
    forms = [train_form(s, cfg, use_store, batch) for batch in train_batches(s, cfg, use_store, records)]
    for form, otherwise in zip(forms, forms[1:]):
        form.otherwise = otherwise
    return forms[0]


def train_batches(s: PipelineSettings, cfg, use_store: bool, records: Optional[StageRecords]) -> List[TrainBatch]:
    """The global batches the stage's forms train with (train_batch.py); refused here, before any stage runs, where
    the recorded run would continue at a global batch that this world size cannot split."""
    then = records.get("train") if records is not None else {}
    batches = plan_train_batch(s, cfg, then, "train" in s.force)
    if batches[0].grad_accum is None:
        if would_continue(s, cfg, use_store, batches[0], then):
            raise unsplittable(s, batches[0])
        batches = batches[1:]
    return batches


def would_continue(s: PipelineSettings, cfg, use_store: bool, batch: TrainBatch, then: dict) -> bool:
    """The recorded run, as far as can be told before the stages before it run: its own settings are the same at
    its global batch, or it stopped part way (a stopped run may continue under a new optim.lr)."""
    own = [keys.train_inputs(s, cfg, use_store, batch.rows)]
    if batch.former is not None:
        own.append(keys.former_train_inputs(s, cfg, use_store, batch.former.grad_accum, batch.former.world_size))
    return then.get("inputs_key") in [stage_key(inputs) for inputs in own] or not then.get("done")


def train_form(s: PipelineSettings, cfg, use_store: bool, batch: TrainBatch) -> Stage:
    from blockdraft.train.checkpoint import complete_checkpoints

    run_dir = s.paths()["run"]
    argv = commands.stage_argv("train", s, use_store, batch.words())

    def train() -> bool:
        # A run killed before its first checkpoint has nothing to resume.
        overwrite = [] if complete_checkpoints(run_dir) else ["overwrite=true"]
        return command_stage("train", [*argv, *overwrite], RERUN_ADVICE)()

    former = (keys.former_train_inputs(s, cfg, use_store, batch.former.grad_accum, batch.former.world_size)
              if batch.former is not None else None)
    return Stage("train", keys.train_inputs(s, cfg, use_store, batch.rows), train,
                 lambda: bool(complete_checkpoints(run_dir)), run_dir, moves=run_dir,
                 extent=keys.train_extent(cfg), joined=True,
                 resume_inputs=keys.train_resume_inputs(s, cfg, use_store, batch.rows),
                 former_inputs=former, notes={"batch": batch.record()}, changed=batch.change_from)

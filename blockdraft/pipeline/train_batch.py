"""The global batch the pipeline trains with (rows per optimizer step over every rank), which the train key holds
in place of the world size (keys.py). A run continued on another node count or train.nproc keeps the global batch
it was trained with: grad_accum follows, handed to training as train.grad_accum=, and training says so in one line.
A train.grad_accum= on the pipeline's command line is used as given: a global batch it changes is a new recipe,
so a new run (the old one moved aside, the line saying the global batch changed). So is a changed recipe
grad_accum or micro_batch_size. A world size that cannot split the run's global batch is refused before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from blockdraft.errors import ConfigError
from blockdraft.pipeline.settings import PipelineSettings
from blockdraft.train.global_batch import Batch, given_on_command_line, grad_accum_keeping, ranks, split_advice


@dataclass(frozen=True)
class TrainBatch:
    rows: int
    """The global batch: rows per optimizer step, all ranks together."""
    grad_accum: Optional[int]
    """What each rank accumulates, rows / (micro_batch_size x world size); None where that is no whole number."""
    asked: int
    """The grad_accum the recipe (or the command line) asks for; a run keeps its global batch while this stays."""
    micro_batch_size: int
    world_size: int
    former: Optional[Batch] = None
    """The split of a run recorded before the train key held the global batch, where it trained these rows."""

    def record(self) -> dict:
        """What the train stage's record keeps of it, for the next run to continue with."""
        return {"rows": self.rows, "micro_batch_size": self.micro_batch_size, "grad_accum": self.grad_accum,
                "asked_grad_accum": self.asked, "world_size": self.world_size}

    def words(self) -> List[str]:
        """The training override that keeps the run's global batch, where the recipe's grad_accum would not."""
        return [] if self.grad_accum == self.asked else [f"train.grad_accum={self.grad_accum}"]

    def change_from(self, record: dict) -> str:
        """The global batch's change against a record, for the line that says why a run is moved aside."""
        before = (record.get("batch") or {}).get("rows")
        return f"the global batch: {before} -> {self.rows} rows per step" if before not in (None, self.rows) else ""


def world_size(s: PipelineSettings) -> int:
    return s.nproc * int(s.torchrun.get("nnodes", 1))


def plan_train_batch(s: PipelineSettings, cfg, record: dict, forced: bool = False) -> List[TrainBatch]:
    """The global batches training may run with, the first that continues the recorded run taken (runner.choose):
    the run in <out>/run's own, where the recipe's batch settings are those it was started with and another world
    size would change it; and always micro_batch_size x grad_accum x ranks, the recipe's, for a new run."""
    t, world = cfg.train, world_size(s)
    ran, former = trained_batch(s, record)
    fresh_rows = t.micro_batch_size * t.grad_accum * world
    keeps = (ran is not None and not forced and not given_on_command_line(s.recipe) and ran["rows"] != fresh_rows
             and (ran["micro_batch_size"], ran["asked_grad_accum"]) == (t.micro_batch_size, t.grad_accum))
    fresh = TrainBatch(fresh_rows, t.grad_accum, t.grad_accum, t.micro_batch_size, world,
                       former if former is not None and former.rows == fresh_rows else None)
    if not keeps:
        return [fresh]
    kept = TrainBatch(ran["rows"], grad_accum_keeping(ran["rows"], t.micro_batch_size, world), t.grad_accum,
                      t.micro_batch_size, world, former)
    return [kept, fresh]


def unsplittable(s: PipelineSettings, batch: TrainBatch) -> ConfigError:
    nodes = int(s.torchrun.get("nnodes", 1))
    return ConfigError(
        f"{ranks(batch.world_size)} (train.nproc={s.nproc} x train.nnodes={nodes}) cannot continue the run in "
        f"{s.paths()['run']}: its global batch of {batch.rows} rows per step at train.micro_batch_size="
        f"{batch.micro_batch_size} does not split evenly over them; continue it "
        f"{split_advice(batch.rows, batch.micro_batch_size, batch.world_size)} (train.nproc x train.nnodes), or give "
        f"train.grad_accum= for a new run with another global batch (this one is then kept in {s.root / 'superseded'}).")


def trained_batch(s: PipelineSettings, record: dict) -> tuple:
    """(the batch of the run in <out>/run as its record keeps it, or None where there is no checkpoint to continue;
    the split of a run recorded before the train key held the global batch, read from its last checkpoint)."""
    from blockdraft.train.checkpoint import checkpoint_batch, complete_checkpoints

    found = complete_checkpoints(s.paths()["run"])
    if not found or not record.get("key"):
        return None, None
    if record.get("batch"):
        return record["batch"], None
    split = checkpoint_batch(Path(found[-1]))
    return {"rows": split.rows, "micro_batch_size": split.micro_batch_size, "asked_grad_accum": split.grad_accum}, split

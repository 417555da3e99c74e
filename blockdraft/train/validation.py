"""Validation on held-out rows: the same step without gradients, with a fixed anchor draw.

The rows are cut into global micro-batches of consecutive rows, dealt to the ranks in turn (batch b to rank
b % world), each with an anchor generator seeded by b: the blocks drawn and the sums are those of one process
running every batch, whatever the world size. Every rank runs the same number of batches, since each one's
forward enters collectives (the target's per-layer all-gathers under distributed.target_sharding=fsdp, the
draft's under train.draft_sharding=fsdp): a rank short of batches runs a stand-in batch whose sums are
discarded. Fewer rows than ranks works the same way.
"""

from __future__ import annotations

import math

import torch

from blockdraft.data.dataset import collate
from blockdraft.ranks.distributed import all_reduce_sums
from blockdraft.train.logger import summarize
from blockdraft.train.parallelize import run_step
from blockdraft.train.step import train_step

VAL_SEED = 12345


def rounds_and_batches(num_rows: int, batch_size: int, rank: int, world: int):
    """(rounds every rank runs, [(global batch index, rows) of this rank's real batches])."""
    num_batches = math.ceil(num_rows / batch_size)
    mine = [(b, range(b * batch_size, min(num_rows, (b + 1) * batch_size))) for b in range(rank, num_batches, world)]
    return math.ceil(num_batches / world), mine


@torch.no_grad()
def evaluate(trainer, dataset, batch_size: int | None = None) -> dict:
    """Metrics over every row of `dataset` (batches dealt over the ranks), prefixed with `val/`."""
    model, dist = trainer.model, trainer.dist
    model.eval()
    size = batch_size or trainer.cfg.train.micro_batch_size
    pad = trainer.tokenizer.pad_token_id or 0
    rounds, mine = rounds_and_batches(len(dataset), size, dist.rank, dist.world_size)
    totals = None
    for turn in range(rounds):
        real = turn < len(mine)
        index, rows = mine[turn] if real else (0, range(1))  # the stand-in: row 0, its sums dropped below
        batch = collate([dataset[i] for i in rows], pad_id=pad)
        batch = {k: v.to(trainer.device) for k, v in batch.items()}
        generator = torch.Generator().manual_seed(VAL_SEED + index)
        with trainer._autocast():
            result = run_step(model, train_step, trainer.target, batch, trainer.cfg.train, generator, trainer.backend)
        sums = {k: v.detach().float().cpu() if real else torch.zeros(v.shape) for k, v in result.sums.items()}
        totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
    totals = all_reduce_sums(totals, trainer.device)
    return {f"val/{k}": v for k, v in summarize(totals).items()}

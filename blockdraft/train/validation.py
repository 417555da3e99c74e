"""Validation on held-out rows: the same step without gradients, with a fixed anchor draw."""

from __future__ import annotations

import torch

from blockdraft.data.dataset import collate
from blockdraft.train.distributed import all_reduce_sum
from blockdraft.train.logger import summarize
from blockdraft.train.parallelize import run_step
from blockdraft.train.step import train_step


@torch.no_grad()
def evaluate(trainer, dataset, batch_size: int | None = None) -> dict:
    """Metrics over every row of `dataset` (rows split across ranks), prefixed with `val/`."""
    model, dist = trainer.model, trainer.dist
    model.eval()
    # A fixed generator: every validation draws the same blocks, so values are comparable.
    generator = torch.Generator().manual_seed(12345 + dist.rank)
    size = batch_size or trainer.cfg.train.micro_batch_size
    pad = trainer.tokenizer.pad_token_id or 0
    mine = list(range(dist.rank, len(dataset), dist.world_size))
    totals = None
    for start in range(0, len(mine), size):
        batch = collate([dataset[i] for i in mine[start:start + size]], pad_id=pad)
        batch = {k: v.to(trainer.device) for k, v in batch.items()}
        with trainer._autocast():
            result = run_step(model, train_step, trainer.target, batch, trainer.cfg.train, generator, trainer.backend)
        sums = {k: v.detach().float().cpu() for k, v in result.sums.items()}
        totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
    totals = {k: all_reduce_sum(v.to(trainer.device)).cpu() for k, v in totals.items()}
    return {f"val/{k}": v for k, v in summarize(totals).items()}

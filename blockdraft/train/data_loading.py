"""Datasets and a resumable, rank-sharded order of micro-batches.

The order of epoch e is DistributedSampler's with seed `seed` and epoch e, so a resumed
run that skips the micro-batches it already consumed sees exactly the same data.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import DataLoader, DistributedSampler

from blockdraft.data.builtin_prompts import builtin_prompt_set
from blockdraft.data.dataset import collate, prepare_dataset
from blockdraft.errors import DataError
from blockdraft.train.anchors import valid_anchor_mask
from blockdraft.train.distributed import DistInfo, barrier


def ensure_builtin_data(cfg, target_model, tokenizer, dist: DistInfo) -> None:
    """Recipes like tiny_cpu answer built-in prompts with the target when the files are missing."""
    from blockdraft.data.regen import regenerate_with_transformers

    prep = cfg.prepare
    if prep.regenerate_builtin is None:
        return
    if dist.is_main:
        splits = [(cfg.data.train, 0, prep.num_train), (cfg.data.val, prep.num_train, prep.num_val)]
        for path, skip, n in splits:
            if path and not _complete(Path(path), n):
                prompts = builtin_prompt_set(prep.regenerate_builtin, n, skip=skip)
                regenerate_with_transformers(target_model, tokenizer, prompts, path, prep.max_new_tokens,
                                             chat_template_kwargs=dict(cfg.data.chat_template_kwargs), progress=cfg.train.progress)
    barrier()


def _complete(path: Path, n: int) -> bool:
    if not path.exists():
        return False
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    try:
        json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return False
    return len(lines) >= n


def load_split(path, tokenizer, data_cfg, name: str, dist: DistInfo, block_size: int):
    """Rank 0 tokenises (and fills the cache) first, the others then read the cache."""
    if not dist.is_main:
        barrier()
    dataset, _report = prepare_dataset(path, tokenizer, data_cfg)  # logs its reject report itself
    if dist.is_main:
        barrier()
    _require_anchors(dataset, block_size, name, path)
    return dataset


def _require_anchors(dataset, block_size: int, name: str, path, sample: int = 2000) -> None:
    """Refuse data where no block fits on an assistant token: training would only skip steps."""
    for i in range(min(len(dataset), sample)):
        batch = collate([dataset[i]], pad_id=0)
        if valid_anchor_mask(batch["loss_mask"], batch["attention_mask"], batch["document_ids"], block_size).any():
            return
    raise DataError(
        f"data.{name}={path}: no row has an assistant token followed by a whole block of "
        f"{block_size} tokens, so no anchor can be drawn. Use longer responses, a larger "
        "data.seq_length, or a smaller draft.block_size."
    )


class MicroBatches:
    """Iterates micro-batches forever, epoch after epoch; `position` is saved in checkpoints."""

    def __init__(self, dataset, batch_size: int, pad_id: int, dist: DistInfo, seed: int, num_workers: int = 0):
        if len(dataset) < dist.world_size * batch_size:
            raise DataError(
                f"{len(dataset)} usable rows cannot fill one micro-batch of {batch_size} on each of "
                f"{dist.world_size} ranks; lower train.micro_batch_size or add rows."
            )
        self.dataset, self.batch_size, self.dist, self.seed = dataset, batch_size, dist, seed
        self.collate = partial(collate, pad_id=pad_id)
        self.num_workers = num_workers
        self.epoch, self.offset = 0, 0

    def _loader(self):
        sampler = DistributedSampler(self.dataset, self.dist.world_size, self.dist.rank, shuffle=True, seed=self.seed, drop_last=True)
        sampler.set_epoch(self.epoch)
        indices = list(sampler)[self.offset * self.batch_size:]
        return DataLoader(torch.utils.data.Subset(self.dataset, indices), batch_size=self.batch_size,
                          collate_fn=self.collate, num_workers=self.num_workers, drop_last=True)

    def __iter__(self):
        while True:
            for batch in self._loader():
                self.offset += 1
                yield batch
            self.epoch, self.offset = self.epoch + 1, 0

    @property
    def position(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def restore(self, position: dict) -> None:
        self.epoch, self.offset = position["epoch"], position["offset"]

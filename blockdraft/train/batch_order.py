"""The order training takes its rows in: a resumable, world-size-independent plan of each rank's micro-batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from blockdraft.data.dataset import collate
from blockdraft.errors import DataError
from blockdraft.ranks.distributed import DistInfo


@dataclass(frozen=True)
class MicroBatch:
    rows: List[int]  # dataset indices, in the micro-batch's order
    seed: int  # of its anchor generator

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed)


@dataclass(frozen=True)
class StepPlan:
    rows: List[int]  # the whole step's rows, every rank's (a skipped step names them)
    micro: List[MicroBatch]  # this rank's
    position: dict  # the data position once this step is taken


class GlobalBatches:
    """World-size-independent data order: step k of epoch e takes rows
    perm_e[k*G : (k+1)*G] (G = micro_batch_size * grad_accum * world_size), and rank r's
    micro-batch i is the slice (r*grad_accum + i). One process with grad_accum = W*A sees
    exactly the rows W ranks with grad_accum = A see, in the same micro-batch order; each
    micro-batch also gets its own anchor generator, seeded by its global index, so the
    blocks drawn do not depend on how the work is split either. The saved position is a
    sample count, so a run resumes on another world size.

    perm_e is drawn once per epoch and kept as a tensor (8 bytes a row): a step reads its slice of it, where
    drawing it again each step cost a million-row run tens of milliseconds a step on every rank."""

    def __init__(self, dataset, micro_batch_size: int, grad_accum: int, pad_id: int, dist: DistInfo, seed: int):
        self.global_micro = micro_batch_size * grad_accum * dist.world_size
        if len(dataset) < self.global_micro:
            raise DataError(
                f"{len(dataset)} usable rows cannot fill one global batch of {self.global_micro} "
                f"(micro_batch_size {micro_batch_size} x grad_accum {grad_accum} x {dist.world_size} ranks); "
                "lower train.micro_batch_size or train.grad_accum, or add rows."
            )
        self.dataset, self.mbs, self.accum, self.dist, self.seed = dataset, micro_batch_size, grad_accum, dist, seed
        self.pad_id = pad_id
        self.epoch, self.samples = 0, 0  # samples consumed in this epoch, all ranks together
        self.last_step_rows: list = []
        self._order, self._order_epoch = None, None

    def _permutation(self) -> torch.Tensor:
        if self._order_epoch != self.epoch:
            g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
            self._order, self._order_epoch = torch.randperm(len(self.dataset), generator=g), self.epoch
        return self._order

    def plan_step(self) -> StepPlan:
        """The rows and anchor seeds of the next optimizer step, which it then counts as taken."""
        if self.samples + self.global_micro > len(self.dataset):
            self.epoch, self.samples = self.epoch + 1, 0
        # Every rank knows the whole step's rows (the order is the same everywhere).
        rows = self._permutation()[self.samples:self.samples + self.global_micro].tolist()
        micro = []
        for i in range(self.accum):
            slot = self.dist.rank * self.accum + i
            index = (self.epoch * len(self.dataset) + self.samples + slot * self.mbs) // self.mbs  # global micro-batch index
            micro.append(MicroBatch(rows[slot * self.mbs:(slot + 1) * self.mbs], self.seed * 1_000_003 + index))
        self.samples += self.global_micro
        return StepPlan(rows, micro, self.position)

    def next_step(self) -> list:
        """This rank's micro-batches of the next optimizer step, read here: [(batch, anchor generator), ...]."""
        plan = self.plan_step()
        self.last_step_rows = plan.rows
        return [(collate([self.dataset[j] for j in m.rows], pad_id=self.pad_id), m.generator()) for m in plan.micro]

    @property
    def position(self) -> dict:
        return {"epoch": self.epoch, "samples": self.samples}

    def restore(self, position: dict) -> None:
        self.epoch, self.samples = position["epoch"], position["samples"]

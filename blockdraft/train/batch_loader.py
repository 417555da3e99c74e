"""The training thread's micro-batches, read and collated ahead by a torch DataLoader while it computes.

`GlobalBatches` (batch_order.py) plans the order; here a DataLoader's workers (train.loader_workers) read each
planned micro-batch's rows from the token file or the feature store and collate them, a few micro-batches
ahead, into pinned memory when the device is a GPU, so the copy to it does not wait for the host. The training
thread receives exactly the micro-batches and anchor generators `GlobalBatches.next_step` gives, in its
order. The position a checkpoint saves is that of the steps the training thread has taken, never of those
read ahead, so a resume continues at the next step not taken. With 0 workers the same loader reads in the
training thread, as before.
"""

from __future__ import annotations

import atexit
import signal
import weakref
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from blockdraft.data.dataset import collate
from blockdraft.errors import ConfigError
from blockdraft.train.batch_order import GlobalBatches, MicroBatch, StepPlan

# Micro-batches each worker reads ahead (torch's default): the workers together stay this many per worker
# ahead of the training thread, which bounds the host memory they hold.
PREFETCH_PER_WORKER = 2
ALIGN = 64  # bytes: where each tensor starts in a packed micro-batch


@dataclass(frozen=True)
class _Planned:
    micro: MicroBatch
    step: Optional[StepPlan]  # on a step's first micro-batch only


class _Plans(Sampler):
    """Every micro-batch from the order's position on, in training order; endless (epochs follow each other).
    It runs in the training process, ahead of the training thread by what the workers read ahead."""

    def __init__(self, order: GlobalBatches):
        self.order = order

    def __iter__(self) -> Iterator[_Planned]:
        while True:
            plan = self.order.plan_step()
            for i, micro in enumerate(plan.micro):
                yield _Planned(micro, plan if i == 0 else None)


def pack(batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, list]:
    """A collated micro-batch as one byte buffer and where each tensor lies in it. A tensor crosses from a worker
    as a shared-memory descriptor the receiver fetches from it, one round trip each: one buffer makes one (and
    one pinned copy)."""
    layout, size = [], 0
    for key, t in batch.items():
        nbytes = t.numel() * t.element_size()
        layout.append((key, t.dtype, tuple(t.shape), size, nbytes))
        size += -(-nbytes // ALIGN) * ALIGN
    buffer = torch.empty(size, dtype=torch.uint8)
    for (_, _, _, at, nbytes), t in zip(layout, batch.values()):
        buffer[at:at + nbytes].copy_(t.contiguous().view(-1).view(torch.uint8))
    return buffer, layout


def unpack(packed: Tuple[torch.Tensor, list]) -> Dict[str, torch.Tensor]:
    buffer, layout = packed
    return {key: buffer[at:at + nbytes].view(dtype).view(shape) for key, dtype, shape, at, nbytes in layout}


class _Reader(Dataset):
    """A planned micro-batch's rows, read and collated (in a worker: packed for the way back)."""

    def __init__(self, dataset, pad_id: int, packed: bool):
        self.dataset, self.pad_id, self.packed = dataset, pad_id, packed

    def __getitem__(self, planned: _Planned):
        batch = collate([self.dataset[j] for j in planned.micro.rows], pad_id=self.pad_id)
        return planned, (pack(batch) if self.packed else batch)

    def __len__(self) -> int:
        return len(self.dataset)


def _as_read(item):
    return item


def _keep_running_on_sigterm(_worker_id: int) -> None:
    # A scheduler's SIGTERM asks the run to finish its step and save (loop.py); a worker it killed would fail
    # the step that needs its next batch first. The training process stops its workers itself (close()).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


_open = weakref.WeakSet()


@atexit.register
def _close_open_loaders() -> None:
    # Before multiprocessing's own exit hook (registered earlier, so run later), whose SIGTERM the workers ignore.
    for loader in list(_open):
        loader.close()


def check_loader_workers(workers: int) -> None:
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise ConfigError(f"train.loader_workers={workers!r}: give the number of processes that read batches ahead "
                          "of the step (an integer, 2 by default), or 0 to read them in the training thread.")


class BatchLoader:
    """`next_step()`, `last_step_rows`, `position` and `restore` as `GlobalBatches` has them, the rows read ahead."""

    def __init__(self, order: GlobalBatches, workers: int, pin_memory: bool = False):
        check_loader_workers(workers)
        self.order = order  # its own position runs ahead: it is where the reading has got to
        self.accum = order.accum
        self._position = order.position  # after the steps the training thread has taken
        self.last_step_rows: list = []
        self._iterator = None
        self._owed = 0  # micro-batches of the step in progress not yet taken
        self._loader = DataLoader(
            _Reader(order.dataset, order.pad_id, packed=workers > 0), sampler=_Plans(order), batch_size=None,
            collate_fn=_as_read, num_workers=workers, pin_memory=pin_memory,
            prefetch_factor=PREFETCH_PER_WORKER if workers else None,
            worker_init_fn=_keep_running_on_sigterm if workers else None,
            # Forked, the workers share the mapped token file and the store's handles; spawned, each would get a
            # pickled copy of the dataset (a million rows' tokens).
            multiprocessing_context="fork" if workers else None,
            # The loader draws its workers' base seed: from its own generator, not the global one a
            # checkpoint saves and a resume restores.
            generator=torch.Generator(),
        )

    def next_step(self) -> Iterator[Tuple[dict, torch.Generator]]:
        """This rank's micro-batches of the next optimizer step, (batch, anchor generator) each, taken as the
        caller iterates; the step counts as taken from this call on."""
        while self._owed:  # a step left part way (an error in it): its rest is not the next step's
            self._take()
        planned, batch = self._take()
        if planned.step is None:
            raise RuntimeError("the batch loader lost its place in the step order; this is a bug in blockdraft")
        self.last_step_rows, self._position = planned.step.rows, planned.step.position
        self._owed = self.accum - 1
        return self._step(planned, batch)

    def _step(self, planned: _Planned, batch: dict):
        yield batch, planned.micro.generator()
        while self._owed:
            planned, batch = self._take()
            yield batch, planned.micro.generator()

    def _take(self) -> Tuple[_Planned, dict]:
        if self._iterator is None:
            self._iterator = iter(self._loader)
            _open.add(self)
        planned, batch = next(self._iterator)
        self._owed = max(0, self._owed - 1)
        return planned, (batch if isinstance(batch, dict) else unpack(batch))

    @property
    def position(self) -> dict:
        return dict(self._position)

    def restore(self, position: dict) -> None:
        """Continue at `position`: what was read ahead is dropped."""
        self.close()
        self.order.restore(position)
        self._position = dict(position)

    def close(self) -> None:
        """Stop the workers and drop what they read ahead; a later `next_step` starts them again at the step after
        the last one taken."""
        iterator, self._iterator = self._iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()  # asks each worker to stop; its SIGTERM to one still busy is ignored: killed below
        for worker in getattr(iterator, "_workers", []):
            if worker.is_alive():
                worker.kill()
                worker.join()
        _open.discard(self)
        self.order.restore(self._position)
        self._owed = 0

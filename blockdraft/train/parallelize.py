"""Where a training run's parallelism is applied, in one place (as torchtitan's parallelize.py):
how the frozen target is spread over the ranks (target_sharding.py) and how the draft is
wrapped for data parallelism. The loop only calls these."""

from __future__ import annotations

from torch import nn

from blockdraft.train.distributed import DistInfo
from blockdraft.train.target_sharding import shard_target

__all__ = ["parallelize_draft", "shard_target"]


def parallelize_draft(draft: nn.Module, dist: DistInfo) -> nn.Module:
    """The module the loop runs forward and backward through: the draft itself on one process,
    DDP (replicated, gradients all-reduced) over several."""
    if not dist.enabled:
        return draft
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [dist.device.index] if dist.device.type == "cuda" else None
    return DDP(draft, device_ids=ids)

"""Where training's parallelism is applied, in one place (as torchtitan's parallelize.py): how the
frozen target is spread over the ranks (models/target_sharding.py) and how the draft is spread over them
(train.draft_sharding). The training loop only calls these; which of a capture's shards each rank runs is
the capture's own plan (capture/shard_split.py rank_shards).

ddp:  the draft replicated on every rank, gradients all-reduced (DistributedDataParallel).
fsdp: the draft's parameters, gradients and optimizer state sharded over the ranks (FSDP2
      `fully_shard`), gathered for the micro-step in train.dtype and reduce-scattered in float32.
One process holds the plain draft either way.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from blockdraft.errors import ConfigError
from blockdraft.models.target_sharding import load_sharded_target, loads_by_shard, shard_target
from blockdraft.ranks.distributed import DistInfo

__all__ = ["DRAFT_SHARDINGS", "check_draft_sharding", "gradient_sync", "load_sharded_target", "loads_by_shard",
           "parallelize_draft", "run_step", "shard_target"]

DRAFT_SHARDINGS = ("ddp", "fsdp")


def check_draft_sharding(strategy: str, optim_name: str) -> None:
    """Refused before anything loads (train's check_config)."""
    if strategy not in DRAFT_SHARDINGS:
        raise ConfigError(f"train.draft_sharding={strategy!r}; use one of {list(DRAFT_SHARDINGS)}.")
    if strategy == "fsdp" and optim_name == "muon":
        # Newton-Schulz orthogonalises whole matrices; a rank holds a slice of each one.
        raise ConfigError("optim.name=muon with train.draft_sharding=fsdp: Muon orthogonalises whole weight matrices "
                          "and each rank holds only a shard of them; set optim.name=adamw, or train.draft_sharding=ddp.")


class ShardedDraft(nn.Module):
    """The FSDP2 unit: the whole micro-step's use of the draft runs inside this module's forward.

    The step uses the draft beyond its forward: every layer's key/value projections on the context
    (context_kv) before it, the head and the corrections of Domino / DSpark / DFlash2 after it. FSDP2
    gathers parameters in a unit's forward and reduce-scatters its gradients once the gradients of
    that forward's inputs are computed. Units per layer would reduce-scatter a layer's gradients
    before its key/value projections' share arrives, and leave the parameters used outside forward
    sharded. One unit over the draft, whose forward takes no input that needs a gradient, gathers
    the draft once per micro-step and reduce-scatters after the whole backward (FSDP2's final
    callback): parameters, gradients and optimizer state stay sharded between steps."""

    def __init__(self, draft: nn.Module):
        super().__init__()
        self.module = draft  # the name DDP uses: code that unwraps `.module` finds the draft

    def forward(self, step_fn, *args, **kwargs):
        result = step_fn(self.module, *args, **kwargs)
        return result.loss, result  # the loss as a tensor output: FSDP2 hooks its backward


def parallelize_draft(draft: nn.Module, dist: DistInfo, strategy: str = "ddp", dtype: torch.dtype = torch.float32) -> nn.Module:
    """The module the loop runs the micro-step through: the draft itself on one process, DDP or FSDP2 over
    several. The optimizer is built after this call: FSDP2 replaces the draft's parameters with shards."""
    if not dist.enabled:
        return draft
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(dist.device.type, (dist.world_size,))
        # Gathered in the step's dtype (bf16 halves the all-gather and the gathered copy), gradients reduced
        # in float32, the sharded master weights and AdamW's moments kept in float32.
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
        return fully_shard(ShardedDraft(draft), mesh=mesh, mp_policy=policy)
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [dist.device.index] if dist.device.type == "cuda" else None
    return DDP(draft, device_ids=ids)


def run_step(model: nn.Module, step_fn, *args, **kwargs):
    """`step_fn(draft, *args)` (train_step) through the parallel wrapper: inside FSDP2's forward for fsdp,
    directly otherwise (DDP hooks the draft's own forward, which step_fn calls)."""
    if isinstance(model, ShardedDraft):
        return model(step_fn, *args, **kwargs)[1]
    return step_fn(model, *args, **kwargs)


def gradient_sync(model: nn.Module, sync: bool):
    """A context for one micro-step's backward: gradients synchronised over the ranks (sync) or only
    accumulated locally, as every micro-step but a step's last is (DDP's no_sync; FSDP2's
    set_requires_gradient_sync)."""
    if isinstance(model, ShardedDraft):
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    if sync or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """clip_grad_norm_ over sharded (DTensor) gradients returns a DTensor: the global norm as a plain tensor."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def release_gathered(model: nn.Module) -> None:
    """After a forward without backward (validation) the FSDP2 root keeps the gathered draft: free it."""
    if isinstance(model, ShardedDraft):
        model.reshard()

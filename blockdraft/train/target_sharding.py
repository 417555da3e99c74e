"""How the frozen target is spread over the data-parallel ranks.

none: every rank loads and holds the whole target (fastest when it fits: no gather per layer).
fsdp: the target is built on the meta device, its decoder layers sharded with FSDP2 (`fully_shard`)
      over all ranks, and each rank reads from the safetensors only its own rows of each layer's
      tensors (shard_reader.py), so no rank ever holds the whole target. Layers after the deepest
      `target_layer_ids` are not built unless the teacher needs the target's final hidden states
      (online soft labels). The embeddings, final norm and head stay whole on every rank, since the
      draft reads them directly. A forward gathers one layer at a time. Memory per rank ~
      (kept layers / world size) + one gathered layer + embeddings and head.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from blockdraft.errors import ConfigError
from blockdraft.train.cpu_allocator import return_large_frees
from blockdraft.train.distributed import DistInfo

STRATEGIES = ("none", "fsdp")


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"distributed.target_sharding={strategy!r}; use one of {list(STRATEGIES)} "
            "(tensor parallelism of the target is not supported yet)."
        )


def loads_by_shard(strategy: str, dist: DistInfo) -> bool:
    check_strategy(strategy)
    return strategy == "fsdp" and dist.enabled


@contextmanager
def parameters_on_meta():
    """Modules built inside get their parameters on the meta device (no memory, no init work) while their
    buffers (rotary frequencies and the like, computed at construction and not always saved) stay real."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def load_sharded_target(path: str, layer_ids, keep_all_layers: bool, dtype: torch.dtype, dist: DistInfo) -> nn.Module:
    """The target as `load_causal_lm` gives it, but with its decoder layers FSDP2-sharded as they are read."""
    from blockdraft.models.shard_reader import ShardReader
    from blockdraft.models.target import causal_lm_class
    from blockdraft.models.target_families import backbone_of, family_of

    model_class, config = causal_lm_class(path)
    with parameters_on_meta():
        model = model_class._from_config(config, dtype=dtype)
    backbone = backbone_of(model, family_of(config.architectures))
    if not keep_all_layers:
        # Nothing reads past the deepest captured layer: those layers are never built.
        backbone.layers = nn.ModuleList(list(backbone.layers)[: max(layer_ids) + 1])
    shard_layers(backbone.layers, dist)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=dist.device)
    model.tie_weights()  # a tied head is the embedding table again after to_empty
    reader = ShardReader(path, model)
    _fill(model, reader, buffers)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def _fill(model: nn.Module, reader, built_buffers: dict) -> None:
    from blockdraft.models.shard_reader import local_rows

    for name, param in model.named_parameters():
        start, stop = local_rows(param)
        local = param.to_local() if hasattr(param, "to_local") else param
        if stop > start:
            local.copy_(reader.rows(name, start, stop))
    for name, buffer in model.named_buffers():
        if reader.has(name):  # persistent buffers come from the checkpoint, as from_pretrained reads them
            buffer.copy_(reader.rows(name, 0, buffer.shape[0]) if buffer.dim() else reader.rows(name, 0, 0))
        else:
            buffer.copy_(built_buffers[name])


def shard_target(model: nn.Module, strategy: str, dist: DistInfo) -> nn.Module:
    """A whole target (loaded on every rank) sharded after the fact: what a recipe's built-in data needs, since
    rank 0 answers its prompts with the whole target first."""
    check_strategy(strategy)
    if strategy == "none" or not dist.enabled:
        return model
    from blockdraft.models.target_families import backbone_of, family_of

    shard_layers(backbone_of(model, family_of(model.config.architectures)).layers, dist)
    return model


def shard_layers(layers: nn.ModuleList, dist: DistInfo) -> None:
    """Each layer an FSDP2 unit. Said explicitly, every one reshards after its forward: each is its own root here
    (the embeddings and head stay whole), and FSDP2 by default keeps a root gathered after its forward, so a
    whole forward would leave the whole target gathered on every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if dist.device.type == "cpu":
        return_large_frees()  # else each layer gathered on a CPU rank stays resident after its free
    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)

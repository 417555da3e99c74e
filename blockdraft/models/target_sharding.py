"""How the frozen target is spread over the data-parallel ranks.

none: every rank loads and holds the whole target (fastest when it fits: no gather per layer).
fsdp: the target is built on the meta device, its decoder layers sharded with FSDP2 (`fully_shard`)
      and each rank reads from the safetensors only its own rows of each layer's tensors
      (shard_reader.py), so no rank ever holds the whole target. Layers after the deepest
      `target_layer_ids` are not built unless the teacher needs the target's final hidden states
      (online soft labels). The embeddings, final norm and head stay whole on every rank, since the
      draft reads them directly.

The layers are sharded over a mesh (distributed.target_mesh): `global` over every rank, `node` over the
ranks of each node and replicated across nodes (HSDP), so a layer's all-gather stays on a node's links.

Each layer is an FSDP2 unit under one root that owns no parameter (`_LayersRoot`). A root is what FSDP2
keeps gathered after its forward (before torch 2.8 even when told to reshard), and what shares one set of
all-gather streams among its units; as units under a root, the layers reshard after their forward on every
torch with FSDP2, and layer i+1's all-gather is issued as layer i starts (forward prefetch), which FSDP2
can only do between units of one root. Memory per rank ~ (kept layers / shard group size) + embeddings and
head, and during a forward three layers' worth of gathers (the running layer, its all-gather buffer, the next
layer's all-gather).
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from typing import Optional

import torch
from torch import nn

from blockdraft.errors import ConfigError
from blockdraft.ranks.cpu_allocator import return_large_frees
from blockdraft.ranks.distributed import DistInfo, all_gather_object

STRATEGIES = ("none", "fsdp")
MESHES = ("global", "node")
# torch.distributed.fsdp.fully_shard (FSDP2 under its public name) is there from 2.6 on.
MIN_TORCH = "2.6"


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"distributed.target_sharding={strategy!r}; use one of {list(STRATEGIES)} "
            "(tensor parallelism of the target is not supported yet)."
        )
    if strategy == "fsdp":
        check_torch()


def check_torch() -> None:
    """A torch installed outside pyproject's range (a GPU machine's own) is refused before anything loads."""
    from torch.torch_version import TorchVersion

    if TorchVersion(torch.__version__) < MIN_TORCH:
        raise ConfigError(
            f"distributed.target_sharding=fsdp needs torch >= {MIN_TORCH} (FSDP2's torch.distributed.fsdp.fully_shard); "
            f"this is torch {torch.__version__}. Install a torch that pyproject.toml allows, or set "
            "distributed.target_sharding=none."
        )


def check_target_mesh(mesh: str, strategy: str, environ=None) -> None:
    """distributed.target_mesh, checked against the launch torchrun made (its WORLD_SIZE and LOCAL_WORLD_SIZE);
    a process started without them (one process, a pipeline checking its stages) has only the value checked."""
    if mesh not in MESHES:
        raise ConfigError(
            f"distributed.target_mesh={mesh!r}; use one of {list(MESHES)} (global: each target layer sharded over "
            "every rank; node: over the ranks of each node, replicated across nodes)."
        )
    if mesh == "global":
        return
    if strategy != "fsdp":
        raise ConfigError(
            f"distributed.target_mesh=node says how distributed.target_sharding=fsdp spreads the target, but "
            f"distributed.target_sharding={strategy}; set distributed.target_sharding=fsdp, or leave "
            "distributed.target_mesh=global."
        )
    env = os.environ if environ is None else environ
    world = int(env.get("WORLD_SIZE", "1"))
    if world > 1:
        _node_shape(world, [env.get("LOCAL_WORLD_SIZE")])


def _node_shape(world: int, local_sizes: list) -> tuple:
    """(nodes, ranks per node) from every rank's LOCAL_WORLD_SIZE; torchrun numbers a node's ranks consecutively,
    so rank // ranks per node is the node."""
    if None in local_sizes:
        raise ConfigError(
            "distributed.target_mesh=node finds the nodes from LOCAL_WORLD_SIZE, which torchrun sets and this "
            "launch did not; launch with torchrun (--nnodes, --nproc_per_node), or set distributed.target_mesh=global."
        )
    sizes = sorted({int(s) for s in local_sizes})
    if len(sizes) > 1:
        raise ConfigError(
            f"distributed.target_mesh=node: the nodes run different numbers of ranks ({sizes}); run the same "
            "--nproc_per_node on every node, or set distributed.target_mesh=global."
        )
    local = sizes[0]
    if local < 1 or world % local:
        raise ConfigError(
            f"distributed.target_mesh=node: WORLD_SIZE={world} is not a whole number of nodes of "
            f"LOCAL_WORLD_SIZE={local} ranks; run the same --nproc_per_node on every node, or set "
            "distributed.target_mesh=global."
        )
    return world // local, local


def target_device_mesh(kind: str, dist: DistInfo):
    """The mesh the layers are sharded over: 1-D over every rank (global), or (nodes, ranks per node) (node):
    FSDP2 replicates along the first dim and shards along the second (HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh

    check_target_mesh(kind, "fsdp", environ={})
    if kind == "node":
        # Every rank's LOCAL_WORLD_SIZE, so that every rank refuses a mixed launch alike instead of some
        # building one mesh and some another.
        seen = all_gather_object(os.environ.get("LOCAL_WORLD_SIZE"))
        nodes, local = _node_shape(dist.world_size, seen)
        if nodes > 1:
            return init_device_mesh(dist.device.type, (nodes, local), mesh_dim_names=("node", "local"))
        if dist.is_main:
            print(f"[train] distributed.target_mesh=node on one node is global: each target layer is sharded "
                  f"over this node's {local} ranks", flush=True)
    return init_device_mesh(dist.device.type, (dist.world_size,))


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


def load_sharded_target(path: str, layer_ids, keep_all_layers: bool, dtype: torch.dtype, dist: DistInfo,
                        mesh: str = "global") -> nn.Module:
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
    shard_layers(backbone, dist, mesh, deepest_captured=max(layer_ids))
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


def shard_target(model: nn.Module, strategy: str, dist: DistInfo, mesh: str = "global") -> nn.Module:
    """A whole target (loaded on every rank) sharded after the fact: what a recipe's built-in data needs, since
    rank 0 answers its prompts with the whole target first."""
    check_strategy(strategy)
    if strategy == "none" or not dist.enabled:
        return model
    from blockdraft.models.target_families import backbone_of, family_of

    shard_layers(backbone_of(model, family_of(model.config.architectures)), dist, mesh)
    return model


class _LayersRoot(nn.Module):
    """The FSDP2 root over the decoder layers. It holds no parameter of its own (the embeddings and final norm
    stay whole, outside FSDP), and its forward runs the backbone's: FSDP2's root hooks (stream setup, the last
    all-gather freed) wrap the whole layer loop."""

    def __init__(self, layers: nn.ModuleList):
        super().__init__()
        self.layers = layers

    def forward(self, run, *args, **kwargs):
        try:
            return run(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 (raised again by the caller, outside the root)
            # A capture that stops after its deepest layer raises out of the loop; returned instead, the
            # root's post-forward still runs, so the root never stays mid-forward into the next one.
            return _Raised(error)


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


def shard_layers(backbone: nn.Module, dist: DistInfo, mesh: str = "global", deepest_captured: Optional[int] = None) -> None:
    """Each decoder layer of `backbone` an FSDP2 unit resharded after its forward, under one parameterless root
    that the backbone's forward runs through; layer i prefetches layer i+1. `deepest_captured`: a features-only
    forward stops after that layer, so it does not prefetch the next one (a gather nothing would use)."""
    from torch.distributed.fsdp import fully_shard

    if dist.device.type == "cpu":
        return_large_frees()  # else each layer gathered on a CPU rank stays resident after its free
    device_mesh = target_device_mesh(mesh, dist)
    layers = backbone.layers
    for layer in layers:
        fully_shard(layer, mesh=device_mesh, reshard_after_forward=True)
    for i, (layer, following) in enumerate(zip(layers, layers[1:])):
        if i != deepest_captured:
            layer.set_modules_to_forward_prefetch([following])
    root = _LayersRoot(layers)
    fully_shard(root, mesh=device_mesh)
    inner = backbone.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        out = root(inner, *args, **kwargs)
        if not torch.is_grad_enabled():
            _forget_forward_order(root)
        if isinstance(out, _Raised):
            raise out.error
        return out

    # An attribute, not a submodule: the root adds no name to the model's parameters or state dict.
    backbone.forward = forward


def _forget_forward_order(root: _LayersRoot) -> None:
    """FSDP2 records each unit's forward, in order, for the backward's prefetch, and forgets it only after a
    backward. The frozen target never has one (it runs under no_grad): without this, every forward would add
    one entry per layer, for the whole run. Private state of FSDP2, read defensively: on a torch that keeps it
    elsewhere this does nothing."""
    from torch.distributed.fsdp import fully_shard

    order = getattr(getattr(fully_shard.state(root), "_comm_ctx", None), "post_forward_order", None)
    if order is not None:
        order.clear()
    for layer in root.layers:
        state = fully_shard.state(layer)
        groups = getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
        for group in groups:
            indices = getattr(group, "_post_forward_indices", None)
            if indices is not None:
                indices.clear()

"""Rows of a target's parameters read straight from its safetensors, so a rank reads only its shard.

A module's parameter names are not always the checkpoint's: transformers 5 renames some prefixes
(NemotronH's `backbone.` is `model.`) and fuses a mixture of experts' per-expert matrices into one
tensor (`experts.{e}.gate_proj.weight` and `up_proj.weight` become `experts.gate_up_proj` of shape
[E, 2I, H]). Its own conversion mapping says how; this reads the same mapping backwards for one
parameter and a range of rows along dim 0, which is the dim FSDP2 shards. For a fused experts
tensor, rows are experts, so a rank opens only its experts' tensors.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

import torch
from safetensors import safe_open
from torch import nn

from blockdraft.errors import ConfigError
from blockdraft.models.target_heads import tensor_files


def _natural(key: str) -> list:
    """Sort key that orders `experts.10` after `experts.9`."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def _conversions(model: nn.Module):
    """transformers' (renamings, converters) for this model; none on a release without them (4.x loads names as they are)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming
    except ImportError:
        return [], []
    transforms = get_model_conversion_mapping(model) or []
    return ([t for t in transforms if isinstance(t, WeightRenaming)],
            [t for t in transforms if isinstance(t, WeightConverter)])


def _check_layout(converter) -> None:
    """Only experts stacked along dim 0 (then, with several source patterns, joined along dim 1) are read;
    any other operation is refused, since this reader would get it wrong."""
    from transformers.core_model_loading import Concatenate, MergeModulelist

    ops = converter.operations
    stacks = len(ops) >= 1 and isinstance(ops[0], MergeModulelist) and ops[0].dim == 0
    joins = len(ops) == 1 or (len(ops) == 2 and isinstance(ops[1], Concatenate) and ops[1].dim == 1)
    if not (stacks and joins and len(converter.target_patterns) == 1):
        raise ConfigError(
            f"the target's checkpoint converts {converter.source_patterns} -> {converter.target_patterns} with "
            f"{[type(o).__name__ for o in ops]}, which loading by shard does not read; set "
            "distributed.target_sharding=none (every rank loads the whole target)."
        )


class ShardReader:
    """Module parameter name -> rows [start, stop) of it, read from the target directory's safetensors."""

    def __init__(self, directory: Path, model: nn.Module):
        self.directory = Path(directory)
        self.files = tensor_files(self.directory)
        renamings, converters = _conversions(model)
        wanted = dict(model.state_dict(keep_vars=True))
        # module name -> {source pattern (None: a plain tensor) -> file keys}
        sources: Dict[str, Dict[object, List[str]]] = defaultdict(lambda: defaultdict(list))
        self.fused: Dict[str, List[str]] = {}  # a fused tensor's source patterns, in the order they are joined
        if renamings or converters:
            from transformers.core_model_loading import rename_source_key

            prefix = getattr(model, "base_model_prefix", None)
            for key in self.files:
                name, pattern = rename_source_key(key, renamings, converters, prefix, wanted)
                sources[name][pattern].append(key)
                if pattern is not None:
                    converter = next(c for c in converters if pattern in c.source_patterns)
                    _check_layout(converter)
                    self.fused[name] = list(converter.source_patterns)
        else:
            for key in self.files:
                sources[key][None].append(key)
        self.sources = sources

    def has(self, name: str) -> bool:
        return name in self.sources

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) along dim 0 of module parameter `name`, in its checkpoint dtype."""
        found = self.sources.get(name)
        if found is None:
            raise ConfigError(
                f"target.path={self.directory}: no tensor in its safetensors for {name}; loading by shard "
                "reads each parameter by name. Set distributed.target_sharding=none to load it whole."
            )
        if name not in self.fused:
            (key,) = found[None]
            return self._slice(key, start, stop)
        # A fused experts tensor: row e is expert e, its source patterns concatenated along its first dim.
        per_pattern = [sorted(found[p], key=_natural) for p in self.fused[name]]
        experts = [torch.cat([self._slice(keys[e], None, None) for keys in per_pattern], dim=0)
                   for e in range(start, stop)]
        return torch.stack(experts) if experts else torch.empty(0)

    def _slice(self, key: str, start, stop) -> torch.Tensor:
        with safe_open(str(self.files[key]), framework="pt") as f:
            piece = f.get_slice(key)
            if start is None or len(piece.get_shape()) == 0:
                return piece[:] if len(piece.get_shape()) else f.get_tensor(key)
            return piece[start:stop]


def local_rows(param) -> Tuple[int, int]:
    """(start, stop) along dim 0 of the rows this rank holds of `param` (all of them unless it is an FSDP2 DTensor)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return 0, param.shape[0] if param.dim() else 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return offset[0], offset[0] + shape[0]

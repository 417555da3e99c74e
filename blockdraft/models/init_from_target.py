"""Start a draft from the target's own weights instead of noise.

The draft's decoder layers take the target's last layers (same names in Llama/Qwen
families: q/k/v/o projections, MLP, the two layer norms; q_norm/k_norm when the target
has them), and `fc` starts as a projection that passes the deepest captured feature
through. At step 0 the draft then already computes "one more target layer over the
target's deep features", which it refines, rather than learning language from scratch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import torch
from torch import nn

from blockdraft.errors import ConfigError

COPIED = (
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)


@torch.no_grad()
def init_draft_from_target(draft: nn.Module, target_model: nn.Module) -> List[str]:
    """Copies what fits by name and shape; returns the names copied (the rest keep their init)."""
    target_layers = target_model.model.layers
    first = len(target_layers) - draft.config.num_hidden_layers
    sources = [dict(target_layers[first + j].named_parameters()) for j in range(draft.config.num_hidden_layers)]
    final_norm = getattr(target_model.model, "norm", None)
    return _copy(draft, sources, None if final_norm is None else final_norm.weight)


@torch.no_grad()
def init_draft_from_safetensors(draft: nn.Module, target_path) -> List[str]:
    """The same copy from the target's safetensors, reading only the tensors it copies: training from a
    feature store never builds the target's decoder layers."""
    from blockdraft.models.target_heads import read_tensors, tensor_files
    from blockdraft.models.target_families import load_text_config

    directory = Path(target_path)
    files = tensor_files(directory)
    prefix = _backbone_prefix(files, directory)
    num_target_layers = load_text_config(directory).num_hidden_layers
    first = num_target_layers - draft.config.num_hidden_layers
    names = {f"{prefix}layers.{first + j}.{name}": (j, name)
             for j in range(draft.config.num_hidden_layers) for name in COPIED}
    wanted = [n for n in [*names, f"{prefix}norm.weight"] if n in files]
    tensors = read_tensors(files, wanted)
    sources: List[Dict[str, torch.Tensor]] = [{} for _ in range(draft.config.num_hidden_layers)]
    for full, (j, name) in names.items():
        if full in tensors:
            sources[j][name] = tensors[full]
    return _copy(draft, sources, tensors.get(f"{prefix}norm.weight"))


def _backbone_prefix(files, directory: Path) -> str:
    """Where the decoder layers live in the file ("model.", "model.language_model.", ...): the prefix
    under which layer 0's tensors are stored."""
    for name in files:
        head, sep, _ = name.partition("layers.0.")
        if sep and (not head or head.endswith(".")):
            return head
    raise ConfigError(f"target.path={directory}: no decoder layer tensors (`...layers.0.*`) in its safetensors; "
                      "init_from_target needs them. Drop init_from_target for this target.")


def _copy(draft: nn.Module, sources: List[Dict[str, torch.Tensor]], final_norm) -> List[str]:
    cfg = draft.config
    copied = []
    for j, layer in enumerate(draft.layers):
        for name, param in layer.named_parameters():
            source = sources[j].get(name) if name in COPIED else None
            if source is not None and source.shape == param.shape:
                param.copy_(source.to(param.dtype))
                copied.append(f"layers.{j}.{name}")
    if final_norm is not None and final_norm.shape == draft.norm.weight.shape:
        draft.norm.weight.copy_(final_norm.to(draft.norm.weight.dtype))
        copied.append("norm.weight")
    if cfg.hidden_size == cfg.target_hidden_size:
        draft.fc.weight.zero_()
        last = (len(cfg.target_layer_ids) - 1) * cfg.target_hidden_size
        draft.fc.weight[:, last:].copy_(torch.eye(cfg.hidden_size))
        copied.append("fc.weight (identity on the deepest feature)")
    return copied

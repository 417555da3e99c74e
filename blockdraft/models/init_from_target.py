"""Start a draft from the target's own weights instead of noise.

The draft's decoder layers take the target's last layers (same names in Llama/Qwen
families: q/k/v/o projections, MLP, the two layer norms; q_norm/k_norm when the target
has them), and `fc` starts as a projection that passes the deepest captured feature
through. At step 0 the draft then already computes "one more target layer over the
target's deep features", which it refines, rather than learning language from scratch.
"""

from __future__ import annotations

from typing import List

import torch
from torch import nn

COPIED = (
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)


@torch.no_grad()
def init_draft_from_target(draft: nn.Module, target_model: nn.Module) -> List[str]:
    """Copies what fits by name and shape; returns the names copied (the rest keep their init)."""
    cfg = draft.config
    target_layers = target_model.model.layers
    copied = []
    for j, layer in enumerate(draft.layers):
        source = dict(target_layers[len(target_layers) - cfg.num_hidden_layers + j].named_parameters())
        for name, param in layer.named_parameters():
            if name in COPIED and name in source and source[name].shape == param.shape:
                param.copy_(source[name].to(param.dtype))
                copied.append(f"layers.{j}.{name}")
    final_norm = getattr(target_model.model, "norm", None)
    if final_norm is not None and final_norm.weight.shape == draft.norm.weight.shape:
        draft.norm.weight.copy_(final_norm.weight.to(draft.norm.weight.dtype))
        copied.append("norm.weight")
    if cfg.hidden_size == cfg.target_hidden_size:
        draft.fc.weight.zero_()
        last = (len(cfg.target_layer_ids) - 1) * cfg.target_hidden_size
        draft.fc.weight[:, last:].copy_(torch.eye(cfg.hidden_size))
        copied.append("fc.weight (identity on the deepest feature)")
    return copied

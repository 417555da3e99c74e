"""The tensors vLLM 0.32's LiLiCorr holds beyond the DFlash backbone (model_executor/models/lilicorr.py), from
the config: DFlash2's convolution where conv_kernel_size is set, and the `lilicorr.` tensors of its LiLiCorrHead.

Written from vLLM's module, not from model.py, so checking a draft against it checks the draft.
vLLM's load_weights refuses a checkpoint missing any of them ("coverage mismatch"). Every projection is a
ReplicatedLinear with a bias; the MLPs are NemotronHMLP(bias=True): up_proj and down_proj.
"""

from __future__ import annotations

from typing import Dict

from blockdraft.kinds.dflash2.contract import conv_shapes
from blockdraft.kinds.spec import Shape

NUM_CANDIDATE_FEATURES = 5


def _linear(name: str, out_size: int, in_size: int) -> Dict[str, Shape]:
    return {f"{name}.weight": (out_size, in_size), f"{name}.bias": (out_size,)}


def _mlp(name: str, in_size: int, hidden: int, out_size: int) -> Dict[str, Shape]:
    return {**_linear(f"{name}.up_proj", hidden, in_size), **_linear(f"{name}.down_proj", out_size, hidden)}


def head_shapes(cfg) -> Dict[str, Shape]:
    model_h, h, f = cfg.hidden_size, cfg.lilicorr_width, cfg.lilicorr_factor_dim
    slots, k, heads = cfg.block_size - 1, cfg.lilicorr_candidate_topk, cfg.lilicorr_num_heads
    shapes: Dict[str, Shape] = {}
    if model_h != h:  # vLLM's token_proj is an nn.Identity when the widths agree
        shapes.update(_linear("token_proj", h, model_h))
    shapes.update(_linear("pass_hidden_proj", h, model_h))
    shapes.update({"feature_norm.weight": (NUM_CANDIDATE_FEATURES,), "feature_norm.bias": (NUM_CANDIDATE_FEATURES,)})
    shapes.update(_mlp("feature_mlp", NUM_CANDIDATE_FEATURES, h, h))
    shapes.update({
        "slot_embedding": (1, 1, slots, 1, h),
        "rank_embedding": (1, 1, 1, k, h),
        "relative_slot_bias": (heads, 2 * cfg.block_size - 1),
        "same_slot_bias": (heads,),
    })
    shapes.update(_linear("context_proj", h, model_h))
    for i in range(cfg.lilicorr_num_layers):
        p = f"layers.{i}."
        shapes.update({p + "attn_norm.weight": (h,), p + "mlp_norm.weight": (h,),
                       p + "attn.in_proj_weight": (3 * h, h), p + "attn.in_proj_bias": (3 * h,)})
        shapes.update(_linear(p + "attn.out_proj", h, h))
        shapes.update(_mlp(p + "mlp", h, int(h * cfg.lilicorr_mlp_ratio), h))
    shapes.update({"output_norm.weight": (h,), "anchor_norm.weight": (h,)})
    shapes.update(_linear("factor_input_proj", h, 3 * h))
    for name in ("out_head", "in_head", "anchor_out_head"):
        shapes.update(_linear(name, f, h))
    return {f"lilicorr.{name}": shape for name, shape in shapes.items()}


def weight_shapes(cfg) -> Dict[str, Shape]:
    return {**(conv_shapes(cfg) if cfg.conv_kernel_size else {}), **head_shapes(cfg)}

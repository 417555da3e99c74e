"""The tensors vLLM 0.32's DFlash2 loader (qwen3_dflash2.py) holds beyond the DFlash backbone: each layer's two
in-block convolutions and the candidate selector.

Written from vLLM's contract (docs/vllm-dflash-contract.md), not from model.py, so checking the draft's
state_dict against it checks the draft.
"""

from __future__ import annotations

from typing import Dict

from blockdraft.kinds.spec import Shape


def conv_shapes(cfg) -> Dict[str, Shape]:
    """Every layer's attention_conv and mlp_conv (LiLiCorr's optional convolution holds the same)."""
    h, taps = cfg.hidden_size, cfg.conv_kernel_size
    # conv_group_size is channels per group: the projection emits one coefficient per group.
    projection = (2 * taps * (h // cfg.conv_group_size), h)
    out: Dict[str, Shape] = {}
    for i in range(cfg.num_hidden_layers):
        for conv in ("attention_conv", "mlp_conv"):
            out[f"layers.{i}.{conv}.base_kernel"] = (2, taps, h)
            out[f"layers.{i}.{conv}.kernel_projection.weight"] = projection
    return out


def selector_shapes(cfg) -> Dict[str, Shape]:
    v, r = cfg.vocab_size, cfg.selector_rank
    return {
        "candidate_selector.predecessor_codebook": (v, r),
        "candidate_selector.successor_codebook": (v, r),
        "candidate_selector.hidden_projection.weight": (r, cfg.hidden_size),
    }


def weight_shapes(cfg) -> Dict[str, Shape]:
    return {**conv_shapes(cfg), **selector_shapes(cfg)}

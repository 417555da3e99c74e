"""Qwen3-style building blocks shared by the drafts. Attribute names equal checkpoint keys."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from blockdraft.models.draft_config import DraftModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as the target does, so bf16 drafts match it.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """Default (unscaled) RoPE. inv_freq stays fp32 even when the module is cast."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    def inv_freq(self, device) -> torch.Tensor:
        # Computed on the fly rather than stored: a buffer would be cast to bf16 by .to(dtype).
        exponent = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32) / self.head_dim
        return 1.0 / (self.theta**exponent)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids.float()[..., None] * self.inv_freq(position_ids.device)  # [N, T, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [N, T, hd]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [N, heads, T, hd]; cos/sin [N, T, hd]
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class MLP(nn.Module):
    def __init__(self, cfg: DraftModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class BlockAttention(nn.Module):
    """Queries from the block only; keys/values = [projected context | block]."""

    def __init__(self, cfg: DraftModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        h, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)  # [N, heads, T, hd]

    def key_value(self, x: torch.Tensor, cos, sin) -> Tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of x (context features or block states): k_norm, then RoPE."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        return k, v  # [N, kv, T, hd] each

    def forward(self, x, cos, sin, ctx_kv: Tuple[torch.Tensor, torch.Tensor], attn_mask) -> torch.Tensor:
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), cos, sin)  # [N, nh, Tq, hd]
        k_blk, v_blk = self.key_value(x, cos, sin)
        k = torch.cat([ctx_kv[0], k_blk], dim=2)  # [N, kv, Tc+Tq, hd]
        v = torch.cat([ctx_kv[1], v_blk], dim=2)
        out = attend(q, k, v, attn_mask)  # [N, nh, Tq, hd]
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


def attend(q, k, v, attn_mask) -> torch.Tensor:
    """Non-causal GQA attention; `attn_mask` is a bool [N,1,Tq,Tk], a flex BlockMask, or None."""
    from torch.nn.attention.flex_attention import BlockMask

    if isinstance(attn_mask, BlockMask):
        return _flex(q.is_cuda)(q, k, v, block_mask=attn_mask, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=q.shape[1] != k.shape[1])


_COMPILED_FLEX = None


def _flex(cuda: bool):
    """FlexAttention is only fast compiled (on CUDA); eager elsewhere, e.g. CPU tests."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    if not cuda:
        return flex_attention
    if _COMPILED_FLEX is None:
        # Default (automatic) dynamic shapes, not dynamic=False: rows differ in length from step to
        # step, and a static kernel per length would hit the recompile limit within a few steps and
        # then run flex unfused. After the first change of length it compiles one dynamic kernel.
        _COMPILED_FLEX = torch.compile(flex_attention)
    return _COMPILED_FLEX


def per_layer_masks(layer_attention, build) -> list:
    """One mask per draft layer from `build(window, causal)` over its `layer_attention` pairs, each
    distinct pair built once (a draft mixing sliding and full layers needs two)."""
    built = {}
    for key in layer_attention:
        if key not in built:
            built[key] = build(*key)
    return [built[key] for key in layer_attention]


def single_block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: Optional[int], causal: bool = False) -> Optional[torch.Tensor]:
    """[N,1,Tq,Tk] bool for one block over its context, or None (every query sees every key).

    `window` keeps keys within that many positions before each query; `causal` keeps keys at
    or before the query's position: the whole context (it precedes the anchor) and the block's
    slots up to the query's own, as vLLM's causal attention does.
    """
    if window is None and not causal:
        return None
    distance = q_pos[:, None, :, None] - k_pos[:, None, None, :]
    mask = torch.ones_like(distance, dtype=torch.bool)
    if window is not None:
        mask = mask & (distance < window)
    if causal:
        mask = mask & (distance >= 0)
    return mask

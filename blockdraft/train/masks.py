"""Who a draft block may attend to during training.

Queries are the A blocks of a row laid end to end ([A*B]); keys are the row's T
context positions followed by the same A*B block slots. The rule mirrors serving:

- a query of block j (anchor a_j) sees context key t iff a_j is a valid anchor,
  t < a_j, t is a real token and t is in a_j's document (serving has the target's
  features only for tokens before the anchor);
- it sees every slot of its own block, both directions (the draft is non-causal),
  including padding blocks, so no softmax row is empty and nothing turns NaN; a causal
  draft (JetSpec) sees slots 0..k of its own block from slot k, as vLLM's causal
  attention does (slot 0 always sees itself, so no row is empty either);
- it never sees another block (each block stands alone in serving);
- with a sliding window W, only keys whose position id is > the query's - W.

`dense_block_mask` builds the boolean mask for SDPA; `flex_block_mask` builds a
flex-attention BlockMask from a mask_mod implementing the same rule independently,
so each checks the other in tests.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from blockdraft.errors import ConfigError


def _check_window(sliding_window: Optional[int]) -> None:
    # A slot must at least see itself, or its softmax row is empty and turns NaN.
    if sliding_window is not None and sliding_window < 1:
        raise ConfigError(
            f"sliding_window={sliding_window}: must be >= 1, or null for full attention"
        )


def dense_block_mask(
    anchors: Tensor,
    anchor_valid: Tensor,
    attention_mask: Tensor,
    document_ids: Tensor,
    position_ids: Tensor,
    block_position_ids: Tensor,
    block_size: int,
    sliding_window: Optional[int] = None,
    causal: bool = False,
) -> Tensor:
    """Boolean attention mask, True = attend: [N, 1, A*B, T + A*B]."""
    _check_window(sliding_window)
    n, t = attention_mask.shape
    a = anchors.shape[1]
    key_t = torch.arange(t, device=anchors.device)  # [T]
    anchor_doc = document_ids.gather(1, anchors.clamp(0, t - 1))  # [N, A]
    ctx = (
        anchor_valid.unsqueeze(-1)
        & (key_t < anchors.unsqueeze(-1))
        & attention_mask.unsqueeze(1)
        & (document_ids.unsqueeze(1) == anchor_doc.unsqueeze(-1))
    )  # [N, A, T]
    ctx = ctx.repeat_interleave(block_size, dim=1)  # [N, A*B, T]: one row per slot
    block_of = torch.arange(a * block_size, device=anchors.device) // block_size  # [A*B]
    own_block = block_of.unsqueeze(1) == block_of.unsqueeze(0)  # [A*B, A*B]
    if causal:
        own_block = own_block & torch.ones_like(own_block).tril()  # slot k sees slots <= k of its block
    mask = torch.cat([ctx, own_block.expand(n, -1, -1)], dim=-1)  # [N, A*B, T+A*B]
    if sliding_window is not None:
        key_pos = torch.cat([position_ids, block_position_ids], dim=1)  # [N, T+A*B]
        mask = mask & (key_pos.unsqueeze(1) > block_position_ids.unsqueeze(-1) - sliding_window)
    return mask.unsqueeze(1)  # [N, 1, A*B, T+A*B]


def block_mask_mod(
    anchors: Tensor,
    anchor_valid: Tensor,
    attention_mask: Tensor,
    document_ids: Tensor,
    position_ids: Tensor,
    block_position_ids: Tensor,
    block_size: int,
    sliding_window: Optional[int] = None,
    causal: bool = False,
) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """The rule as a flex-attention mask_mod(b, h, q_idx, kv_idx) over the given rows."""
    _check_window(sliding_window)
    t = attention_mask.shape[1]
    q_len = block_position_ids.shape[1]
    kv_len = t + q_len

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        # Indices are clamped because BlockMask construction may probe padded tiles
        # past the real lengths; the in-range checks then reject those probes.
        q = q_idx.clamp(max=q_len - 1)
        kv = kv_idx.clamp(max=kv_len - 1)
        j = q // block_size
        anchor = anchors[b, j].clamp(0, t - 1)
        is_ctx = kv < t
        ctx_t = kv.clamp(max=t - 1)
        slot = (kv - t).clamp(min=0)
        sees_ctx = (
            is_ctx
            & anchor_valid[b, j]
            & (kv < anchor)
            & attention_mask[b, ctx_t]
            & (document_ids[b, ctx_t] == document_ids[b, anchor])
        )
        sees_own_block = ~is_ctx & (slot // block_size == j)
        if causal:
            sees_own_block = sees_own_block & (slot <= q)
        allowed = (sees_ctx | sees_own_block) & (q_idx < q_len) & (kv_idx < kv_len)
        if sliding_window is None:
            return allowed
        key_pos = torch.where(is_ctx, position_ids[b, ctx_t], block_position_ids[b, slot])
        return allowed & (key_pos > block_position_ids[b, q] - sliding_window)

    return mask_mod


def flex_block_mask(
    anchors: Tensor,
    anchor_valid: Tensor,
    attention_mask: Tensor,
    document_ids: Tensor,
    position_ids: Tensor,
    block_position_ids: Tensor,
    block_size: int,
    sliding_window: Optional[int] = None,
    causal: bool = False,
) -> BlockMask:
    """The same rule as `dense_block_mask`, as a flex-attention BlockMask.

    Heads share the mask (H=None). Built on the inputs' device, so it also works on
    CPU for forward-only use.
    """
    mask_mod = block_mask_mod(
        anchors, anchor_valid, attention_mask, document_ids,
        position_ids, block_position_ids, block_size, sliding_window, causal,
    )
    n, t = attention_mask.shape
    q_len = block_position_ids.shape[1]
    return create_block_mask(
        mask_mod, B=n, H=None, Q_LEN=q_len, KV_LEN=t + q_len, device=anchors.device
    )

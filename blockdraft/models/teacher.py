"""Soft labels: the target's own top-k next-token distribution at each supervised slot.

Slot k of the block anchored at position a is labelled with token a+k, which the target
predicts from position a+k-1: that position's logits are the slot's teacher. Online they
come from the target's final hidden states in this step; from a feature store, from the
top-k the capture kept (`teacher_topk_rows`), the same numbers either way.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from blockdraft.errors import ConfigError


def slot_source_positions(anchors: Tensor, block_size: int) -> Tensor:
    """[N, A] anchors -> [N, A, B]: the position whose next-token logits label each slot."""
    return anchors.unsqueeze(-1) + torch.arange(block_size, device=anchors.device) - 1


@torch.no_grad()
def topk_logits(hidden: Tensor, lm_head_weight: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    """hidden [M, H] -> (ids [M, k] long, logits [M, k] float32), best first: the target's own
    logits, its head applied to its final hidden states (no architecture the target loader
    supports transforms them further)."""
    logits = hidden.float() @ lm_head_weight.float().t()
    values, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
    return ids, values


@torch.no_grad()
def teacher_topk_rows(final_hidden: Tensor, loss_mask: Tensor, lm_head_weight: Tensor, k: int):
    """One row for a feature store: (ids [L, k] int32, logits [L, k] float32). Position t holds the
    target's top-k for token t+1 where that token is supervised, zeros elsewhere (nothing reads them)."""
    length = final_hidden.shape[0]
    ids = torch.zeros(length, k, dtype=torch.int32)
    logits = torch.zeros(length, k, dtype=torch.float32)
    wanted = torch.zeros(length, dtype=torch.bool)
    wanted[:-1] = loss_mask[1:].bool().cpu()
    where = wanted.nonzero().squeeze(-1)
    if len(where):
        top_ids, top_logits = topk_logits(final_hidden[where.to(final_hidden.device)], lm_head_weight, k)
        ids[where], logits[where] = top_ids.int().cpu(), top_logits.cpu()
    return ids, logits


def slot_source_rows(anchors: Tensor, supervised: Tensor) -> Tuple[Tensor, Tensor]:
    """(row [M], position [M]) of the position whose next-token logits teach each supervised slot."""
    n, _, b = supervised.shape
    pos = slot_source_positions(anchors, b).clamp(min=0)  # [N, A, B]; slot 0 is never supervised
    rows = torch.arange(n, device=pos.device).view(n, 1, 1).expand_as(pos)
    return rows[supervised], pos[supervised]


@torch.no_grad()
def slot_teacher(batch: dict, final_hidden: Optional[Tensor], lm_head_weight: Tensor, anchors: Tensor,
                 supervised: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    """The teacher of every supervised slot: (target ids [M, k], logits [M, k]).

    From the batch's stored top-k when it has them (a feature store), else from the target's
    final hidden states of this step."""
    r, p = slot_source_rows(anchors, supervised)
    if "teacher_ids" in batch:
        stored = batch["teacher_ids"].shape[-1]
        k = k or stored  # the full distribution asked of a store: all it kept (the trainer said so at start)
        if stored < k:
            raise ConfigError(f"train.teacher_top_k={k}, but the feature store kept the target's top {stored}; "
                              f"set train.teacher_top_k<={stored}, or capture the store again with train.teacher_top_k={k}.")
        return batch["teacher_ids"][r, p, :k].long(), batch["teacher_logits"][r, p, :k].float()
    if final_hidden is None:
        raise ValueError("online soft labels need the target's final hidden states")
    return topk_logits(final_hidden[r, p], lm_head_weight, k)

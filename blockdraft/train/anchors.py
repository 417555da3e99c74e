"""Anchors and noise blocks: where a training row is cut into draft blocks.

Pure functions over a packed batch (`input_ids`, `loss_mask`, `attention_mask`,
`position_ids`, `document_ids`, all [N, T]). N rows, T tokens, A anchors per row,
block size B.

A block at anchor a is what serving feeds the draft after accepting the token at a:
`[input_ids[a], MASK, ..., MASK]` at positions a .. a+B-1. Slot k >= 1 predicts
`input_ids[a + k]`. With a variable prefix of length l, slots 1..l-1 show the real
tokens and only slots >= l are supervised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from blockdraft.errors import ConfigError
from blockdraft.models.draft_config import check_block_size

LOSS_TYPES = ("block", "variable_prefix")


@dataclass(frozen=True)
class BlockBatch:
    """The draft blocks of a batch, ready for the draft and the losses."""

    block_ids: Tensor  # [N, A*B] long: block j occupies j*B .. j*B+B-1
    block_position_ids: Tensor  # [N, A*B] long: position_ids[a] + k
    labels: Tensor  # [N, A, B] long: input_ids[a+k]; 0 at slot 0 and invalid anchors
    label_mask: Tensor  # [N, A, B] bool: slot is supervised
    predecessors: Tensor  # [N, A, B] long: true token at a+k-1 (slot 1's is the anchor)
    slot_weights_offset: Tensor  # [N, A, B] long: k - prefix_len, the decay distance
    anchors: Tensor  # [N, A] long
    anchor_valid: Tensor  # [N, A] bool
    prefix_len: Tensor  # [N, A] long, 1 for a plain DFlash block


def _check_block_size(block_size: int) -> None:
    check_block_size(block_size, key="block_size")


def valid_anchor_mask(
    loss_mask: Tensor, attention_mask: Tensor, document_ids: Tensor, block_size: int
) -> Tensor:
    """Positions where a block can start: [N, T] bool.

    Valid iff the anchor and the token after it are loss tokens of the same document. vLLM
    drafts after every accepted token, so a block near the end of a reply is served too: its
    slots past the document's end exist but are unsupervised (`build_blocks`), and the reply's
    last tokens, its end-of-turn token included, are still predicted from slot 1. An anchor on
    the reply's last token has nothing to predict (serving stops there) and is not valid.
    """
    _check_block_size(block_size)
    n = loss_mask.shape[0]
    next_loss = torch.cat([loss_mask[:, 1:], loss_mask.new_zeros(n, 1)], dim=1)  # [N, T]
    next_real = torch.cat([attention_mask[:, 1:], attention_mask.new_zeros(n, 1)], dim=1)  # [N, T]
    next_doc = torch.cat([document_ids[:, 1:], document_ids.new_full((n, 1), -1)], dim=1)  # [N, T]
    return loss_mask & attention_mask & next_loss & next_real & (next_doc == document_ids)


def _generator_device(generator: Optional[torch.Generator], fallback: torch.device) -> torch.device:
    # Drawing on the generator's own device keeps a seeded CPU generator usable (and
    # its draws identical) whatever device the batch lives on.
    return generator.device if generator is not None else fallback


def sample_anchors(
    valid: Tensor, num_anchors: int, generator: Optional[torch.Generator] = None
) -> tuple[Tensor, Tensor]:
    """Draw `num_anchors` distinct valid positions per row, uniformly.

    Returns `anchors [N, A]` long and `anchor_valid [N, A]` bool. Valid anchors come
    first in ascending order; a row with fewer valid positions is padded at the end
    with invalid anchors at position 0.
    """
    n, t = valid.shape
    device = _generator_device(generator, valid.device)
    # Top-A of i.i.d. uniform keys is a uniform draw without replacement; invalid
    # positions get a key below every valid one so they are taken only as padding.
    keys = torch.rand(n, t, generator=generator, device=device).to(valid.device)  # [N, T]
    keys = torch.where(valid, keys, torch.full_like(keys, -1.0))
    take = min(num_anchors, t)
    top_keys, top_pos = keys.topk(take, dim=1)  # [N, take]
    chosen_valid = top_keys >= 0
    if take < num_anchors:  # more anchors asked than positions: pad with invalid ones
        extra = num_anchors - take
        top_pos = torch.cat([top_pos, top_pos.new_zeros(n, extra)], dim=1)  # [N, A]
        chosen_valid = torch.cat([chosen_valid, chosen_valid.new_zeros(n, extra)], dim=1)
    # Sort valid anchors ascending and push padding past every real position.
    sort_key = torch.where(chosen_valid, top_pos, top_pos.new_full(top_pos.shape, t))
    order = sort_key.argsort(dim=1, stable=True)  # [N, A]
    anchors = top_pos.gather(1, order)
    anchor_valid = chosen_valid.gather(1, order)
    anchors = torch.where(anchor_valid, anchors, torch.zeros_like(anchors))
    return anchors, anchor_valid


def sample_prefix_lengths(
    anchor_valid: Tensor,
    block_size: int,
    loss_type: str,
    prefix_weight_base: float,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Visible prefix length per block: [N, A] long, 1 = the plain DFlash block.

    `variable_prefix` draws l in 1..B-1 with P(l) proportional to
    prefix_weight_base**(l-1); l stops at B-1 so every block keeps a supervised slot.
    Invalid anchors get 1.
    """
    if loss_type not in LOSS_TYPES:
        raise ConfigError(f"loss_type={loss_type!r} is unknown; use one of {LOSS_TYPES}")
    ones = torch.ones(anchor_valid.shape, dtype=torch.long, device=anchor_valid.device)
    if loss_type == "block" or anchor_valid.numel() == 0:
        return ones
    _check_block_size(block_size)
    if not prefix_weight_base > 0:
        raise ConfigError(
            f"prefix_weight_base={prefix_weight_base}: the prefix prior needs a positive "
            "base (below 1 favours short prefixes, above 1 long ones)"
        )
    device = _generator_device(generator, anchor_valid.device)
    # Log-space weights avoid overflow of base**(B-2) for large bases or blocks.
    steps = torch.arange(block_size - 1, dtype=torch.float64, device=device)  # [B-1]: l-1
    probs = torch.softmax(steps * math.log(prefix_weight_base), dim=0)  # [B-1]
    rows = probs.expand(anchor_valid.numel(), block_size - 1)  # [N*A, B-1]
    draws = torch.multinomial(rows, 1, replacement=True, generator=generator)  # [N*A, 1]
    lengths = (draws.view(anchor_valid.shape) + 1).to(anchor_valid.device)  # [N, A]
    return torch.where(anchor_valid, lengths, ones)


def build_blocks(
    input_ids: Tensor,
    position_ids: Tensor,
    loss_mask: Tensor,
    document_ids: Tensor,
    anchors: Tensor,
    anchor_valid: Tensor,
    prefix_len: Tensor,
    block_size: int,
    mask_token_id: int,
) -> BlockBatch:
    """Lay out the noise blocks, their labels and their supervision.

    Invalid anchors still get a (masked-out) block so every row has A blocks; their
    gathers are clamped into the row and nothing of theirs is supervised. Slots past the end
    of the anchor's document are never supervised and never show a token (of the next packed
    document or of padding): they hold MASK, as the slots vLLM drafts past a reply's end.
    """
    n, t = input_ids.shape
    a = anchors.shape[1]
    slot = torch.arange(block_size, device=input_ids.device)  # [B]
    pos = anchors.unsqueeze(-1) + slot  # [N, A, B]: token position of each slot
    flat = pos.clamp(0, t - 1).reshape(n, a * block_size)  # [N, A*B]
    anchor_doc = document_ids.gather(1, anchors.clamp(0, t - 1)).unsqueeze(-1)  # [N, A, 1]
    in_doc = (pos < t) & (document_ids.gather(1, flat).view(n, a, block_size) == anchor_doc)  # [N, A, B]
    live = anchor_valid.unsqueeze(-1) & in_doc  # [N, A, B]
    tokens = input_ids.gather(1, flat).view(n, a, block_size)  # [N, A, B]
    before = input_ids.gather(1, (flat - 1).clamp(min=0)).view(n, a, block_size)  # [N, A, B]
    on_loss = loss_mask.gather(1, flat).view(n, a, block_size)  # [N, A, B]

    plen = prefix_len.unsqueeze(-1)  # [N, A, 1]
    visible = (slot < plen) & (in_doc | (slot == 0))  # [N, A, B]: anchor plus the real-token prefix
    block_ids = torch.where(visible, tokens, torch.full_like(tokens, mask_token_id))
    anchor_pos = position_ids.gather(1, anchors.clamp(0, t - 1))  # [N, A]
    block_pos = anchor_pos.unsqueeze(-1) + slot  # [N, A, B]

    predicting = live & (slot >= 1)  # [N, A, B]: slots that have a label at all
    return BlockBatch(
        block_ids=block_ids.reshape(n, a * block_size),  # [N, A*B]
        block_position_ids=block_pos.reshape(n, a * block_size),  # [N, A*B]
        labels=torch.where(predicting, tokens, torch.zeros_like(tokens)),
        label_mask=predicting & ~visible & on_loss,
        predecessors=torch.where(predicting, before, torch.zeros_like(before)),
        slot_weights_offset=slot - plen,
        anchors=anchors,
        anchor_valid=anchor_valid,
        prefix_len=prefix_len,
    )

"""DFlash2's selector loss: the pairwise selector's CE over each slot's top-k, with the true predecessors
(teacher forcing), normalised as the block CE is (train.loss_normalization). The slots' predictions become
the selector's picks, as vLLM drafts them."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from blockdraft.kinds.dflash.loss import BlockLoss, KindLoss, SupervisedSlots
from blockdraft.losses.block import selector_cross_entropy, topk_candidates


def candidates(model, hidden, head, logits, chunk: int):
    """Each slot's top-k tokens and their (differentiable) logits: [M, k] each.

    Chunked, only k logits per slot are kept: the [chunk, V] block is recomputed in backward."""
    k = model.config.selector_top_k
    if not chunk:
        return topk_candidates(logits, k)
    with torch.no_grad():
        ids = torch.cat([model.logits(h, head).topk(k, dim=-1).indices for h in hidden.split(chunk)]) if len(hidden) else hidden.new_zeros(0, k, dtype=torch.long)

    def gather(h, w, idx):
        return model.logits(h, w).gather(-1, idx)

    parts = [checkpoint(gather, h, head, i, use_reentrant=False) for h, i in zip(hidden.split(chunk), ids.split(chunk))]
    return ids, (torch.cat(parts) if parts else hidden.new_zeros(0, k))


def selector_loss(model, slots: SupervisedSlots, block: BlockLoss) -> KindLoss:
    """The selector's weighted CE, set aside from the logged `loss` (it has its own sums), and its picks."""
    cand_ids, cand_logits = candidates(model, block.hidden, block.head, block.logits, slots.chunk)
    scores = model.candidate_selector.score(block.hidden, slots.blocks.predecessors[slots.sup], cand_ids, cand_logits)  # [M, k]
    sel_loss, recall = selector_cross_entropy(scores, cand_ids, slots.labels, block.weights, block.block_ids,
                                              block.normalization)
    sel_pred = cand_ids.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)  # [M]
    m = float(len(slots.labels))
    sums = {
        "selector_loss_sum": sel_loss.detach() * 1.0,
        "recall_hits": (recall.nan_to_num(0.0) * m).detach(),
        "base_correct": (block.pred == slots.labels).sum().float(),
        "selector_correct": (sel_pred == slots.labels).sum().float(),
    }
    return KindLoss(aside=slots.cfg.selector_loss_weight * sel_loss, pred=sel_pred, sums=sums)

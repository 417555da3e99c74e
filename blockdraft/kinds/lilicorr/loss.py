"""LiLiCorr's path loss: teach the lattice head to walk the target's tokens through the backbone's top-k.

The walk vLLM runs (kinds/lilicorr/decode.py `walk`) picks slot s's candidate from the score row of the
candidate picked at slot s - 1. Its training signal here is teacher-forced, as DFlash2's selector loss:
at slot s, the row of the target's token at slot s - 1 (the anchor's start row at slot 0), a cross-entropy
whose class is the target's token at slot s. The sum over slots is the negative log-likelihood of the
target's path under the walk's locally normalised choices. A slot whose target token is not among its
candidates has no class, and the slot after it has no row on the target's path: both are left out, as
DFlash2 leaves out rows whose label is not a candidate. Weights and normalisation are the block CE's.

The candidates and their log-prob features are the backbone's own, taken without gradient: the block CE
alone shapes the backbone's distribution; the path loss reaches the backbone through the slot states
and the anchor's context state, which the head reads.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from blockdraft.kinds.dflash.loss import BlockLoss, KindLoss, SupervisedSlots
from blockdraft.kinds.lilicorr.decode import walk
from blockdraft.losses.block import normalized_loss


@torch.no_grad()
def chunked_candidates(module, hidden: Tensor, lm_head: Tensor, chunk: int) -> Tuple[Tensor, Tensor]:
    """hidden [R, S, H] -> the backbone's top-k (log-probs [R, S, k], ids [R, S, k]); at most [chunk, V]
    logits at once."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    k = module.config.lilicorr_candidate_topk
    if len(flat) == 0:
        return flat.new_zeros(0, k), flat.new_zeros(0, k, dtype=torch.long)
    parts = [module.candidates(h, lm_head) for h in flat.split(chunk or len(flat))]
    log_probs, ids = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return log_probs.view(*hidden.shape[:-1], k), ids.view(*hidden.shape[:-1], k)


def path_targets(candidate_ids: Tensor, labels: Tensor, supervised: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """candidate_ids [R, S, k], labels / supervised [R, S] -> (row [R, S]: the candidate index of the
    previous slot's target token, 0 at slot 0; target [R, S]: the index of this slot's; used [R, S])."""
    hit = candidate_ids == labels.unsqueeze(-1)  # [R, S, k]
    found = hit.any(-1) & supervised  # [R, S]
    target = hit.int().argmax(-1)  # [R, S]: 0 where absent (then unused)
    row = F.pad(target[:, :-1], (1, 0))
    on_path = F.pad(found[:, :-1], (1, 0), value=True)
    return row, target, found & on_path


def path_loss(scores: Tensor, candidate_ids: Tensor, labels: Tensor, supervised: Tensor, weights: Tensor,
              mode: str) -> Tuple[Tensor, Tensor]:
    """scores [R, S, k, k], candidate_ids [R, S, k], labels / supervised / weights [R, S] -> (loss [], the
    number of supervised slots whose target token is a candidate []). Normalised as the block CE (`mode`)."""
    row, target, used = path_targets(candidate_ids, labels, supervised)
    logits = scores.gather(2, row[..., None, None].expand(-1, -1, 1, scores.shape[-1])).squeeze(2)  # [R, S, k]
    ce = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), reduction="none")  # [R*S]
    block_ids = torch.arange(len(labels), device=labels.device)[:, None].expand_as(labels).flatten()
    loss = normalized_loss(ce, (weights * used).flatten().float(), block_ids, mode)
    hits = ((candidate_ids == labels.unsqueeze(-1)).any(-1) & supervised).sum().float()
    return loss, hits


def lattice_path_loss(model, slots: SupervisedSlots, block: BlockLoss) -> KindLoss:
    """The path loss over each block's drafted slots, with the block CE's weights, set aside from the logged
    `loss` (it has its own sums). The slots' predictions become the greedy walk's tokens, as vLLM drafts them."""
    blocks, hidden, cfg = slots.blocks, slots.block_hidden, slots.cfg
    sup = blocks.label_mask[:, :, 1:]  # [N, A, S]: slot 0 is the anchor
    n, a, s = sup.shape
    slot_hidden = hidden[:, :, 1:].reshape(n * a, s, -1)
    log_probs, cand_ids = chunked_candidates(model, slot_hidden, block.head, cfg.loss_chunk_size)
    # The context state before each anchor, as vLLM's speculator takes it (hidden_norm(fc(...)) at the
    # last accepted position); none before a row's first token.
    context = model.project_context(slots.features)  # [N, T, H]
    before = (blocks.anchors - 1).clamp(min=0)
    anchor_hidden = context.gather(1, before[..., None].expand(-1, -1, context.shape[-1])).reshape(n * a, -1)
    anchor_valid = (blocks.anchor_valid & (blocks.anchors > 0)).reshape(n * a)
    scores = model.lilicorr(slots.target.embed_tokens(cand_ids).to(slot_hidden.dtype), log_probs, slot_hidden,
                            anchor_hidden, anchor_valid)  # [R, S, k, k]
    weights = block.weights
    slot_w = torch.zeros(blocks.label_mask.shape, device=weights.device, dtype=torch.float32)
    slot_w[blocks.label_mask] = weights.float()
    labels, sup = blocks.labels[:, :, 1:].reshape(n * a, s), sup.reshape(n * a, s)
    p_loss, hits = path_loss(scores, cand_ids, labels, sup, slot_w[:, :, 1:].reshape(n * a, s), block.normalization)
    walked = torch.full_like(blocks.labels, -1)
    walked[:, :, 1:] = walk(scores.detach(), cand_ids)[0].view(n, a, s)
    pred_sup = walked[blocks.label_mask]
    labels_sup = blocks.labels[blocks.label_mask]
    sums = {
        "selector_loss_sum": p_loss.detach() * 1.0,
        "recall_hits": hits.detach(),
        "base_correct": (block.pred == labels_sup).sum().float(),
        "selector_correct": (pred_sup == labels_sup).sum().float(),
    }
    return KindLoss(aside=cfg.selector_loss_weight * p_loss, pred=pred_sup, sums=sums)

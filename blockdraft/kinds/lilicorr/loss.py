"""LiLiCorr's path loss: teach the lattice head to walk the target's tokens through the backbone's top-k.

The walk vLLM runs (kinds/lilicorr/model.py `walk`) picks slot s's candidate from the score row of the
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

from blockdraft.train.losses import normalized_loss


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

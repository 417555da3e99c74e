"""LiLiCorr's drafting: the walk through the candidate lattice that vLLM's speculator runs, greedy or sampled
(serving drafts with it; training scores the greedy walk's tokens)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def walk(
    scores: torch.Tensor,
    candidate_ids: torch.Tensor,
    temperature: float = 0.0,
    generator: Optional[torch.Generator] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """vLLM's candidate walk (spec_decode/dflash2/speculator.py `_selector_walk_kernel`): slot s picks among
    its k candidates by the row of scores[:, s] of the candidate picked at slot s - 1 (row 0 at slot 0),
    greedily, or sampled from softmax(row / temperature) as its Gumbel argmax samples.

    scores [R, S, k, k], candidate_ids [R, S, k] -> tokens [R, S] and the distribution each token was drawn
    from over the k candidates, [R, S, k] (one-hot when greedy), for rejection sampling.
    """
    rows, slots, k = candidate_ids.shape
    previous = torch.zeros(rows, dtype=torch.long, device=scores.device)
    tokens, probs = [], []
    for s in range(slots):
        row = scores[torch.arange(rows, device=scores.device), s, previous].float()  # [R, k]
        if temperature > 0:
            p = torch.softmax(row / temperature, dim=-1)
            pick = torch.multinomial(p, 1, generator=generator).squeeze(-1)
        else:
            pick = row.argmax(-1)
            p = F.one_hot(pick, k).float()
        tokens.append(candidate_ids[:, s].gather(-1, pick[:, None]).squeeze(-1))
        probs.append(p)
        previous = pick
    return torch.stack(tokens, 1), torch.stack(probs, 1)

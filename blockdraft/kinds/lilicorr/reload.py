"""What the reload check compares beyond LiLiCorr's logits: the lattice head's scores, which the logits never
touch."""

from __future__ import annotations

from typing import List


def probe_outputs(draft, probe, hidden) -> List:
    """[the lattice scores of the probe's two blocks [1, 2B, k*k]], anchored on the last context state (zeros at
    each block's anchor slot, which the head does not score)."""
    from torch.nn.functional import pad  # here: a serving question loads the kinds, and imports no torch

    b = draft.config.block_size
    slots = hidden.view(2, b, -1)[:, 1:]
    anchor = draft.project_context(probe.features[:, -1]).expand(2, -1)
    _, scores = draft.lattice_scores(slots, probe.lm_head, probe.embed, anchor)  # [2, B-1, k, k]
    return [pad(scores.flatten(2), (0, 0, 1, 0)).view(1, 2 * b, -1)]

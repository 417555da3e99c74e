"""DSpark's confidence head: what it learns to predict and its loss.

speculators (`models/dspark/metrics.py`) trains the head with BCE against the analytic acceptance
rate sum_v min(q_v, p_v) = 1 - TV(q, p), which is what a *sampled* draft token is accepted with.
vLLM 0.32 drafts greedily by default (`draft_sample_method: greedy`), and then the draft's argmax
token d is accepted with the target's probability p(d): that is the default here, since vLLM is
what serves the draft. With hard labels (the data's next token, a one-hot p) the two read 1[d = label]
and q(label).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CONFIDENCE_TARGETS = ("greedy", "overlap")


@torch.no_grad()
def acceptance_target(mode: str, pred: Tensor, labels: Tensor, ce: Tensor, outside: Tensor) -> Tensor:
    """Per supervised slot [M] float: the probability its drafted token is accepted. `pred` and `labels`
    are draft ids [M], `ce` the slot's CE on the corrected logits, `outside` a label a reduced
    vocabulary cannot draft (never accepted)."""
    if mode == "greedy":
        hit = pred == labels
    else:
        hit = torch.exp(-ce.float())
    return (hit.float() * ~outside).float()


def confidence_loss(logits: Tensor, target: Tensor) -> Tensor:
    """[M] BCE of the head's logits against the acceptance target, in float32 as vLLM runs the head."""
    return F.binary_cross_entropy_with_logits(logits.float(), target.float(), reduction="none")

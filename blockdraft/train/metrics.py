"""Training metrics that predict what serving measures.

Inputs are per slot: `pred`, `labels` [N, A, B] long, `label_mask` [N, A, B] bool,
`prefix_len` [N, A] long. Metrics return sums and counts where ranks must combine
them, so an all-reduce gives the exact global value.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def slot_accuracy(pred: Tensor, labels: Tensor, label_mask: Tensor) -> Tensor:
    """Accuracy per slot position: [B] float, nan where no slot k was supervised."""
    correct = ((pred == labels) & label_mask).sum(dim=(0, 1)).float()  # [B]
    supervised = label_mask.sum(dim=(0, 1)).float()  # [B]
    return correct / supervised  # 0/0 -> nan: no evidence for that slot


@torch.no_grad()
def accept_length(
    pred: Tensor, labels: Tensor, label_mask: Tensor, prefix_len: Tensor
) -> tuple[Tensor, Tensor]:
    """Summed acceptance length and number of blocks measured: ([] long, [] long).

    Per block with a supervised slot: the run of correct predictions from slot
    prefix_len, stopped by the first wrong or unsupervised slot (serving rejects the
    rest of the draft there), plus one for the bonus token the target always adds.
    Mean acceptance = sum / count after summing both over ranks.
    """
    block_size = pred.shape[-1]
    slot = torch.arange(block_size, device=pred.device)  # [B]
    in_prefix = slot < prefix_len.unsqueeze(-1)  # [N, A, B]: shown, not drafted
    accepted = (pred == labels) & label_mask  # [N, A, B]
    # The prefix passes through the running product so the run starts at prefix_len.
    run = torch.cumprod((accepted | in_prefix).long(), dim=-1)  # [N, A, B]
    run_len = (run.bool() & ~in_prefix).sum(dim=-1)  # [N, A]
    measured = label_mask.any(dim=-1)  # [N, A]
    total = ((run_len + 1) * measured).sum()
    return total, measured.sum()

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
def accepted_run(pred: Tensor, labels: Tensor, label_mask: Tensor, prefix_len: Tensor) -> Tensor:
    """[N, A] long: per block, the correct drafted slots from slot prefix_len on, up to the first wrong
    or unsupervised one (where serving rejects the rest of the draft)."""
    slot = torch.arange(pred.shape[-1], device=pred.device)  # [B]
    in_prefix = slot < prefix_len.unsqueeze(-1)  # [N, A, B]: shown, not drafted
    accepted = (pred == labels) & label_mask  # [N, A, B]
    # The prefix passes through the running product so the run starts at prefix_len.
    run = torch.cumprod((accepted | in_prefix).long(), dim=-1)  # [N, A, B]
    return (run.bool() & ~in_prefix).sum(dim=-1)


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
    run_len = accepted_run(pred, labels, label_mask, prefix_len)  # [N, A]
    measured = label_mask.any(dim=-1)  # [N, A]
    total = ((run_len + 1) * measured).sum()
    return total, measured.sum()


@torch.no_grad()
def walked_rounds(pred: Tensor, labels: Tensor, label_mask: Tensor, anchors: Tensor, anchor_valid: Tensor):
    """The rounds of the rows walked as serving walks a reply: (row, block index, L) per round, L the
    tokens it adds (its accepted drafts and the target's next token).

    `accept_length` averages over anchors drawn uniformly; serving starts a round only where the
    last one ended: a round at anchor a accepts a run of L - 1 drafted tokens, and the next round's
    anchor is a + L (the token the target adds). Stretches the draft gets right are crossed in few
    rounds and hard ones in many, so serving's mean (tokens / rounds) is below the uniform one.
    Each row's walk starts at its first valid anchor (the reply's first token, where serving's first
    round starts) and needs every valid anchor of the row drawn, with plain blocks (prefix 1).
    """
    lengths = 1 + accepted_run(pred, labels, label_mask, torch.ones_like(anchors))  # [N, A]
    for row, (row_anchors, row_valid, row_lengths) in enumerate(zip(anchors.tolist(), anchor_valid.tolist(), lengths.tolist())):
        block_at = {a: j for j, (a, v) in enumerate(zip(row_anchors, row_valid)) if v}
        a = min(block_at, default=None)
        while a in block_at:
            j = block_at[a]
            yield row, j, row_lengths[j]
            a += row_lengths[j]


@torch.no_grad()
def walked_accept_length(
    pred: Tensor, labels: Tensor, label_mask: Tensor, anchors: Tensor, anchor_valid: Tensor
) -> tuple[int, int, list[int]]:
    """The rows walked as serving walks a reply (`walked_rounds`): (tokens, rounds, accepted per slot),
    summed over rows."""
    tokens = rounds = 0
    per_slot = [0] * (pred.shape[-1] - 1)
    for _, _, length in walked_rounds(pred, labels, label_mask, anchors, anchor_valid):
        rounds, tokens = rounds + 1, tokens + length
        for k in range(length - 1):
            per_slot[k] += 1
    return tokens, rounds, per_slot


@torch.no_grad()
def walked_calibration(
    pred: Tensor, labels: Tensor, label_mask: Tensor, anchors: Tensor, anchor_valid: Tensor, confidence: Tensor
) -> tuple[list[int], list[int], list[float]]:
    """DSpark's confidence head on the walked rounds, per drafted slot k = 1..B-1: (rounds that reached
    slot k, those that accepted it, the summed predicted confidence of the reaching rounds). A round
    reaches slot k when slots 1..k-1 were accepted (what vLLM's head predicts: the slot's acceptance
    given the ones before it); a slot past a reply's end is never reached."""
    slots = pred.shape[-1] - 1
    reached, accepted, predicted = [0] * slots, [0] * slots, [0.0] * slots
    for row, j, length in walked_rounds(pred, labels, label_mask, anchors, anchor_valid):
        for k in range(1, min(length, slots) + 1):
            if not bool(label_mask[row, j, k]):
                break
            reached[k - 1] += 1
            accepted[k - 1] += int(k <= length - 1)
            predicted[k - 1] += float(confidence[row, j, k])
    return reached, accepted, predicted

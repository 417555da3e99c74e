"""DSpark's confidence loss: the confidence head's BCE against each slot's acceptance (losses/confidence.py),
weighted and normalised as the block loss is (speculators weights it with the same position decay)."""

from __future__ import annotations

from blockdraft.kinds.dflash.loss import BlockLoss, KindLoss, SupervisedSlots
from blockdraft.losses.block import normalized_loss
from blockdraft.losses.confidence import acceptance_target, confidence_loss


def confidence_loss_terms(model, slots: SupervisedSlots, block: BlockLoss) -> KindLoss:
    """The weighted BCE, counted in the logged `loss`, and each slot's predicted acceptance [M]."""
    cfg = slots.cfg
    logits = model.confidence_logits(block.hidden)  # [M]
    target = acceptance_target(cfg.confidence_target, block.draft_pred, slots.draft_labels, block.ce, slots.outside)  # [M]
    conf_loss = normalized_loss(confidence_loss(logits, target), block.weights, block.block_ids, block.normalization)
    predicted = logits.detach().float().sigmoid()
    sums = {
        "confidence_loss_sum": conf_loss.detach() * 1.0,
        "confidence_predicted_sum": predicted.sum(),
        "confidence_target_sum": target.sum(),
        "confidence_abs_error_sum": (predicted - target).abs().sum(),
    }
    term = cfg.confidence_weight * conf_loss if cfg.confidence_weight else None
    return KindLoss(loss=term, confidence=predicted, sums=sums)

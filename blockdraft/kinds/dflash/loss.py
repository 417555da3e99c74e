"""The contract between `train_step` and a draft's loss hooks (`DFlashDraftModel.loss_head`, `.kind_losses`):
what the step hands them and what they give back, plus the chunked argmax every loss head shares.

kinds/ sits below train/ (train imports the kinds, never the reverse): these types carry the step's settings
and tensors without importing train, and a kind's loss module computes with the loss maths both share
(blockdraft/losses/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class SupervisedSlots:
    """One micro-batch's supervised slots (M of them: `blocks.label_mask`) and what they were computed from."""

    cfg: Any
    """The `train` settings (config.recipe.LoopConfig)."""
    target: Any
    """The target (models.target.TargetModel): its `embed_tokens` and `lm_head_weight`."""
    features: Tensor
    """[N, T, n*H_t] the target's features of the batch."""
    blocks: Any
    """The label blocks (train.anchors.BlockBatch): anchors, labels, predecessors, label_mask."""
    block_hidden: Tensor
    """[N, A, B, H] every label slot's normed draft state (zeros at slot 0 where the anchor predicts)."""
    hidden: Tensor
    """[M, H] the supervised slots' states: block_hidden[label_mask]."""
    head: Tensor
    """[V_draft, H] the draft's head (`head_weight` of the target's)."""
    labels: Tensor
    """[M] target ids."""
    draft_labels: Tensor
    """[M] draft ids; 0 where `outside`."""
    outside: Tensor
    """[M] bool: a label a reduced vocabulary cannot draft (left out of the loss, a miss in the metrics)."""

    @property
    def sup(self) -> Tensor:
        return self.blocks.label_mask

    @property
    def chunk(self) -> int:
        """Rows per vocabulary projection; 0 = all at once."""
        return self.cfg.loss_chunk_size


@dataclass
class LossHead:
    """The rows and head the block loss (CE, KL, D-PACE) runs on, one linear map apart from the logits."""

    hidden: Tensor
    """[M, H'] the supervised slots' rows."""
    head: Tensor
    """[V_draft, H']."""
    base_pred: Optional[Tensor] = None
    """[M] the backbone's own argmax where the head corrects it: its accuracy is logged beside the corrected one."""


@dataclass
class BlockLoss:
    """The block loss's rows, for the losses a kind adds on top of it."""

    hidden: Tensor
    """[M, H'] the loss head's rows."""
    head: Tensor
    """[V_draft, H'] the loss head's head."""
    logits: Optional[Tensor]
    """[M, V_draft] the transformed logits; None when the loss ran in chunks (train.loss_chunk_size)."""
    ce: Tensor
    """[M] each row's CE against its draft label."""
    draft_pred: Tensor
    """[M] the argmax in draft ids."""
    pred: Tensor
    """[M] the argmax in target ids."""
    weights: Tensor
    """[M] the position weights."""
    block_ids: Tensor
    """[M] the block each row belongs to."""
    normalization: str
    """The denominator's name (losses.block.normalized_loss's mode)."""


@dataclass
class KindLoss:
    """What a kind adds to the step: nothing by default."""

    loss: Optional[Tensor] = None
    """Added to the block loss before the step logs it as `loss` (DSpark's confidence BCE)."""
    aside: Optional[Tensor] = None
    """Added to what is backpropagated after `loss` is logged: an objective with its own sums (a selector's)."""
    pred: Optional[Tensor] = None
    """[M] target ids the slot metrics score instead of the block loss's argmax (the tokens serving drafts)."""
    confidence: Optional[Tensor] = None
    """[M] each slot's predicted acceptance, from a confidence head."""
    sums: Dict[str, Tensor] = field(default_factory=dict)
    """Its metrics, as sums and counts (an all-reduce gives exact global values)."""


@torch.no_grad()
def chunked_argmax(model, hidden: Tensor, head: Tensor, chunk: int) -> Tensor:
    """[M] the argmax of the transformed logits, `chunk` rows at a time."""
    if len(hidden) == 0:
        return hidden.new_zeros(0, dtype=torch.long)
    return torch.cat([model.transform_logits(F.linear(h, head)).argmax(-1) for h in hidden.split(chunk)])

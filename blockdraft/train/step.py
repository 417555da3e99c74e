"""One micro-batch: capture target features, draw blocks, run the draft, compute losses/metrics.

Data flows: batch -> features -> anchors/blocks/mask -> draft hidden -> the draft's loss head over the
supervised slots (`loss_head`: its rows and head; a correcting kind's joint ones) -> block CE (+ KL) -> the
draft's own losses (`kind_losses`: a confidence BCE, a selector's or lattice's CE) and the metrics serving
will see. Every draft answers the same hooks (blockdraft/kinds/dflash/loss.py); none is told apart here.

Blocks are drawn in the label layout, [anchor, one slot per drafted token], whatever the draft
feeds itself: a DSpark draft whose anchor predicts (`sample_from_anchor`) is fed the first B of
those B + 1 slots, and slot q's output is read as the prediction of label slot q + 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from blockdraft import faults
from blockdraft.config.recipe import LoopConfig
from blockdraft.kinds.dflash.loss import BlockLoss, SupervisedSlots, chunked_argmax
from blockdraft.losses.block import (
    chunked_cross_entropy_rows,
    chunked_forward_kl_rows,
    chunked_full_kl_rows,
    dpace_weights,
    forward_kl_rows,
    has_teacher,
    normalized_loss,
    slot_weights,
    teacher_log_probs,
)
from blockdraft.models.features import batch_features, batch_features_and_final
from blockdraft.models.layers import per_layer_masks
from blockdraft.models.target import TargetModel
from blockdraft.models.teacher import slot_source_rows, slot_teacher
from blockdraft.train.anchors import BlockBatch, build_blocks, sample_anchors, sample_prefix_lengths, valid_anchor_mask
from blockdraft.train.masks import dense_block_mask, flex_block_mask
from blockdraft.train.metrics import accept_length
from blockdraft.train.step_timer import Span

# Rows per chunk of the full-distribution KL when train.loss_chunk_size is 0: two [chunk, V]
# float32 blocks (the draft's and the target's) stay small even on a 152k vocabulary.
FULL_KL_CHUNK = 256


@dataclass
class StepResult:
    loss: torch.Tensor
    """Scalar to backpropagate (0 on the graph when nothing is supervised)."""
    sums: Dict[str, torch.Tensor]
    """Sums and counts only, so that an all-reduce gives exact global metrics."""
    pred: Optional[torch.Tensor] = None
    """[N, A, B] the draft's argmax per slot in target ids (-1 where unsupervised), for metrics over whole rows."""
    blocks: Optional[BlockBatch] = None
    """The blocks `pred` belongs to: anchors, labels, supervision."""
    confidence: Optional[torch.Tensor] = None
    """A draft with a confidence head (DSpark): [N, A, B] its acceptance probability per slot (nan where unsupervised)."""
    target_time: Optional[Span] = None
    """The target's share of the micro-step (its capture; ~0 from a store), read once the step ends."""


def block_attention_mask(blocks, batch, block_size: int, backend: str, sliding_window: Optional[int], causal: bool = False):
    args = (
        blocks.anchors, blocks.anchor_valid, batch["attention_mask"], batch["document_ids"],
        batch["position_ids"], blocks.block_position_ids, block_size, sliding_window, causal,
    )
    return flex_block_mask(*args) if backend == "flex" else dense_block_mask(*args)


def draw_blocks(batch: dict, cfg: LoopConfig, block_size: int, mask_token_id: int, generator):
    valid = valid_anchor_mask(batch["loss_mask"], batch["attention_mask"], batch["document_ids"], block_size)
    anchors, anchor_valid = sample_anchors(valid, cfg.num_anchors, generator)
    prefix = sample_prefix_lengths(anchor_valid, block_size, cfg.loss_type, cfg.prefix_weight_base, generator)
    return build_blocks(
        batch["input_ids"], batch["position_ids"], batch["loss_mask"], batch["document_ids"],
        anchors, anchor_valid, prefix, block_size, mask_token_id,
    )


def train_step(draft, target: TargetModel, batch: dict, cfg: LoopConfig, generator, backend: str = "sdpa") -> StepResult:
    module = getattr(draft, "module", draft)  # DDP wraps the draft; its config stays on the module
    dcfg = module.config
    b = dcfg.num_speculative_tokens + 1  # the label block: the anchor and one slot per drafted token
    blocks = draw_blocks(batch, cfg, b, dcfg.mask_token_id, generator)
    fed, b_fed = fed_blocks(blocks, dcfg)
    target_time = Span(batch["input_ids"].device)
    # From a feature store the batch carries the target's features; online, the target runs now
    # (through its last layer when soft labels need its distribution).
    online_soft_labels = cfg.kl_weight > 0 and "features" not in batch
    final_hidden = None
    if "features" in batch:
        features = batch["features"]  # [N, T, n*H_t]
    elif online_soft_labels:
        features, final_hidden = batch_features_and_final(target, batch)
    else:
        features = batch_features(target, batch)
    target_time.stop()
    if cfg.feature_noise_std and draft.training:
        features = add_feature_noise(features, cfg.feature_noise_std, generator)
    mask = per_layer_masks(
        dcfg.layer_attention(), lambda window, causal: block_attention_mask(fed, batch, b_fed, backend, window, causal)
    )
    ctx_kv = module.context_kv(features, batch["position_ids"])
    embeds = module.embed(fed.block_ids, target.embed_tokens)  # [N, A*B_fed, H]
    hidden = draft(embeds, fed.block_position_ids, ctx_kv, mask, b_fed)  # [N, A*B_fed, H]
    n, a = blocks.anchors.shape
    hidden = hidden.view(n, a, b_fed, -1)
    if b_fed < b:  # slot q predicts label slot q + 1; label slot 0 (the anchor) is never supervised
        hidden = F.pad(hidden, (0, 0, 1, 0))
    # hidden: [N, A, B, H]
    sup = blocks.label_mask  # [N, A, B]
    h_sup = hidden[sup]  # [M, H]
    labels = blocks.labels[sup]  # [M] target ids
    # A reduced vocabulary: the loss runs over draft ids; labels outside it cannot be drafted and
    # are left out of the loss (they still count as misses in the metrics, as in serving).
    loss_labels = module.to_draft_ids(labels)  # [M]
    outside = loss_labels < 0
    loss_labels = loss_labels.clamp(min=0)
    lm_head = module.head_weight(target.lm_head_weight)  # [V_draft, H]
    chunk = cfg.loss_chunk_size
    slots = SupervisedSlots(cfg=cfg, target=target, features=features, blocks=blocks, block_hidden=hidden, hidden=h_sup,
                            head=lm_head, labels=labels, draft_labels=loss_labels, outside=outside)
    head = module.loss_head(slots)
    h_sup, lm_head = head.hidden, head.head  # [M, H'], [V_draft, H']
    if chunk:
        ce = chunked_cross_entropy_rows(h_sup, lm_head, loss_labels, chunk, _transform(module))  # [M]
        pred_sup, logits = chunked_argmax(module, h_sup, lm_head, chunk), None
    else:
        logits = module.transform_logits(F.linear(h_sup, lm_head))  # [M, V_draft]
        ce = F.cross_entropy(logits.float(), loss_labels, reduction="none")  # [M]
        pred_sup = logits.argmax(-1)
    weights = position_weights(cfg, blocks, sup, ce, outside)  # [M]
    norm = loss_normalization(cfg)
    block_ids = torch.arange(n * a, device=sup.device).view(n, a, 1).expand_as(sup)[sup]  # [M]
    loss = cfg.ce_weight * normalized_loss(ce, weights * ~outside, block_ids, norm) if cfg.ce_weight else 0.0
    sums = {"micro_batches": torch.tensor(1.0)}
    if cfg.kl_weight > 0:
        kl, taught = _soft_label_kl(module, cfg, batch, final_hidden, target, blocks, sup, h_sup, lm_head, logits)  # [M] each
        # A slot none of whose teacher candidates the draft can emit carries no KL signal: out of the
        # KL and of its denominator (its CE still counts).
        kl_loss = normalized_loss(kl, weights * taught, block_ids, norm)
        loss = loss + cfg.kl_weight * kl_loss
        sums["kl_sum"] = kl_loss.detach() * 1.0
        sums["kl_rows_without_teacher"] = (~taught).sum().float()
    target_pred = module.to_target_ids(pred_sup)
    block = BlockLoss(hidden=h_sup, head=lm_head, logits=logits, ce=ce, draft_pred=pred_sup, pred=target_pred,
                      weights=weights, block_ids=block_ids, normalization=norm)
    kind = module.kind_losses(slots, block)
    if kind.loss is not None:
        loss = loss + kind.loss
    sums.update(kind.sums)
    confidence = None
    if kind.confidence is not None:
        confidence = torch.full(blocks.labels.shape, float("nan"), device=kind.confidence.device)
        confidence[sup] = kind.confidence
    loss = faults.corrupt("train.loss", loss)
    sums["loss_sum"] = loss.detach() * 1.0
    if module.reduced_vocab:
        sums["labels_outside_vocab"] = outside.sum().float()
    if head.base_pred is not None:
        # The backbone alone, uncorrected: its argmax is a draft id, the label a target id.
        sums["correction_base_correct"] = (module.to_target_ids(head.base_pred) == labels).sum().float()
    if kind.aside is not None:
        loss = loss + kind.aside
    pred_sup = target_pred if kind.pred is None else kind.pred
    pred = torch.full_like(blocks.labels, -1)
    pred[sup] = pred_sup
    _slot_metrics(pred, blocks, sums)
    return StepResult(loss, sums, pred, blocks, confidence, target_time)


def fed_blocks(blocks: BlockBatch, dcfg) -> tuple:
    """The slots the draft is fed and how many per block: the label blocks themselves, or for a DSpark
    draft whose anchor predicts, their first B slots ([anchor, MASK x (B-1)] at positions a..a+B-1)."""
    b = blocks.labels.shape[-1]
    if not dcfg.anchor_predicts:
        return blocks, b
    n, a = blocks.anchors.shape

    def first(x):
        return x.view(n, a, b)[..., : b - 1].reshape(n, a * (b - 1))

    return dataclasses.replace(blocks, block_ids=first(blocks.block_ids), block_position_ids=first(blocks.block_position_ids)), b - 1


def position_weights(cfg: LoopConfig, blocks, sup, ce, outside) -> torch.Tensor:
    """Each supervised slot's weight [M]: the slot decay, or D-PACE from the draft's confidence in
    its label (exp(-CE); 0 for a label outside a reduced vocabulary, which it can never draft)."""
    if cfg.position_weighting == "decay":
        return slot_weights(blocks.slot_weights_offset[sup], cfg.gamma)
    confidence = torch.zeros(sup.shape, dtype=torch.float32, device=ce.device)
    confidence[sup] = torch.exp(-ce.detach().float()) * ~outside
    return dpace_weights(confidence, sup, cfg.dpace_alpha)[sup]


def loss_normalization(cfg: LoopConfig) -> str:
    """The recipe's denominator, or the position weighting's default (docs/training.md says why)."""
    if cfg.loss_normalization is not None:
        return cfg.loss_normalization
    return DEFAULT_NORMALIZATION[cfg.position_weighting]


# D-PACE by its supervised slots: measured against weights and blocks on the demo's store, where it
# gave the best held-out accept_len by a margin within the seed spread (docs/benchmarks-history.md, "Loss
# normalisation"). The decay keeps the weighted mean it was tuned with.
DEFAULT_NORMALIZATION = {"decay": "weights", "dpace": "tokens"}


def _soft_label_kl(module, cfg: LoopConfig, batch, final_hidden, target, blocks, sup, h_sup, lm_head, logits):
    """Forward KL per supervised slot against the target in the draft's vocabulary, and which slots
    have a teacher there: ([M], [M] bool). The target's top-k, or with teacher_top_k null/0 its full
    distribution (online; from a store, the top-k it kept)."""
    if not cfg.teacher_top_k and "teacher_ids" not in batch:
        r, p = slot_source_rows(blocks.anchors, sup)
        # The target's own head rows of the draft's tokens (a reduced draft trains a head of its own).
        teacher_head = target.lm_head_weight[module.draft_token_ids()] if module.reduced_vocab else target.lm_head_weight
        kl = chunked_full_kl_rows(h_sup, lm_head, final_hidden[r, p], teacher_head, cfg.kl_temperature,
                                  cfg.loss_chunk_size or FULL_KL_CHUNK, _transform(module))
        return kl, torch.ones_like(kl, dtype=torch.bool)
    teacher_ids, teacher_logits = slot_teacher(batch, final_hidden, target.lm_head_weight, blocks.anchors, sup,
                                               cfg.teacher_top_k)
    draft_ids = module.to_draft_ids(teacher_ids)  # -1: a candidate the draft's vocabulary lacks
    usable = draft_ids >= 0
    logq = teacher_log_probs(teacher_logits, usable, cfg.kl_temperature)
    draft_ids = draft_ids.clamp(min=0)
    if logits is not None:
        kl = forward_kl_rows(logits, draft_ids, logq, cfg.kl_temperature)
    else:
        kl = chunked_forward_kl_rows(h_sup, lm_head, draft_ids, logq, cfg.kl_temperature, cfg.loss_chunk_size,
                                     _transform(module))
    return kl, has_teacher(usable)


def add_feature_noise(features: torch.Tensor, std: float, generator) -> torch.Tensor:
    """features + N(0, std^2), drawn from the micro-batch's own generator so the noise, like the
    anchors, does not depend on how the work is split over ranks."""
    device = generator.device if generator is not None else features.device
    noise = torch.randn(features.shape, generator=generator, device=device, dtype=torch.float32)
    return features + std * noise.to(features.device, features.dtype)


def _transform(module):
    cfg = module.config
    if cfg.output_multiplier == 1.0 and not cfg.final_logit_softcapping:
        return None
    return module.transform_logits


def _slot_metrics(pred, blocks, sums) -> None:
    correct = ((pred == blocks.labels) & blocks.label_mask).sum(dim=(0, 1)).float()  # [B]
    supervised = blocks.label_mask.sum(dim=(0, 1)).float()  # [B]
    acc_sum, acc_count = accept_length(pred, blocks.labels, blocks.label_mask, blocks.prefix_len)
    sums.update({
        "slot_correct": correct,
        "slot_supervised": supervised,
        "accept_len_sum": acc_sum.float(),
        "accept_len_blocks": acc_count.float(),
        "valid_anchors": blocks.anchor_valid.sum().float(),
    })

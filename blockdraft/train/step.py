"""One micro-batch: capture target features, draw blocks, run the draft, compute losses/metrics.

Data flows: batch -> features -> anchors/blocks/mask -> draft hidden -> logits of the
supervised slots -> block CE (+ DFlash2 selector CE; Domino and DSpark: on their corrected logits;
DSpark: + its confidence head's BCE; LiLiCorr: + its lattice path loss) and the metrics serving will see.

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
from torch.utils.checkpoint import checkpoint

from blockdraft import faults
from blockdraft.kinds.dflash2.model import DFlash2DraftModel
from blockdraft.kinds.domino.model import DominoDraftModel
from blockdraft.kinds.dspark.model import DSparkDraftModel
from blockdraft.models.layers import per_layer_masks
from blockdraft.kinds.lilicorr.model import LiLiCorrDraftModel, walk
from blockdraft.models.target import TargetModel
from blockdraft.train.anchors import BlockBatch, build_blocks, sample_anchors, sample_prefix_lengths, valid_anchor_mask
from blockdraft.train.config import LoopConfig
from blockdraft.train.confidence import acceptance_target, confidence_loss
from blockdraft.train.features import batch_features, batch_features_and_final
from blockdraft.train.lilicorr_loss import chunked_candidates, path_loss
from blockdraft.train.losses import (
    chunked_cross_entropy_rows,
    chunked_forward_kl_rows,
    chunked_full_kl_rows,
    dpace_weights,
    forward_kl_rows,
    has_teacher,
    normalized_loss,
    selector_cross_entropy,
    slot_weights,
    teacher_log_probs,
    topk_candidates,
)
from blockdraft.train.masks import dense_block_mask, flex_block_mask
from blockdraft.train.metrics import accept_length
from blockdraft.train.step_timer import Span
from blockdraft.train.teacher import slot_source_rows, slot_teacher

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
    """DSpark: [N, A, B] the confidence head's acceptance probability per slot (nan where unsupervised)."""
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
    base_pred = None
    if isinstance(module, DominoDraftModel):
        # Teacher-forced correction; its logits are [W | up] [h ; u], so every loss below runs on them as is.
        base_pred = _chunked_argmax(module, h_sup, lm_head, chunk or max(1, len(h_sup)))
        states = module.correction_states(blocks.predecessors, target.embed_tokens)  # [N, A, B, S]
        h_sup, lm_head = module.joint_hidden(h_sup, states[sup]), module.joint_head(lm_head)  # [M, H+R], [V, H+R]
    if isinstance(module, DSparkDraftModel):
        # Teacher-forced Markov head: each slot's previous token is the true one, as speculators trains it.
        base_pred = _chunked_argmax(module, h_sup, lm_head, chunk or max(1, len(h_sup)))
        h_sup, lm_head = module.joint_hidden(h_sup, blocks.predecessors[sup]), module.joint_head(lm_head)  # [M, H+r]
    if chunk:
        ce = chunked_cross_entropy_rows(h_sup, lm_head, loss_labels, chunk, _transform(module))  # [M]
        pred_sup, logits = _chunked_argmax(module, h_sup, lm_head, chunk), None
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
    confidence = None
    if isinstance(module, DSparkDraftModel) and module.confidence_head is not None:
        loss, predicted = _add_confidence_loss(module, cfg, h_sup, pred_sup, loss_labels, ce, outside, weights, block_ids,
                                               norm, loss, sums)
        confidence = torch.full(blocks.labels.shape, float("nan"), device=predicted.device)
        confidence[sup] = predicted
    loss = faults.corrupt("train.loss", loss)
    sums["loss_sum"] = loss.detach() * 1.0
    pred_sup = module.to_target_ids(pred_sup)
    if module.reduced_vocab:
        sums["labels_outside_vocab"] = outside.sum().float()
    if base_pred is not None:
        sums["correction_base_correct"] = (base_pred == labels).sum().float()  # the backbone alone, uncorrected
    if isinstance(module, DFlash2DraftModel):
        cand_ids, cand_logits = _candidates(module, h_sup, lm_head, logits, chunk)
        loss, pred_sup = _add_selector_loss(module, cfg, cand_ids, cand_logits, h_sup, blocks.predecessors[sup], labels,
                                            weights, loss, pred_sup, sums, block_ids, norm)
    if isinstance(module, LiLiCorrDraftModel):
        loss, pred_sup = _add_path_loss(module, cfg, features, hidden, blocks, target, lm_head, weights, loss, pred_sup,
                                        sums, norm)
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


def _add_confidence_loss(module, cfg: LoopConfig, joint, pred, labels, ce, outside, weights, block_ids, norm, loss, sums):
    """DSpark: the confidence head's BCE against each slot's acceptance (train/confidence.py), weighted and
    normalised as the block loss is (speculators weights it with the same position decay). Returns the
    loss and each slot's predicted acceptance [M]."""
    logits = module.confidence_logits(joint)  # [M]
    target = acceptance_target(cfg.confidence_target, pred, labels, ce, outside)  # [M]
    conf_loss = normalized_loss(confidence_loss(logits, target), weights, block_ids, norm)
    predicted = logits.detach().float().sigmoid()
    sums.update({
        "confidence_loss_sum": conf_loss.detach() * 1.0,
        "confidence_predicted_sum": predicted.sum(),
        "confidence_target_sum": target.sum(),
        "confidence_abs_error_sum": (predicted - target).abs().sum(),
    })
    return (loss + cfg.confidence_weight * conf_loss if cfg.confidence_weight else loss), predicted


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


@torch.no_grad()
def _chunked_argmax(module, hidden, lm_head, chunk: int) -> torch.Tensor:
    if len(hidden) == 0:
        return hidden.new_zeros(0, dtype=torch.long)
    return torch.cat([module.transform_logits(F.linear(h, lm_head)).argmax(-1) for h in hidden.split(chunk)])


def _candidates(module, hidden, lm_head, logits, chunk: int):
    """Each slot's top-k tokens and their (differentiable) logits: [M, k] each.

    Chunked, only k logits per slot are kept: the [chunk, V] block is recomputed in backward."""
    k = module.config.selector_top_k
    if not chunk:
        return topk_candidates(logits, k)
    with torch.no_grad():
        ids = torch.cat([module.logits(h, lm_head).topk(k, dim=-1).indices for h in hidden.split(chunk)]) if len(hidden) else hidden.new_zeros(0, k, dtype=torch.long)

    def gather(h, w, idx):
        return module.logits(h, w).gather(-1, idx)

    parts = [checkpoint(gather, h, lm_head, i, use_reentrant=False) for h, i in zip(hidden.split(chunk), ids.split(chunk))]
    return ids, (torch.cat(parts) if parts else hidden.new_zeros(0, k))


def _add_selector_loss(module, cfg: LoopConfig, cand_ids, cand_logits, h_sup, predecessors, labels, weights, loss, base_pred,
                       sums, block_ids, norm: str):
    """DFlash2: CE of the pairwise selector over each slot's top-k, with true predecessors, normalised as the
    block CE is (train.loss_normalization)."""
    scores = module.candidate_selector.score(h_sup, predecessors, cand_ids, cand_logits)  # [M, k]
    sel_loss, recall = selector_cross_entropy(scores, cand_ids, labels, weights, block_ids, norm)
    sel_pred = cand_ids.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)  # [M]
    m = float(len(labels))
    sums.update({
        "selector_loss_sum": sel_loss.detach() * 1.0,
        "recall_hits": (recall.nan_to_num(0.0) * m).detach(),
        "base_correct": (base_pred == labels).sum().float(),
        "selector_correct": (sel_pred == labels).sum().float(),
    })
    return loss + cfg.selector_loss_weight * sel_loss, sel_pred


def _add_path_loss(module, cfg: LoopConfig, features, hidden, blocks, target, lm_head, weights, loss, base_pred, sums,
                   norm: str):
    """LiLiCorr: the lattice head's path loss (train/lilicorr_loss.py) over each block's drafted slots, with
    the block CE's weights. The slots' predictions become the greedy walk's tokens, as vLLM drafts them."""
    sup = blocks.label_mask[:, :, 1:]  # [N, A, S]: slot 0 is the anchor
    n, a, s = sup.shape
    slot_hidden = hidden[:, :, 1:].reshape(n * a, s, -1)
    log_probs, cand_ids = chunked_candidates(module, slot_hidden, lm_head, cfg.loss_chunk_size)
    # The context state before each anchor, as vLLM's speculator takes it (hidden_norm(fc(...)) at the
    # last accepted position); none before a row's first token.
    context = module.project_context(features)  # [N, T, H]
    before = (blocks.anchors - 1).clamp(min=0)
    anchor_hidden = context.gather(1, before[..., None].expand(-1, -1, context.shape[-1])).reshape(n * a, -1)
    anchor_valid = (blocks.anchor_valid & (blocks.anchors > 0)).reshape(n * a)
    scores = module.lilicorr(target.embed_tokens(cand_ids).to(slot_hidden.dtype), log_probs, slot_hidden,
                             anchor_hidden, anchor_valid)  # [R, S, k, k]
    slot_w = torch.zeros(blocks.label_mask.shape, device=weights.device, dtype=torch.float32)
    slot_w[blocks.label_mask] = weights.float()
    labels, sup = blocks.labels[:, :, 1:].reshape(n * a, s), sup.reshape(n * a, s)
    p_loss, hits = path_loss(scores, cand_ids, labels, sup, slot_w[:, :, 1:].reshape(n * a, s), norm)
    walked = torch.full_like(blocks.labels, -1)
    walked[:, :, 1:] = walk(scores.detach(), cand_ids)[0].view(n, a, s)
    pred_sup = walked[blocks.label_mask]
    labels_sup = blocks.labels[blocks.label_mask]
    sums.update({
        "selector_loss_sum": p_loss.detach() * 1.0,
        "recall_hits": hits.detach(),
        "base_correct": (base_pred == labels_sup).sum().float(),
        "selector_correct": (pred_sup == labels_sup).sum().float(),
    })
    return loss + cfg.selector_loss_weight * p_loss, pred_sup


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

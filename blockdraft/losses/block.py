"""Losses of the block drafters, as pure functions.

The caller gathers the supervised slots (`label_mask`) into M rows. The `*_rows`
functions give one value per row; `normalized_loss` turns them into the scalar, sum(w * loss)
over a denominator the recipe picks (`LOSS_NORMALIZATIONS`), exactly 0, still on the inputs'
autograd graph (so every rank runs the same backward), when nothing is supervised. The
position weights (the slot decay, D-PACE) are here too.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from blockdraft.errors import ConfigError

LogitTransform = Callable[[Tensor], Tensor]


def slot_weights(offset: Tensor, gamma: Optional[float]) -> Tensor:
    """Per-slot loss weight exp(-offset / gamma); ones when gamma is None.

    offset = k - prefix_len (shape [...] long), so the decay restarts at the first
    supervised slot. Unsupervised slots have negative offsets; they are clamped to 0
    so their (unused) weights cannot overflow.
    """
    if gamma is None:
        return torch.ones(offset.shape, dtype=torch.float32, device=offset.device)
    if not gamma > 0:
        raise ConfigError(f"gamma={gamma}: the slot decay needs gamma > 0, or null for uniform")
    return torch.exp(-offset.clamp(min=0).float() / gamma)


def weighted_mean(values: Tensor, weights: Tensor) -> Tensor:
    """sum(w * v) / sum(w); 0, still on `values`' graph, when sum(w) is 0."""
    return _weighted_sum_over(values, weights, weights.sum())


def _weighted_sum_over(values: Tensor, weights: Tensor, total: Tensor) -> Tensor:
    """sum(w * v) / total; 0, still on `values`' graph, when total is 0."""
    # A safe denominator instead of a where() over a division: the unused branch of
    # where() would still send 0 * inf = NaN gradients back.
    safe_total = torch.where(total > 0, total, torch.ones_like(total))
    return (weights * values).sum() / safe_total


# --- normalisation -------------------------------------------------------------------------
# What the weighted sum of a micro-batch's slot losses is divided by:
#   weights  sum(w): every block's weights sum to one unit of credit (a mean under the weights);
#   blocks   the blocks with a supervised slot: a confident block, whose D-PACE weights are large,
#            counts for more than an unsure one (SpecForge's and speculators' D-PACE);
#   tokens   the supervised slots (a per-token mean, as a plain CE).
LOSS_NORMALIZATIONS = ("weights", "blocks", "tokens")


def check_loss_normalization(name: str) -> None:
    if name not in LOSS_NORMALIZATIONS:
        raise ConfigError(f"train.loss_normalization={name!r}; use one of {list(LOSS_NORMALIZATIONS)}, "
                          "or null for the position weighting's own default.")


def normalized_loss(values: Tensor, weights: Tensor, block_ids: Tensor, mode: str) -> Tensor:
    """sum(w * v) / the denominator `mode` names, over rows with w > 0 counted as supervised.

    values, weights [M]; block_ids [M] long: the block each row belongs to (any ids; only which
    rows share one matters). A row left out of a loss (a label outside a reduced vocabulary, a
    slot without a teacher) carries weight 0 and so counts in no denominator. 0, still on
    `values`' graph, when nothing counts."""
    check_loss_normalization(mode)
    weights = weights.float()
    counted = weights > 0
    if mode == "weights":
        total = weights.sum()
    elif mode == "tokens":
        total = counted.sum().float()
    else:
        total = torch.tensor(float(torch.unique(block_ids[counted]).numel()), device=values.device)
    return _weighted_sum_over(values, weights, total)


def block_cross_entropy(logits: Tensor, labels: Tensor, weights: Tensor) -> Tensor:
    """Weighted CE over supervised slots. logits [M, V], labels [M], weights [M] -> []."""
    ce = F.cross_entropy(logits.float(), labels, reduction="none")  # [M]
    return weighted_mean(ce, weights.float())


def _chunk_ce(
    hidden: Tensor, lm_head_weight: Tensor, labels: Tensor,
    logit_transform: Optional[LogitTransform],
) -> Tensor:
    logits = hidden @ lm_head_weight.t()  # [m, V]
    if logit_transform is not None:
        logits = logit_transform(logits)
    return F.cross_entropy(logits.float(), labels, reduction="none")  # [m]


def chunked_cross_entropy_rows(
    hidden: Tensor, lm_head_weight: Tensor, labels: Tensor, chunk_size: int,
    logit_transform: Optional[LogitTransform] = None,
) -> Tensor:
    """Per-row CE of `logit_transform(hidden @ lm_head_weight.T)`: [M], chunked and checkpointed
    like `chunked_block_cross_entropy` (at most [chunk_size, V] logits live at once)."""
    if chunk_size < 1:
        raise ConfigError(f"chunk_size={chunk_size}: the CE chunk needs at least one row")
    if hidden.shape[0] == 0:
        # No chunk to run: an empty row tied to both inputs, so backward still reaches them.
        return (hidden.sum() + lm_head_weight.sum()).float().reshape(1)[:0]
    return torch.cat([
        checkpoint(_chunk_ce, h, lm_head_weight, y, logit_transform, use_reentrant=False)
        for h, y in zip(hidden.split(chunk_size), labels.split(chunk_size))
    ])


# --- soft labels from the target ------------------------------------------------------------
def teacher_log_probs(teacher_logits: Tensor, usable: Tensor, temperature: float) -> Tensor:
    """The target's top-k distribution, renormalised over the usable candidates.

    teacher_logits [M, k], usable [M, k] bool (False: a candidate the draft cannot emit, e.g.
    outside a reduced vocabulary) -> log q [M, k], -inf where unusable. A row with no usable
    candidate carries no signal: it is all -inf too (never NaN, which its backward would spread
    to every weight), and `forward_kl_rows` gives it 0; callers leave it out (`has_teacher`)."""
    scaled = teacher_logits.float() / temperature
    has = has_teacher(usable).unsqueeze(-1)
    # A softmax over nothing is NaN: such rows are normalised over all k, then masked out again.
    logq = torch.log_softmax(torch.where(has, scaled.masked_fill(~usable, float("-inf")), scaled), dim=-1)
    return logq.masked_fill(~usable, float("-inf"))


def has_teacher(usable: Tensor) -> Tensor:
    """[M, k] bool -> [M] bool: rows with at least one candidate the draft can emit."""
    return usable.any(dim=-1)


def forward_kl_rows(draft_logits: Tensor, teacher_ids: Tensor, teacher_logq: Tensor, temperature: float) -> Tensor:
    """KL(q || p) per row over the teacher's candidates: sum_j q_j (log q_j - log p_j), times T^2.

    draft_logits [M, V] (the draft's full distribution p = softmax(logits / T)), teacher_ids
    [M, k] draft-vocabulary ids, teacher_logq [M, k] from `teacher_log_probs` -> [M]. The T^2
    keeps the gradient's scale independent of the temperature (as in distillation since
    Hinton et al.); rows with no usable candidate give 0."""
    logp = torch.log_softmax(draft_logits.float() / temperature, dim=-1).gather(-1, teacher_ids)  # [M, k]
    q = teacher_logq.exp()
    # 0 * log 0 = 0: the finite stand-in keeps every product finite, forward and backward.
    logq = torch.where(q > 0, teacher_logq, torch.zeros_like(teacher_logq))
    return (q * (logq - logp)).sum(-1) * temperature**2


def _chunk_kl(hidden, lm_head_weight, teacher_ids, teacher_logq, temperature, logit_transform):
    logits = hidden @ lm_head_weight.t()
    if logit_transform is not None:
        logits = logit_transform(logits)
    return forward_kl_rows(logits, teacher_ids, teacher_logq, temperature)


def chunked_forward_kl_rows(
    hidden: Tensor, lm_head_weight: Tensor, teacher_ids: Tensor, teacher_logq: Tensor, temperature: float,
    chunk_size: int, logit_transform: Optional[LogitTransform] = None,
) -> Tensor:
    """`forward_kl_rows` of `logit_transform(hidden @ lm_head_weight.T)`: [M], chunked and checkpointed."""
    if hidden.shape[0] == 0:
        return (hidden.sum() + lm_head_weight.sum()).float().reshape(1)[:0]
    return torch.cat([
        checkpoint(_chunk_kl, h, lm_head_weight, i, q, temperature, logit_transform, use_reentrant=False)
        for h, i, q in zip(hidden.split(chunk_size), teacher_ids.split(chunk_size), teacher_logq.split(chunk_size))
    ])


def _chunk_full_kl(hidden, lm_head_weight, teacher_hidden, teacher_head, temperature, logit_transform):
    logits = hidden @ lm_head_weight.t()
    if logit_transform is not None:
        logits = logit_transform(logits)
    with torch.no_grad():
        logq = torch.log_softmax((teacher_hidden.float() @ teacher_head.float().t()) / temperature, dim=-1)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return (logq.exp() * (logq - logp)).sum(-1) * temperature**2


def chunked_full_kl_rows(
    hidden: Tensor, lm_head_weight: Tensor, teacher_hidden: Tensor, teacher_head: Tensor, temperature: float,
    chunk_size: int, logit_transform: Optional[LogitTransform] = None,
) -> Tensor:
    """KL(q || p) per row over the whole draft vocabulary: [M].

    hidden [M, H] and lm_head_weight [V, H] give the draft's logits; teacher_hidden [M, H_t] (the
    target's final hidden states at each slot's source position) and teacher_head [V, H_t] (the
    target's head rows of the same V tokens) give the teacher's, renormalised over those V.
    Chunked and checkpointed: at most two [chunk_size, V] blocks live at once, so a 152k
    vocabulary never holds a [M, V] tensor; backward recomputes both."""
    if chunk_size < 1:
        raise ConfigError(f"chunk_size={chunk_size}: the KL chunk needs at least one row")
    if hidden.shape[0] == 0:
        return (hidden.sum() + lm_head_weight.sum()).float().reshape(1)[:0]
    return torch.cat([
        checkpoint(_chunk_full_kl, h, lm_head_weight, t, teacher_head, temperature, logit_transform, use_reentrant=False)
        for h, t in zip(hidden.split(chunk_size), teacher_hidden.split(chunk_size))
    ])


# --- position weights -----------------------------------------------------------------------
POSITION_WEIGHTINGS = ("decay", "dpace")


def check_dpace_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"train.dpace_alpha={alpha}: the D-PACE smoothing must lie in [0, 1] (0.5 is the paper's).")


@torch.no_grad()
def dpace_weights(label_prob: Tensor, supervised: Tensor, alpha: float) -> Tensor:
    """D-PACE per-slot weights (arXiv 2605.18810), per block, from the draft's own confidence.

    label_prob [..., B]: the draft's probability of each slot's label (any value where not
    supervised), supervised [..., B] bool -> weights [..., B] (0 where not supervised).
    With s_k = alpha + (1 - alpha) p_k on supervised slots (1 elsewhere, so they leave the
    products alone), the cumulative confidence P_k = prod_{i<=k} s_i, and the weight is
    w_k = sum_{j>=k, supervised} P_j = P_k * (1 + s_{k+1} + s_{k+1} s_{k+2} + ...): the chance
    of reaching slot k times the value of the tokens that can follow it. Detached: a weight,
    never a path for gradients."""
    check_dpace_alpha(alpha)
    m = supervised.to(label_prob.dtype)
    smooth = torch.where(supervised, alpha + (1.0 - alpha) * label_prob, torch.ones_like(label_prob))
    reach = torch.cumprod(smooth, dim=-1) * m  # [..., B]
    suffix = reach.flip(-1).cumsum(-1).flip(-1)
    return suffix * m


def chunked_block_cross_entropy(
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    weights: Tensor,
    chunk_size: int,
    logit_transform: Optional[LogitTransform] = None,
) -> Tensor:
    """`block_cross_entropy` of `logit_transform(hidden @ lm_head_weight.T)`, chunked.

    hidden [M, H], lm_head_weight [V, H], labels [M], weights [M] -> []. At most
    [chunk_size, V] logits live at once: each chunk is checkpointed, so backward
    recomputes its logits instead of keeping them.
    """
    return weighted_mean(chunked_cross_entropy_rows(hidden, lm_head_weight, labels, chunk_size, logit_transform),
                         weights.float())


def topk_candidates(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best tokens per slot: logits [M, V] -> (ids [M, k] long, logits [M, k]).

    The candidate logits keep their graph: the selector's scores build on them.
    """
    if not 1 <= k <= logits.shape[-1]:
        raise ConfigError(
            f"selector_top_k={k}: must be between 1 and the vocabulary size {logits.shape[-1]}"
        )
    values, ids = logits.topk(k, dim=-1)  # [M, k] each
    return ids, values


def selector_cross_entropy(
    scores: Tensor, candidates: Tensor, labels: Tensor, weights: Tensor,
    block_ids: Optional[Tensor] = None, mode: str = "weights",
) -> tuple[Tensor, Tensor]:
    """DFlash2 selector CE and candidate recall.

    scores [M, k], candidates [M, k] long, labels [M], weights [M] -> (loss [], recall []).
    The CE picks the true label among the candidates, on rows where it is one of
    them, with the same weights, normalised as the block CE is (`mode`, over those rows:
    normalized_loss; block_ids [M] for mode=blocks). recall is the unweighted share of rows
    whose label is a candidate (nan when M == 0).
    """
    hit = candidates == labels.unsqueeze(-1)  # [M, k]
    found = hit.any(dim=-1)  # [M]
    target = hit.int().argmax(dim=-1)  # [M]: position of the label; 0 where absent (masked)
    ce = F.cross_entropy(scores.float(), target, reduction="none")  # [M]
    ids = block_ids if block_ids is not None else torch.arange(len(ce), device=ce.device)
    loss = normalized_loss(ce, weights.float() * found, ids, mode)
    recall = found.float().mean()
    return loss, recall

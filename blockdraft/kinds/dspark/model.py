"""DSpark: the DFlash draft plus a Markov head that lets each slot see the token drafted before it,
and a confidence head that predicts whether each slot's token is accepted (DSpark, arXiv 2607.05147).

Written against what serves it, vLLM 0.32 (`model_executor/models/qwen3_dspark.py`,
`v1/worker/gpu/spec_decode/dspark/speculator.py`), and trained as the vLLM project's own trainer
trains it (speculators, `src/speculators/models/dspark/`); docs/training.md cites the lines.

The backbone is DFlash unchanged: one non-causal pass gives every slot its normed hidden h.
    e_k = markov_w1[x_{k-1}]                       [r]: the previous token, target vocabulary
    logits_k = W h_k + markov_w2 e_k               markov_w2: [V_draft, r]
    confidence_k = sigmoid(proj([h_k ; e_k]))      (or proj(h_k) without the Markov input)
x_{k-1} is the true previous token while training (teacher forcing, as speculators does) and the
draft's own choice for the slot before while decoding (the anchor for the first). The corrected
logits are one linear map of a joint hidden, [W | markov_w2] [h ; e], so training's loss code runs
on them unchanged, as for Domino.

Layouts (`sample_from_anchor`, vLLM's key): true (vLLM's and speculators' default) feeds
[anchor, MASK x (B-1)] and slot q predicts the token after it, so B slots draft B tokens; false is
DFlash's [anchor, MASK x (B-1)] with slot k predicting its own token (B-1 drafts).

`markov_w2` starts at zero, so a fresh DSpark draft computes what its DFlash backbone computes (the
Domino convention; speculators initialises it at random): a DFlash checkpoint fine-tunes into one.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from blockdraft.kinds.dflash.decode import DraftedBlock, Pick, Sampler
from blockdraft.kinds.dflash.loss import BlockLoss, KindLoss, LossHead, SupervisedSlots, chunked_argmax
from blockdraft.kinds.dflash.model import DFlashDraftModel
from blockdraft.kinds.domino.model import greedy_pick  # the same serial choice as Domino's head
from blockdraft.kinds.dspark.loss import confidence_loss_terms
from blockdraft.models.draft_config import DraftModelConfig


class MarkovHead(nn.Module):
    """vLLM's DSparkMarkovHead: markov_w1 embeds the previous token, markov_w2 maps it to a logit bias."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        # Read at the batch's previous tokens only: AdamW steps those rows (train/seen_rows_adamw.py reads the flag).
        self.markov_w1.weight.row_lazy = True
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)
        nn.init.zeros_(self.markov_w2.weight)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(token_ids)


class ConfidenceHead(nn.Module):
    """vLLM's DSparkConfidenceHead: one linear unit with a bias, computed in float32."""

    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1, bias=True)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features.float(), self.proj.weight.float(), self.proj.bias.float()).squeeze(-1)


class DSparkDraftModel(DFlashDraftModel):
    def __init__(self, cfg: DraftModelConfig):
        super().__init__(cfg)
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.draft_vocab_size or cfg.vocab_size, cfg.markov_rank)
        self.confidence_head: Optional[ConfidenceHead] = None
        if cfg.enable_confidence_head:
            width = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_head_with_markov else 0)
            self.confidence_head = ConfidenceHead(width)

    # --- the corrected logits, one linear map of a joint hidden -----------------------
    def joint_hidden(self, hidden: torch.Tensor, previous_ids: torch.Tensor) -> torch.Tensor:
        """[h ; e]: [..., H + r], e the Markov embedding of each slot's previous token."""
        return torch.cat([hidden, self.markov_head.embed(previous_ids).to(hidden.dtype)], dim=-1)

    def joint_head(self, head_weight: torch.Tensor) -> torch.Tensor:
        """[W | markov_w2]: [V_draft, H + r]; `head_weight` is `head_weight(target lm head)`."""
        return torch.cat([head_weight, self.markov_head.markov_w2.weight.to(head_weight.dtype)], dim=1)

    def corrected_logits(self, hidden: torch.Tensor, previous_ids: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """[..., V_draft]: the backbone's logits plus the Markov bias of each slot's previous token."""
        joint_head = self.joint_head(self.head_weight(lm_head_weight))
        return self.transform_logits(F.linear(self.joint_hidden(hidden, previous_ids), joint_head))

    def confidence_logits(self, joint_hidden: torch.Tensor) -> torch.Tensor:
        """[...]: the confidence head's logit from [h ; e] (or h alone without the Markov input)."""
        assert self.confidence_head is not None
        features = joint_hidden if self.config.confidence_head_with_markov else joint_hidden[..., : self.config.hidden_size]
        return self.confidence_head(features)

    # --- serial decoding (serving), as vLLM's DSpark speculator runs it -----------------
    @torch.no_grad()
    def decode(
        self,
        hidden: torch.Tensor,
        anchor_ids: torch.Tensor,
        lm_head_weight: torch.Tensor,
        pick: Optional[Pick] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """hidden [N, K, H] (the K predicting slots), anchor_ids [N] -> target ids [N, K], the
        distribution each draft id was drawn from [N, K, V_draft], and the confidence [N, K] (None
        without the head). Each slot's choice is the next slot's previous token."""
        pick = pick or greedy_pick
        base = self.draft_logits(hidden, lm_head_weight)  # [N, K, V_draft], computed once as vLLM does
        topk = self.config.dspark_draft_topk
        candidates = base.topk(topk, dim=-1).indices if topk else None
        previous = anchor_ids
        tokens, probs, confidence = [], [], []
        for slot in range(hidden.shape[1]):
            e = self.markov_head.embed(previous).to(hidden.dtype)  # [N, r]
            logits = self.slot_logits(base[:, slot], e, None if candidates is None else candidates[:, slot])
            if self.confidence_head is not None:
                confidence.append(self.confidence_logits(torch.cat([hidden[:, slot], e], -1)).sigmoid())
            draft_ids, p = pick(logits)
            previous = self.to_target_ids(draft_ids)
            tokens.append(previous)
            probs.append(p)
        conf = torch.stack(confidence, 1) if confidence else None
        return torch.stack(tokens, 1), torch.stack(probs, 1), conf

    def slot_logits(self, base: torch.Tensor, markov_embed: torch.Tensor, candidates: Optional[torch.Tensor]) -> torch.Tensor:
        """[N, V_draft]: the base logits plus the Markov bias; with dspark_draft_topk only the
        backbone's k best tokens keep a (corrected) logit and the rest are -inf, as in vLLM's
        `_sample_sequential_topk`."""
        bias = self.transform_bias(F.linear(markov_embed, self.markov_head.markov_w2.weight.to(markov_embed.dtype)))
        if candidates is None:
            return base + bias
        out = torch.full_like(base, float("-inf"))
        return out.scatter_(1, candidates, base.gather(1, candidates) + bias.gather(1, candidates))

    def transform_bias(self, bias: torch.Tensor) -> torch.Tensor:
        # vLLM scales the bias by the same logit scale as the base logits (one LogitsProcessor).
        return bias * self.config.output_multiplier if self.config.output_multiplier != 1.0 else bias

    # --- the stages' hooks ---------------------------------------------------------------
    def loss_head(self, slots: SupervisedSlots) -> LossHead:
        """Teacher-forced Markov head: each slot's previous token is the true one, as speculators trains it."""
        base_pred = chunked_argmax(self, slots.hidden, slots.head, slots.chunk or max(1, len(slots.hidden)))
        previous = slots.blocks.predecessors[slots.sup]
        return LossHead(self.joint_hidden(slots.hidden, previous), self.joint_head(slots.head), base_pred)  # [M, H+r]

    def kind_losses(self, slots: SupervisedSlots, block: BlockLoss) -> KindLoss:
        if self.confidence_head is None:
            return KindLoss()
        return confidence_loss_terms(self, slots, block)

    def draft_block(
        self, hidden: torch.Tensor, anchor_ids: torch.Tensor, target, sampler: Sampler, last_features: torch.Tensor
    ) -> DraftedBlock:
        """Serial, as vLLM's DSpark speculator: each slot's choice is the next slot's previous token."""
        tokens, q, confidence = self.decode(hidden, anchor_ids, target.lm_head_weight, sampler.pick)
        q = q[0]  # [K, V_draft]
        if self.reduced_vocab:  # draft id i is target id draft_token_ids()[i]
            q = q.new_zeros(hidden.shape[1], self.config.vocab_size).index_copy_(1, self.draft_token_ids(), q)
        return DraftedBlock(tokens[0], q, None if confidence is None else confidence[0])

"""Domino: the DFlash draft plus a serial correction head that lets each block slot see the tokens
drafted before it (Domino, arXiv 2605.29707: a parallel backbone, then a GRU causal encoder and a
low-rank residual correction of the backbone's logits).

The backbone is DFlash unchanged: one non-causal pass gives every slot k its normed hidden h_k
and base logits W h_k (W: the target's LM head). The head then runs serially over slots 1..B-1:
    s_0 = 0,  s_k = GRUCell(e(x_{k-1}), s_{k-1})      e: the target's embeddings, x_0 the anchor
    u_k = SiLU(down([h_k | s_k]))                      [R], R = correction_rank
    logits_k = W h_k + up(u_k)                          up: [V, R], zero at init
x_{k-1} is the true token while training (teacher forcing, `blocks.predecessors`) and the draft's
own choice for slot k-1 while decoding. `up` starts at zero, so a fresh Domino draft computes
exactly what its DFlash backbone computes (the DFlash2 convention), and the head learns only a
residual. The corrected logits are one linear map of a joint hidden: [W | up] [h_k ; u_k], which
lets training's loss code (chunked or not, soft labels, D-PACE) run on them unchanged.

Left out of the published recipe: the base-anchored curriculum (a loss mixing the base logits' CE
in early steps); training here uses the corrected logits' block CE alone. A reduced draft
vocabulary is refused (the correction's output spans the target's full vocabulary). vLLM has no
Domino drafter: the project's reference engine serves it (`blockdraft/engine/decoder.py`).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from blockdraft.kinds.dflash.decode import DraftedBlock, Pick, Sampler
from blockdraft.kinds.dflash.loss import LossHead, SupervisedSlots, chunked_argmax
from blockdraft.kinds.dflash.model import DFlashDraftModel
from blockdraft.models.draft_config import DraftModelConfig


def greedy_pick(logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    tokens = logits.argmax(-1)
    return tokens, F.one_hot(tokens, logits.shape[-1]).float()


class DominoCorrection(nn.Module):
    """The GRU over predecessor embeddings and the low-rank logit correction from [h | state]."""

    def __init__(self, hidden_size: int, state_size: int, rank: int, vocab_size: int):
        super().__init__()
        self.gru = nn.GRUCell(hidden_size, state_size, bias=False)
        self.down = nn.Linear(hidden_size + state_size, rank, bias=False)
        self.up = nn.Linear(rank, vocab_size, bias=False)

    def step(self, predecessor_embeds: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """[M, H], [M, S] -> the next state [M, S]."""
        return self.gru(predecessor_embeds.to(self.gru.weight_ih.dtype), state)

    def features(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """u = SiLU(down([h | s])): [..., R]."""
        return F.silu(self.down(torch.cat([hidden, state.to(hidden.dtype)], dim=-1)))


class DominoDraftModel(DFlashDraftModel):
    def __init__(self, cfg: DraftModelConfig):
        super().__init__(cfg)
        self.correction = DominoCorrection(
            cfg.hidden_size, cfg.correction_hidden_size, cfg.correction_rank, cfg.vocab_size
        )
        for module in (self.correction.gru, self.correction.down):
            for weight in module.parameters():
                nn.init.normal_(weight, std=0.02)
        nn.init.zeros_(self.correction.up.weight)  # a fresh Domino draft computes its DFlash backbone

    def zero_state(self, rows: int, device) -> torch.Tensor:
        """The state before slot 1: [rows, S]."""
        weight = self.correction.gru.weight_ih
        return torch.zeros(rows, self.config.correction_hidden_size, dtype=weight.dtype, device=device)

    # --- teacher forcing (training) --------------------------------------------------
    def correction_states(self, predecessor_ids: torch.Tensor, embed_tokens: nn.Module) -> torch.Tensor:
        """predecessor_ids [..., B] (slot k's: the token at slot k-1) -> states [..., B, S].

        Slot k's state has read the predecessors of slots 1..k and nothing after; slot 0 (the
        anchor, never drafted) keeps the zero state."""
        lead, b = predecessor_ids.shape[:-1], predecessor_ids.shape[-1]
        flat = predecessor_ids.reshape(-1, b)  # [M, B]
        embeds = embed_tokens(flat[:, 1:])  # [M, B-1, H]
        state = self.zero_state(flat.shape[0], embeds.device)
        states = [state]
        for k in range(1, b):
            state = self.correction.step(embeds[:, k - 1], state)
            states.append(state)
        # Under autocast the GRU's states may come out in bf16 while the zero state is fp32.
        return torch.stack([s.to(state.dtype) for s in states], dim=1).view(*lead, b, -1)

    # --- the corrected logits, one linear map of a joint hidden -----------------------
    def joint_hidden(self, hidden: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """[h ; u]: [..., H + R]."""
        u = self.correction.features(hidden, states)
        return torch.cat([hidden, u.to(hidden.dtype)], dim=-1)

    def joint_head(self, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """[W | up]: [V, H + R]."""
        return torch.cat([lm_head_weight, self.correction.up.weight.to(lm_head_weight.dtype)], dim=1)

    def corrected_logits(self, hidden: torch.Tensor, states: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """[..., V]: the backbone's logits plus the correction."""
        return self.draft_logits(self.joint_hidden(hidden, states), self.joint_head(lm_head_weight))

    # --- serial decoding (serving) ----------------------------------------------------
    @torch.no_grad()
    def decode(
        self,
        hidden: torch.Tensor,
        anchor_ids: torch.Tensor,
        embed_tokens: nn.Module,
        lm_head_weight: torch.Tensor,
        pick: Optional[Pick] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """hidden [N, K, H] (slots 1..K), anchor_ids [N] -> tokens [N, K] and, per slot, the
        distribution its token was drawn from [N, K, V] (given the tokens drafted before it, which
        is what rejection sampling needs). Each slot's choice feeds the next slot's state."""
        pick = pick or greedy_pick
        head = self.joint_head(lm_head_weight)
        state = self.zero_state(hidden.shape[0], hidden.device)
        previous = anchor_ids
        tokens, probs = [], []
        for slot in range(hidden.shape[1]):
            state = self.correction.step(embed_tokens(previous), state)
            logits = self.draft_logits(self.joint_hidden(hidden[:, slot], state), head)  # [N, V]
            previous, p = pick(logits)
            tokens.append(previous)
            probs.append(p)
        return torch.stack(tokens, 1), torch.stack(probs, 1)

    # --- the stages' hooks ---------------------------------------------------------------
    def loss_head(self, slots: SupervisedSlots) -> LossHead:
        """Teacher-forced correction; its logits are [W | up] [h ; u], so every block loss runs on them as is."""
        base_pred = chunked_argmax(self, slots.hidden, slots.head, slots.chunk or max(1, len(slots.hidden)))
        states = self.correction_states(slots.blocks.predecessors, slots.target.embed_tokens)  # [N, A, B, S]
        return LossHead(self.joint_hidden(slots.hidden, states[slots.sup]), self.joint_head(slots.head), base_pred)

    def draft_block(
        self, hidden: torch.Tensor, anchor_ids: torch.Tensor, target, sampler: Sampler, last_features: torch.Tensor
    ) -> DraftedBlock:
        """Serial: each slot is corrected with the tokens drafted before it, and q_i is what d_i was drawn from
        given them, as verification's p_i is given the same tokens."""
        tokens, q = self.decode(hidden, anchor_ids, target.embed_tokens, target.lm_head_weight, sampler.pick)
        return DraftedBlock(tokens[0], q[0])

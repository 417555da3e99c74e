"""Reference speculative decoding: a target with a KV cache (re-read in full where it has
recurrent layers: `target_state`), a DFlash(2) / Domino draft with a cache of its projected
context, batch size 1. Lossless by construction; tested token for token against the target's own decode.

One step, with the last token t at position a (not yet seen by the target):
    draft:  block [t, MASK x K] at positions a..a+K -> proposals d_1..d_K (+ their q)
    target: [t, d_1..d_K] at positions a..a+K       -> p_0..p_K (+ features)
    accept d_i while u < p_{i-1}(d_i) / q_i(d_i); on the first rejection draw from
    norm(max(0, p - q)); if all pass, draw the bonus from p_K. Greedy is the same rule
    with one-hot p and q, i.e. the longest agreeing prefix plus the target's next token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from blockdraft.models.dflash2 import DFlash2DraftModel
from blockdraft.models.domino import DominoDraftModel
from blockdraft.models.layers import single_block_mask
from blockdraft.models.target import TargetModel
from blockdraft.serve.sampling import SamplingParams, draw, probabilities
from blockdraft.serve.target_state import TargetState


@dataclass
class DecodeStats:
    num_speculative_tokens: int
    accepted_per_step: List[int] = field(default_factory=list)

    @property
    def num_drafts(self) -> int:
        return len(self.accepted_per_step)

    @property
    def num_accepted(self) -> int:
        return sum(self.accepted_per_step)

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts, as vLLM reports it."""
        return 1.0 + self.num_accepted / max(1, self.num_drafts)

    def accepted_per_position(self) -> List[int]:
        """How many steps accepted slot i (1-based i = index + 1)."""
        return [sum(1 for m in self.accepted_per_step if m > i) for i in range(self.num_speculative_tokens)]


@dataclass
class DecodeResult:
    tokens: List[int]
    stats: Optional[DecodeStats] = None


class DraftContext:
    """Per-layer keys/values of the draft's context, grown as the target accepts tokens."""

    def __init__(self, draft):
        self.draft = draft
        self.kv = None
        self.positions = None

    def extend(self, features: torch.Tensor, positions: torch.Tensor) -> None:
        new = self.draft.context_kv(features, positions)
        if self.kv is None:
            self.kv, self.positions = new, positions
            return
        self.kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(self.kv, new)]
        self.positions = torch.cat([self.positions, positions], 1)


class SpeculativeEngine:
    def __init__(self, target: TargetModel, draft, num_speculative_tokens: Optional[int] = None, eos_token_ids: Sequence[int] = ()):
        self.target = target
        self.draft = draft.eval()
        self.k = num_speculative_tokens or draft.config.block_size - 1
        self.eos = set(eos_token_ids)
        self.mask_id = draft.config.mask_token_id

    # --- the target alone -----------------------------------------------------------
    @torch.no_grad()
    def target_generate(self, prompt: Sequence[int], max_new_tokens: int, params=SamplingParams(), seed: int = 0) -> DecodeResult:
        gen = torch.Generator().manual_seed(seed)
        state = TargetState(self.target)
        ids = torch.tensor([list(prompt)])
        pos = torch.arange(ids.shape[1])[None]
        out: List[int] = []
        while len(out) < max_new_tokens:
            logits, _ = state.run(ids, pos)
            state.keep(int(pos[0, -1]) + 1)
            tok = int(draw(probabilities(logits[0, -1], params), gen))
            out.append(tok)
            if tok in self.eos:
                break
            ids, pos = torch.tensor([[tok]]), pos[:, -1:] + 1
        return DecodeResult(out)

    # --- speculative ----------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt: Sequence[int], max_new_tokens: int, params=SamplingParams(), seed: int = 0) -> DecodeResult:
        gen = torch.Generator().manual_seed(seed)
        state = TargetState(self.target)
        ids = torch.tensor([list(prompt)])
        n_prompt = ids.shape[1]
        logits, feats = state.run(ids, torch.arange(n_prompt)[None])
        state.keep(n_prompt)
        ctx = DraftContext(self.draft)
        ctx.extend(feats, torch.arange(n_prompt)[None])
        out = [int(draw(probabilities(logits[0, -1], params), gen))]
        stats = DecodeStats(self.k)
        while len(out) < max_new_tokens and out[-1] not in self.eos:
            anchor_pos = n_prompt + len(out) - 1
            proposals, q = self._propose(ctx, out[-1], anchor_pos, params, gen)  # [K], [K, V]
            block = torch.tensor([[out[-1], *proposals.tolist()]])
            positions = torch.arange(anchor_pos, anchor_pos + self.k + 1)[None]
            logits, feats = state.run(block, positions)
            p = probabilities(logits[0], params)  # [K+1, V]
            accepted, next_token = self._verify(proposals, q, p, gen)
            state.keep(anchor_pos + accepted + 1)  # the anchor and the accepted drafts stay
            ctx.extend(feats[:, : accepted + 1], positions[:, : accepted + 1])
            appended = [*proposals[:accepted].tolist(), next_token]
            # An accepted end-of-sequence ends the request there, as in vLLM: nothing after it
            # (drafts or the bonus token) is generated or counted as accepted.
            stop = next((i for i, tok in enumerate(appended) if tok in self.eos), None)
            if stop is not None:
                appended, accepted = appended[: stop + 1], min(accepted, stop + 1)
            stats.accepted_per_step.append(accepted)
            out.extend(appended)
        return DecodeResult(_truncate(out, max_new_tokens, self.eos), stats)

    def _propose(self, ctx: DraftContext, anchor: int, anchor_pos: int, params, gen):
        block_ids = torch.tensor([[anchor] + [self.mask_id] * self.k])
        positions = torch.arange(anchor_pos, anchor_pos + self.k + 1)[None]
        embeds = self.draft.embed(block_ids, self.target.embed_tokens)
        key_pos = torch.cat([ctx.positions, positions], 1)
        mask = single_block_mask(positions, key_pos, self.draft.config.sliding_window, self.draft.config.is_causal)
        hidden = self.draft(embeds, positions, ctx.kv, mask)[:, 1:]  # [1, K, H]
        if isinstance(self.draft, DominoDraftModel):
            # Serial: each slot is corrected with the tokens drafted before it, and q_i is what d_i was
            # drawn from given them, as verification's p_i is given the same tokens.
            def pick(slot_logits):
                slot_q = probabilities(slot_logits, params)
                return draw(slot_q, gen), slot_q

            tokens, q = self.draft.decode(
                hidden, torch.tensor([anchor]), self.target.embed_tokens, self.target.lm_head_weight, pick
            )
            return tokens[0], q[0]
        logits = self.draft.logits(hidden, self.target.lm_head_weight)  # [1, K, V]
        if isinstance(self.draft, DFlash2DraftModel):
            tokens, q = self.draft.candidate_selector.walk(
                hidden, logits, torch.tensor([anchor]), self.draft.config.selector_top_k, params.temperature, gen
            )
            return tokens[0], q[0]
        q = probabilities(logits[0], params)  # [K, V]
        return draw(q, gen), q

    @staticmethod
    def _verify(proposals: torch.Tensor, q: torch.Tensor, p: torch.Tensor, gen) -> tuple:
        """-> (number of accepted drafts, the token the target adds after them)."""
        for i, tok in enumerate(proposals.tolist()):
            ratio = p[i, tok] / q[i, tok].clamp_min(1e-20)
            if torch.rand((), generator=gen) < ratio:
                continue
            residual = (p[i] - q[i]).clamp_min(0)
            residual = residual if residual.sum() > 0 else p[i]
            return i, int(draw(residual / residual.sum(), gen))
        return len(proposals), int(draw(p[-1], gen))


def _truncate(tokens: List[int], max_new_tokens: int, eos: set) -> List[int]:
    tokens = tokens[:max_new_tokens]
    for i, tok in enumerate(tokens):
        if tok in eos:
            return tokens[: i + 1]
    return tokens

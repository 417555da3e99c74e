"""Reference speculative decoding: a target with a KV cache (re-read in full where it has
recurrent layers: `target_state`), a draft of any kind with a cache of its projected context, batch
size 1. Lossless by construction; tested token for token against the target's own decode. The draft
turns its slots' states into tokens itself (`draft_block`: independent draws, a selector's or a
lattice's walk, a serial correction), with the engine's sampling passed in.

One step, with the last token t at position a (not yet seen by the target):
    draft:  block [t, MASK x K] at positions a..a+K -> proposals d_1..d_K (+ their q)
            (DSpark with sample_from_anchor: [t, MASK x (K-1)] at a..a+K-1, every slot predicting
            the token after it, as vLLM's DSpark speculator feeds it)
    target: [t, d_1..d_K] at positions a..a+K       -> p_0..p_K (+ features)
    accept d_i while u < p_{i-1}(d_i) / q_i(d_i); on the first rejection draw from
    norm(max(0, p - q)); if all pass, draw the bonus from p_K. Greedy is the same rule
    with one-hot p and q, i.e. the longest agreeing prefix plus the target's next token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from blockdraft.engine.sampling import SamplingParams, draw, probabilities
from blockdraft.engine.target_state import TargetState
from blockdraft.kinds.dflash.decode import DraftedBlock, Sampler
from blockdraft.models.layers import per_layer_masks, single_block_mask
from blockdraft.models.target import TargetModel


@dataclass
class PositionCalibration:
    """Slot `position` (1-based) over the rounds that reached it (every earlier slot accepted)."""

    position: int
    reached: int
    accepted: int
    confidence_sum: float

    @property
    def mean_confidence(self) -> Optional[float]:
        """The confidence head's mean prediction over the rounds that reached the slot."""
        return self.confidence_sum / self.reached if self.reached else None

    @property
    def acceptance_rate(self) -> Optional[float]:
        """The realised P(accepted at i | reached i): what the confidence head predicts."""
        return self.accepted / self.reached if self.reached else None


@dataclass
class DecodeStats:
    num_speculative_tokens: int
    accepted_per_step: List[int] = field(default_factory=list)
    confidence: List[List[float]] = field(default_factory=list)
    """Drafts with a confidence head (DSpark): per step, each drafted slot's predicted acceptance,
    aligned with `accepted_per_step`. A step that an accepted end-of-sequence draft ends keeps the
    slots up to it only (the later ones decide nothing)."""

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

    def add(self, other: "DecodeStats") -> None:
        """Another request's steps after these (their confidence records too, so calibration spans both)."""
        self.accepted_per_step += other.accepted_per_step
        self.confidence += other.confidence

    def calibration(self) -> List[PositionCalibration]:
        """Per drafted position i = 1..K: the steps that reached it, how many of them accepted it, and
        the confidence predicted for it in them (vLLM's meaning: the head predicts each slot's
        acceptance given that the slots before it were accepted). Empty without a confidence head."""
        if not self.confidence:
            return []
        if len(self.confidence) != len(self.accepted_per_step):
            raise ValueError(f"{len(self.confidence)} confidence records for {len(self.accepted_per_step)} steps")
        out = [PositionCalibration(i + 1, 0, 0, 0.0) for i in range(self.num_speculative_tokens)]
        for accepted, slots in zip(self.accepted_per_step, self.confidence):
            for i, conf in enumerate(slots[: accepted + 1]):  # slot i+1 is reached when slots 1..i were accepted
                out[i].reached += 1
                out[i].accepted += int(accepted > i)
                out[i].confidence_sum += conf
        return out


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
        self.last_features = None

    def extend(self, features: torch.Tensor, positions: torch.Tensor) -> None:
        new = self.draft.context_kv(features, positions)
        # The features of the last context position, before the anchor: a draft may read them (LiLiCorr's anchor state).
        self.last_features = features[:, -1]
        if self.kv is None:
            self.kv, self.positions = new, positions
            return
        self.kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(self.kv, new)]
        self.positions = torch.cat([self.positions, positions], 1)


class SpeculativeEngine:
    def __init__(self, target: TargetModel, draft, num_speculative_tokens: Optional[int] = None, eos_token_ids: Sequence[int] = ()):
        self.target = target
        self.draft = draft.eval()
        # block_size - 1 for a fill-in block [anchor, MASK x K]; block_size for DSpark's anchor-first one.
        self.k = num_speculative_tokens or draft.config.num_speculative_tokens
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
            proposals, q, confidence = self._propose(ctx, out[-1], anchor_pos, params, gen)  # [K], [K, V], [K] or None
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
            if confidence is not None:
                decided = stop + 1 if stop is not None and stop < accepted else self.k
                stats.confidence.append(confidence[:decided].tolist())
            if stop is not None:
                appended, accepted = appended[: stop + 1], min(accepted, stop + 1)
            stats.accepted_per_step.append(accepted)
            out.extend(appended)
        return DecodeResult(_truncate(out, max_new_tokens, self.eos), stats)

    def _propose(self, ctx: DraftContext, anchor: int, anchor_pos: int, params, gen) -> DraftedBlock:
        """-> proposals [K], the distribution each was drawn from [K, V], and the confidence head's
        prediction for each [K] (None without one)."""
        anchor_first = self.draft.config.anchor_predicts
        n_slots = self.k if anchor_first else self.k + 1
        block_ids = torch.tensor([[anchor] + [self.mask_id] * (n_slots - 1)])
        positions = torch.arange(anchor_pos, anchor_pos + n_slots)[None]
        embeds = self.draft.embed(block_ids, self.target.embed_tokens)
        key_pos = torch.cat([ctx.positions, positions], 1)
        mask = per_layer_masks(
            self.draft.config.layer_attention(), lambda window, causal: single_block_mask(positions, key_pos, window, causal)
        )
        hidden = self.draft(embeds, positions, ctx.kv, mask)
        hidden = hidden if anchor_first else hidden[:, 1:]  # [1, K, H]: the predicting slots

        def pick(slot_logits):
            slot_q = probabilities(slot_logits, params)
            return draw(slot_q, gen), slot_q

        sampler = Sampler(pick, 0.0 if params.greedy else params.temperature, gen)
        return self.draft.draft_block(hidden, torch.tensor([anchor]), self.target, sampler, ctx.last_features)

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

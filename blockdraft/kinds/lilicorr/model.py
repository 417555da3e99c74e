"""LiLiCorr: the DFlash backbone (with DFlash2's in-block convolutions when both conv keys are set)
plus a candidate-lattice correlator that scores paths through each drafted slot's top-k.

The head is vLLM 0.32's `LiLiCorrHead` (model_executor/models/lilicorr.py) with the same parameter
names and shapes, so an export loads as it is. Its scores are computed here as vLLM's `forward`
computes them, from the unfused weights (vLLM's `materialize_inference_buffers` only splits and
stacks the same matrices):

    x[s, j]  = token_proj(embed(cand[s, j])) + pass_hidden_proj(h[s]) + feature_mlp(LN(feat[s, j]))
               + slot_embedding[s] + rank_embedding[j]
    x        = layers(x) over the flattened lattice, with a learned per-head slot-distance bias
    f        = silu(factor_input_proj([x, a, x * a])),  a = anchor_norm(context_proj(anchor))
    start[j]        = <normalize(anchor_out_head(a)), normalize(in_head(f[0, j]))>
    pair[s, i, j]   = <normalize(out_head(f[s, i])), normalize(in_head(f[s+1, j]))>
    scores          = logit_scale * [start broadcast over predecessors, pair]   # [N, S, k, k]

scores[:, s, i, j] is the logit of candidate j at slot s after candidate i at slot s - 1; slot 0's
rows are all the anchor's start scores, so the walk begins at predecessor index 0, as vLLM's does.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from blockdraft.kinds.dflash.decode import DraftedBlock, Sampler
from blockdraft.kinds.dflash.loss import BlockLoss, KindLoss, SupervisedSlots
from blockdraft.kinds.dflash.model import DFlashDecoderLayer, DFlashDraftModel
from blockdraft.kinds.dflash2.model import DFlash2DecoderLayer
from blockdraft.kinds.lilicorr.decode import walk
from blockdraft.kinds.lilicorr.loss import lattice_path_loss
from blockdraft.models.draft_config import DraftModelConfig

# The per-candidate features vLLM computes from the backbone's top-k log-probs.
NUM_CANDIDATE_FEATURES = 5


class LatticeMLP(nn.Module):
    """vLLM's NemotronHMLP with bias and silu: down(silu(up(x))), not gated."""

    def __init__(self, in_size: int, hidden: int, out_size: int):
        super().__init__()
        self.up_proj = nn.Linear(in_size, hidden)
        self.down_proj = nn.Linear(hidden, out_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.up_proj(x)))


class LatticeAttention(nn.Module):
    """Full attention over the lattice with an additive per-head bias (no mask, no cache)."""

    def __init__(self, hidden: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * hidden, hidden))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * hidden))
        nn.init.xavier_uniform_(self.in_proj_weight)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        n, t, h = x.shape
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (y.view(n, t, self.num_heads, h // self.num_heads).transpose(1, 2) for y in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.out_proj(out.transpose(1, 2).reshape(n, t, h))


class LatticeLayer(nn.Module):
    def __init__(self, hidden: int, num_heads: int, mlp_ratio: float, eps: float):
        super().__init__()
        self.attn_norm = nn.RMSNorm(hidden, eps=eps)
        self.attn = LatticeAttention(hidden, num_heads)
        self.mlp_norm = nn.RMSNorm(hidden, eps=eps)
        self.mlp = LatticeMLP(hidden, int(hidden * mlp_ratio), hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), bias)
        return x + self.mlp(self.mlp_norm(x))


class LiLiCorrHead(nn.Module):
    """vLLM's LiLiCorrHead, trainable. Parameter names and shapes are vLLM's (under `lilicorr.`)."""

    def __init__(self, cfg: DraftModelConfig):
        super().__init__()
        model_hidden, hidden = cfg.hidden_size, cfg.lilicorr_width
        slots, k, heads = cfg.block_size - 1, cfg.lilicorr_candidate_topk, cfg.lilicorr_num_heads
        self.block_size, self.topk, self.hidden = cfg.block_size, k, hidden
        self.vector_eps, self.logit_scale = cfg.lilicorr_vector_eps, cfg.lilicorr_logit_scale
        # vLLM builds token_proj only when the widths differ (nn.Identity otherwise: no weights).
        self.token_proj = nn.Linear(model_hidden, hidden) if model_hidden != hidden else nn.Identity()
        self.pass_hidden_proj = nn.Linear(model_hidden, hidden)
        self.feature_norm = nn.LayerNorm(NUM_CANDIDATE_FEATURES)
        self.feature_mlp = LatticeMLP(NUM_CANDIDATE_FEATURES, hidden, hidden)
        self.slot_embedding = nn.Parameter(torch.zeros(1, 1, slots, 1, hidden))
        self.rank_embedding = nn.Parameter(torch.zeros(1, 1, 1, k, hidden))
        self.relative_slot_bias = nn.Parameter(torch.zeros(heads, 2 * cfg.block_size - 1))
        self.same_slot_bias = nn.Parameter(torch.zeros(heads))
        self.context_proj = nn.Linear(model_hidden, hidden)
        eps = cfg.rms_norm_eps
        self.layers = nn.ModuleList(
            LatticeLayer(hidden, heads, cfg.lilicorr_mlp_ratio, eps) for _ in range(cfg.lilicorr_num_layers)
        )
        self.output_norm = nn.RMSNorm(hidden, eps=eps)
        self.anchor_norm = nn.RMSNorm(hidden, eps=eps)
        self.factor_input_proj = nn.Linear(3 * hidden, hidden)
        self.out_head = nn.Linear(hidden, cfg.lilicorr_factor_dim)
        self.in_head = nn.Linear(hidden, cfg.lilicorr_factor_dim)
        self.anchor_out_head = nn.Linear(hidden, cfg.lilicorr_factor_dim)

    def attention_bias(self, n_slots: int) -> torch.Tensor:
        """[heads, S*k, S*k]: relative_slot_bias[slot(q) - slot(k) + block_size - 1] + same_slot_bias."""
        slot = torch.arange(n_slots, device=self.same_slot_bias.device).repeat_interleave(self.topk)
        rel = slot[:, None] - slot[None, :]
        bias = self.relative_slot_bias[:, rel + self.block_size - 1]
        return bias + (rel == 0).to(bias.dtype)[None] * self.same_slot_bias[:, None, None]

    def candidate_features(self, log_probs: torch.Tensor) -> torch.Tensor:
        """[N, S, k] top-k log-probs (descending) -> [N, S, k, 5] as vLLM computes them."""
        k = self.topk
        rank_frac = torch.arange(k, device=log_probs.device, dtype=torch.float32) / float(max(k - 1, 1))
        is_top1 = torch.zeros(k, device=log_probs.device)
        is_top1[0] = 1.0
        lp = log_probs.float()
        return torch.stack(
            [lp, lp.exp(), lp - lp.max(dim=-1, keepdim=True).values, rank_frac.expand_as(lp), is_top1.expand_as(lp)],
            dim=-1,
        )

    def lattice_states(self, token_embeddings, log_probs, pass_hidden) -> torch.Tensor:
        """-> [N, S, k, hidden]: the candidates after the lattice transformer and output_norm."""
        n, s, k = log_probs.shape
        x = self.token_proj(token_embeddings) + self.pass_hidden_proj(pass_hidden).unsqueeze(-2)
        x = x + self.feature_mlp(self.feature_norm(self.candidate_features(log_probs).to(x.dtype)))
        x = x + self.slot_embedding[:, 0, :s] + self.rank_embedding[:, 0]
        x = x.reshape(n, s * k, self.hidden)
        bias = self.attention_bias(s).to(x.dtype)[None]
        for layer in self.layers:
            x = layer(x, bias)
        return self.output_norm(x).reshape(n, s, k, self.hidden)

    def forward(
        self,
        token_embeddings: torch.Tensor,
        candidate_log_probs: torch.Tensor,
        pass_hidden: torch.Tensor,
        anchor_hidden: torch.Tensor,
        anchor_valid: torch.Tensor,
    ) -> torch.Tensor:
        """token_embeddings [N, S, k, H] (the target's rows of the candidates), candidate_log_probs
        [N, S, k], pass_hidden [N, S, H] (the draft's normed slot states), anchor_hidden [N, H] (the
        normed context state before the anchor), anchor_valid [N] -> scores [N, S, k, k]."""
        x = self.lattice_states(token_embeddings, candidate_log_probs, pass_hidden)
        anchor = self.context_proj(anchor_hidden) * anchor_valid[:, None].to(x.dtype)
        anchor = self.anchor_norm(anchor)
        a = anchor[:, None, None, :].expand_as(x)
        factor = F.silu(self.factor_input_proj(torch.cat([x, a, x * a], dim=-1)))
        out_vec = F.normalize(self.out_head(factor), dim=-1, eps=self.vector_eps)
        in_vec = F.normalize(self.in_head(factor), dim=-1, eps=self.vector_eps)
        anchor_out = F.normalize(self.anchor_out_head(anchor), dim=-1, eps=self.vector_eps)
        start = (anchor_out[:, None, :] * in_vec[:, 0]).sum(-1)  # [N, k]
        pairs = torch.matmul(out_vec[:, :-1], in_vec[:, 1:].transpose(-1, -2))  # [N, S-1, k, k]
        first = start[:, None, None, :].expand(-1, 1, self.topk, -1)
        return self.logit_scale * torch.cat((first.float(), pairs.float()), dim=1)


class LiLiCorrDraftModel(DFlashDraftModel):
    """The DFlash backbone (DFlash2's layers when the convolution is on) plus `lilicorr`."""

    def __init__(self, cfg: DraftModelConfig):
        # Per draft, before the backbone builds its layers: vLLM swaps in DFlash2's layers when conv is set.
        self.layer_class = DFlash2DecoderLayer if cfg.conv_kernel_size else DFlashDecoderLayer
        super().__init__(cfg)
        if cfg.conv_kernel_size:
            # super().__init__ re-inits every Linear; restore the identity of the fresh conv (as DFlash2).
            for layer in self.layers:
                layer.attention_conv._zero_projection()
                layer.mlp_conv._zero_projection()
        self.lilicorr = LiLiCorrHead(cfg)

    def candidates(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """hidden [..., H] -> (top-k log-probs [..., k], ids [..., k]) of the full head, as vLLM's
        compute_candidates (log_softmax, then top-k)."""
        log_probs = torch.log_softmax(self.logits(hidden, lm_head_weight).float(), dim=-1)
        return log_probs.topk(self.config.lilicorr_candidate_topk, dim=-1)

    def lattice_scores(
        self,
        hidden: torch.Tensor,
        lm_head_weight: torch.Tensor,
        embed_tokens: nn.Module,
        anchor_hidden: torch.Tensor,
        anchor_valid: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """hidden [N, S, H] of the drafted slots -> (candidate ids [N, S, k], scores [N, S, k, k])."""
        log_probs, ids = self.candidates(hidden, lm_head_weight)
        if anchor_valid is None:
            anchor_valid = torch.ones(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        scores = self.lilicorr(embed_tokens(ids).to(hidden.dtype), log_probs, hidden, anchor_hidden, anchor_valid)
        return ids, scores

    # --- the stages' hooks ---------------------------------------------------------------
    def kind_losses(self, slots: SupervisedSlots, block: BlockLoss) -> KindLoss:
        return lattice_path_loss(self, slots, block)

    def draft_block(
        self, hidden: torch.Tensor, anchor_ids: torch.Tensor, target, sampler: Sampler, last_features: torch.Tensor
    ) -> DraftedBlock:
        """The head scores the lattice of each slot's top-k, and the walk picks one path through it (vLLM's
        LiLiCorr speculator); q_i is the walk's distribution over slot i's candidates given the candidate
        picked before it, as vLLM caches it for rejection."""
        anchor_hidden = self.project_context(last_features)  # [1, H]: the state before the anchor
        ids, scores = self.lattice_scores(hidden, target.lm_head_weight, target.embed_tokens, anchor_hidden)
        tokens, p = walk(scores, ids, sampler.temperature, sampler.generator)
        q = torch.zeros(hidden.shape[1], self.config.vocab_size).scatter_(-1, ids[0], p[0])
        return DraftedBlock(tokens[0], q)

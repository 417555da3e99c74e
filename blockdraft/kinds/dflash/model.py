"""DFlash draft: one non-causal pass over a block [anchor, MASK, ...] conditioned on target features.

Reads top to bottom as the computation in the vLLM contract:
    c = hidden_norm(fc(concat(target features)))               # [N, Tc, H]
    per layer: context K/V = rope(k_norm(k_proj(c))), v_proj(c)  (no input_layernorm on c)
    h = embed_target(block); pre-norm Qwen3 layers whose queries come from the block only
    out = norm(h); logits = lm_head_target(out)
The draft owns no embedding and no head: callers pass the target's.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from blockdraft.kinds.dflash.decode import DraftedBlock, Sampler
from blockdraft.kinds.dflash.loss import BlockLoss, KindLoss, LossHead, SupervisedSlots
from blockdraft.models.draft_config import DraftModelConfig
from blockdraft.models.layers import MLP, BlockAttention, RMSNorm, RotaryEmbedding, per_layer_masks, single_block_mask

KV = Tuple[torch.Tensor, torch.Tensor]


class DFlashDecoderLayer(nn.Module):
    def __init__(self, cfg: DraftModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = BlockAttention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, cos, sin, ctx_kv: KV, attn_mask, block_len: int) -> torch.Tensor:
        h = h + self.attention_sublayer(self.input_layernorm(h), cos, sin, ctx_kv, attn_mask, block_len)
        return h + self.mlp_sublayer(self.post_attention_layernorm(h), block_len)

    # DFlash2 wraps these two with its in-block convolutions.
    def attention_sublayer(self, x, cos, sin, ctx_kv: KV, attn_mask, block_len: int) -> torch.Tensor:
        return self.self_attn(x, cos, sin, ctx_kv, attn_mask)

    def mlp_sublayer(self, x, block_len: int) -> torch.Tensor:
        return self.mlp(x)


class DFlashDraftModel(nn.Module):
    layer_class = DFlashDecoderLayer

    def __init__(self, cfg: DraftModelConfig):
        super().__init__()
        self.config = cfg
        n_feat = len(cfg.target_layer_ids) * cfg.target_hidden_size
        self.fc = nn.Linear(n_feat, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(self.layer_class(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.draft_vocab_size:
            # A reduced vocabulary: the draft's own head, the target's rows for the chosen tokens
            # (frozen, set by `set_draft_vocab`), and d2t, the offset vLLM reads: draft id i is
            # target id i + d2t[i].
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False).requires_grad_(False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        if cfg.train_mask_embedding:
            # vLLM embeds every MASK slot with this vector instead of the target's row for the mask
            # token (mask_embedding.pt in the export); set by `init_mask_embedding`, then trained.
            self.mask_embedding = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.activation_checkpointing = False  # set by the trainer: recompute layers in backward
        self.apply(self._init_linear)

    @staticmethod
    def _init_linear(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)

    # --- context path -------------------------------------------------------------
    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """features [N, Tc, n*Ht] (target layers concatenated ascending) -> c [N, Tc, H]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, features: torch.Tensor, position_ids: torch.Tensor) -> List[KV]:
        """Per-layer keys/values of the context; computed once and reused by every block."""
        c = self.project_context(features)
        cos, sin = self.rotary(position_ids, c.dtype)
        return [layer.self_attn.key_value(c, cos, sin) for layer in self.layers]

    # --- block path ---------------------------------------------------------------
    def embed(self, block_ids: torch.Tensor, embed_tokens: nn.Module) -> torch.Tensor:
        return self.replace_mask(block_ids, embed_tokens(block_ids))

    def replace_mask(self, block_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """embeds [N, T, H] with every mask-token slot set to the trained mask embedding, if any."""
        if not self.config.train_mask_embedding:
            return embeds
        is_mask = (block_ids == self.config.mask_token_id).unsqueeze(-1)  # [N, T, 1]
        return torch.where(is_mask, self.mask_embedding.to(embeds.dtype), embeds)

    @torch.no_grad()
    def init_mask_embedding(self, embed_weight: torch.Tensor, mode: str) -> None:
        """From the target's row for the mask token (`token`) or the mean of its embedding table (`mean`)."""
        row = embed_weight[self.config.mask_token_id] if mode == "token" else embed_weight.float().mean(0)
        self.mask_embedding.copy_(row.to(self.mask_embedding))

    def forward(
        self,
        block_embeds: torch.Tensor,
        block_position_ids: torch.Tensor,
        ctx_kv: List[KV],
        attn_mask=None,
        block_len: Optional[int] = None,
    ) -> torch.Tensor:
        """block_embeds [N, Tq, H] (Tq = blocks * block_len) -> normed hidden [N, Tq, H].

        attn_mask: bool [N, 1, Tq, Tc+Tq] (True = attend), a flex BlockMask, a list of either (one
        per layer: `per_layer_masks` over `config.layer_attention()`), or None for one block over its
        whole context with each layer's own window and causality.
        """
        block_len = block_len or block_embeds.shape[1]
        if attn_mask is None:
            # The whole context precedes the block: index order is position order.
            context_len, device = ctx_kv[0][0].shape[2], block_embeds.device
            key_order = torch.arange(context_len + block_embeds.shape[1], device=device)[None]
            attn_mask = per_layer_masks(
                self.config.layer_attention(),
                lambda window, causal: single_block_mask(key_order[:, context_len:], key_order, window, causal),
            )
        masks = attn_mask if isinstance(attn_mask, list) else [attn_mask] * len(self.layers)
        cos, sin = self.rotary(block_position_ids, block_embeds.dtype)
        h = block_embeds
        for layer, kv, attn_mask in zip(self.layers, ctx_kv, masks):
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                h = checkpoint(layer, h, cos, sin, kv, attn_mask, block_len, use_reentrant=False)
            else:
                h = layer(h, cos, sin, kv, attn_mask, block_len)
        return self.norm(h)

    # --- heads --------------------------------------------------------------------
    @property
    def reduced_vocab(self) -> bool:
        return bool(self.config.draft_vocab_size)

    def head_weight(self, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """[V_draft, H]: the draft's own head when its vocabulary is reduced, else the target's."""
        return self.lm_head.weight if self.reduced_vocab else lm_head_weight

    def draft_logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """[..., V_draft] over the draft's own vocabulary (what training's loss is computed over)."""
        return self.transform_logits(F.linear(hidden, self.head_weight(lm_head_weight)))

    def logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """[..., V] over the target's vocabulary, as vLLM computes them: the head, the target's own
        logit transform (identity for Qwen3), and for a reduced vocabulary the draft's logits
        scattered into a row of -inf."""
        logits = self.draft_logits(hidden, lm_head_weight)
        if not self.reduced_vocab:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., self.draft_token_ids()] = logits
        return full

    def draft_token_ids(self) -> torch.Tensor:
        """[V_draft] target id of each draft id."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.draft_token_ids()[draft_ids] if self.reduced_vocab else draft_ids

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids, -1 for a token outside a reduced vocabulary."""
        if not self.reduced_vocab:
            return target_ids
        t2d = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
        t2d[self.draft_token_ids()] = torch.arange(len(self.d2t), device=self.d2t.device)
        return t2d[target_ids]

    @torch.no_grad()
    def set_draft_vocab(self, token_ids: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Take the target's head rows of `token_ids` (sorted, unique) as this draft's vocabulary."""
        ids = token_ids.to(self.d2t.device, torch.long)
        self.lm_head.weight.copy_(lm_head_weight[ids].to(self.lm_head.weight))
        self.d2t.copy_(ids - torch.arange(len(ids), device=ids.device))

    def transform_logits(self, logits: torch.Tensor) -> torch.Tensor:
        # Scale first, then softcap, as vLLM's DFlash2 candidate path does.
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # --- the stages' hooks: a kind changes its loss or its drafting by overriding these --
    def loss_head(self, slots: SupervisedSlots) -> LossHead:
        """The rows and head train_step's block loss runs on: the slots' states and the draft's head."""
        return LossHead(slots.hidden, slots.head)

    def kind_losses(self, slots: SupervisedSlots, block: BlockLoss) -> KindLoss:
        """The kind's own losses on top of the block loss, and what its metrics score: none here."""
        return KindLoss()

    def draft_block(
        self, hidden: torch.Tensor, anchor_ids: torch.Tensor, target, sampler: Sampler, last_features: torch.Tensor
    ) -> DraftedBlock:
        """One round of the reference engine (batch 1): hidden [1, K, H] the predicting slots' states,
        anchor_ids [1] the last accepted token, target its `embed_tokens` and `lm_head_weight`, last_features
        [1, n*H_t] the target's features at the position before the anchor. Every slot drawn independently."""
        logits = self.logits(hidden, target.lm_head_weight)  # [1, K, V]
        tokens, q = sampler.pick(logits[0])
        return DraftedBlock(tokens, q)

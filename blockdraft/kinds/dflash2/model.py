"""DFlash2: DFlash plus a two-tap dynamic in-block convolution around every sublayer and a
pairwise candidate selector that walks one coherent path through each slot's top-k.

Only what differs from DFlash is overridden. Fresh modules are exact identities
(conv = base tap 0 of ones, zero projection; zero successor codebook), so a fresh
DFlash2 computes what DFlash computes on shared weights.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from blockdraft.kinds.dflash.decode import DraftedBlock, Sampler
from blockdraft.kinds.dflash.loss import BlockLoss, KindLoss, SupervisedSlots
from blockdraft.kinds.dflash.model import DFlashDecoderLayer, DFlashDraftModel
from blockdraft.kinds.dflash2.loss import selector_loss
from blockdraft.models.draft_config import DraftModelConfig


class DynamicBlockConv(nn.Module):
    """out[t,c] = sum_{s<taps} (base[s,c] + coef[t,s,group(c)]) * x[t-s,c], inside a block.

    Two kernels per sublayer: index 0 before it, index 1 after it. Channels are grouped
    `conv_group_size` at a time for the dynamic part; taps reaching before the start
    of the block are dropped.
    """

    def __init__(self, hidden_size: int, taps: int, group_size: int):
        super().__init__()
        self.taps = taps
        self.group_size = group_size
        self.num_groups = hidden_size // group_size
        base = torch.zeros(2, taps, hidden_size)
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * taps * self.num_groups, bias=False)
        self._zero_projection()

    def _zero_projection(self) -> None:
        nn.init.zeros_(self.kernel_projection.weight)

    def coefficients(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, T, H] (the normed sublayer input) -> coef [N, T, 2, taps, G]."""
        n, t, _ = x.shape
        return self.kernel_projection(x).view(n, t, 2, self.taps, self.num_groups)

    def forward(self, x: torch.Tensor, coef: torch.Tensor, which: int, block_len: int) -> torch.Tensor:
        n, t, h = x.shape
        blocks = x.view(n, t // block_len, block_len, h)  # [N, nb, L, H]
        out = torch.zeros_like(blocks)
        for s in range(min(self.taps, block_len)):
            dyn = coef[:, :, which, s].repeat_interleave(self.group_size, dim=-1)  # [N, T, H]
            kernel = (self.base_kernel[which, s] + dyn).view(n, t // block_len, block_len, h)
            # x[t-s] within the block; positions with in-block index < s get nothing.
            shifted = torch.zeros_like(blocks)
            shifted[:, :, s:] = blocks[:, :, : block_len - s]
            out = out + kernel * shifted
        return out.view(n, t, h)


class DFlash2DecoderLayer(DFlashDecoderLayer):
    def __init__(self, cfg: DraftModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.attention_conv = DynamicBlockConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
        self.mlp_conv = DynamicBlockConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    def attention_sublayer(self, x, cos, sin, ctx_kv, attn_mask, block_len: int) -> torch.Tensor:
        coef = self.attention_conv.coefficients(x)
        x = self.attention_conv(x, coef, 0, block_len)
        x = super().attention_sublayer(x, cos, sin, ctx_kv, attn_mask, block_len)
        return self.attention_conv(x, coef, 1, block_len)

    def mlp_sublayer(self, x, block_len: int) -> torch.Tensor:
        coef = self.mlp_conv.coefficients(x)
        x = self.mlp_conv(x, coef, 0, block_len)
        x = super().mlp_sublayer(x, block_len)
        return self.mlp_conv(x, coef, 1, block_len)


class CandidateSelector(nn.Module):
    """S[l, a, b] = logit[l, b] + <A[pred_a] * (W_h h_l), B[cand_b]> over each slot's top-k."""

    def __init__(self, vocab_size: int, hidden_size: int, rank: int):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.randn(vocab_size, rank) * 0.02)
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        nn.init.normal_(self.hidden_projection.weight, std=0.02)

    def score(self, hidden, predecessor_ids, candidate_ids, candidate_logits) -> torch.Tensor:
        """hidden [..., H], predecessor_ids [...], candidate_ids/logits [..., k] -> scores [..., k]."""
        vocab = self.predecessor_codebook.shape[0]
        # Clamp: an anchor id may come from outside the draft's table (e.g. padded vocab).
        pred = self.predecessor_codebook[predecessor_ids.clamp(0, vocab - 1)]  # [..., r]
        query = pred * self.hidden_projection(hidden)  # [..., r]
        succ = self.successor_codebook[candidate_ids]  # [..., k, r]
        return candidate_logits + torch.einsum("...r,...kr->...k", query, succ)

    def walk(
        self,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        anchor_ids: torch.Tensor,
        top_k: int,
        temperature: float = 0.0,
        generator: Optional[torch.Generator] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """hidden [N, K, H], logits [N, K, V] (slots 1..K), anchor_ids [N].

        Returns tokens [N, K] and the distribution each slot's token was drawn from,
        spread over the vocabulary [N, K, V] (one-hot when greedy), for rejection sampling.
        """
        cand_logits, cand_ids = logits.topk(top_k, dim=-1)  # [N, K, k]
        pred = anchor_ids
        tokens, probs = [], []
        for slot in range(logits.shape[1]):
            s = self.score(hidden[:, slot], pred, cand_ids[:, slot], cand_logits[:, slot])  # [N, k]
            if temperature > 0:
                p = torch.softmax(s.float() / temperature, dim=-1)
                pick = torch.multinomial(p, 1, generator=generator).squeeze(-1)
            else:
                pick = s.argmax(-1)
                p = torch.nn.functional.one_hot(pick, top_k).float()
            pred = cand_ids[:, slot].gather(-1, pick[:, None]).squeeze(-1)  # [N]
            full = torch.zeros(logits.shape[0], logits.shape[-1], device=logits.device)
            probs.append(full.scatter_(-1, cand_ids[:, slot], p))
            tokens.append(pred)
        return torch.stack(tokens, 1), torch.stack(probs, 1)


class DFlash2DraftModel(DFlashDraftModel):
    layer_class = DFlash2DecoderLayer

    def __init__(self, cfg: DraftModelConfig):
        super().__init__(cfg)
        # super().__init__ re-inits every Linear; restore the identity of the fresh conv.
        for layer in self.layers:
            layer.attention_conv._zero_projection()
            layer.mlp_conv._zero_projection()
        self.candidate_selector = CandidateSelector(cfg.vocab_size, cfg.hidden_size, cfg.selector_rank)

    def embed(self, block_ids: torch.Tensor, embed_tokens: nn.Module) -> torch.Tensor:
        embeds = self.replace_mask(block_ids, embed_tokens(block_ids))  # as vLLM: mask first, then the scale
        scale = self.config.input_embedding_scale
        return embeds * scale if scale != 1.0 else embeds

    def kind_losses(self, slots: SupervisedSlots, block: BlockLoss) -> KindLoss:
        return selector_loss(self, slots, block)

    def draft_block(
        self, hidden: torch.Tensor, anchor_ids: torch.Tensor, target, sampler: Sampler, last_features: torch.Tensor
    ) -> DraftedBlock:
        """The selector walks one path through the slots' top-k, each pick the next slot's predecessor."""
        logits = self.logits(hidden, target.lm_head_weight)  # [1, K, V]
        tokens, q = self.candidate_selector.walk(
            hidden, logits, anchor_ids, self.config.selector_top_k, sampler.temperature, sampler.generator
        )
        return DraftedBlock(tokens[0], q[0])

"""Load an export back and check it computes what the trained module computes.

The export is read through the importer (config.json + safetensors, as vLLM would read
them), then both drafts run one fixed random probe: target features, two blocks of
[anchor, MASK, ...] embedded by a random table, a random head (or the target's). Two
comparisons:
- against the trained module with its weights rounded to the export dtype: must be
  exact up to fp32 noise, so any config or name drift shows however small;
- against the trained module as it is: within a tolerance for the dtype's rounding.
Each kind's own outputs are compared too (KindSpec.probe_outputs): DFlash2's selector scores, LiLiCorr's
lattice scores, Domino's corrected logits, DSpark's Markov-corrected logits and confidence logits, which the
base logits never touch.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch
from torch import nn

from blockdraft import kinds
from blockdraft.draft_format.importer import import_draft
from blockdraft.models.draft_config import DraftModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Allowed |logit difference| against the unrounded module; both bounds scale with max(1, max |logit|).
TOLERANCE = {"float32": 1e-5, "bfloat16": 5e-2, "float16": 1e-2}
# Same weights, same config, both in fp32: anything above this is drift, not rounding.
EXACT = 1e-5


@dataclass
class ReloadResult:
    dtype: str
    max_abs_diff: float
    """Against the trained module, within `tolerance`."""
    tolerance: float
    max_abs_diff_rounded: float
    """Against the trained module with weights rounded to `dtype`; must be ~0."""
    exact_tolerance: float
    differing_keys: List[str] = field(default_factory=list)
    """Tensors that are not the trained ones rounded to `dtype`."""

    @property
    def ok(self) -> bool:
        return (
            not self.differing_keys
            and self.max_abs_diff_rounded <= self.exact_tolerance
            and self.max_abs_diff <= self.tolerance
        )

    def summary(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        text = (
            f"reload check {verdict} ({self.dtype}): max |logit diff| {self.max_abs_diff:.3g} "
            f"(tolerance {self.tolerance:.3g}), against the dtype-rounded module {self.max_abs_diff_rounded:.3g} "
            f"(must be <= {self.exact_tolerance:.3g})"
        )
        if self.differing_keys:
            text += "\n  tensors that differ from the checkpoint: " + ", ".join(self.differing_keys)
        return text


@dataclass
class Probe:
    features: torch.Tensor  # [1, Tc, n*Ht]
    context_positions: torch.Tensor  # [1, Tc]
    block_ids: torch.Tensor  # [1, 2*B]
    block_positions: torch.Tensor  # [1, 2*B]
    embed: nn.Embedding  # [V, H]
    lm_head: torch.Tensor  # [V, H]
    predecessor_ids: torch.Tensor  # [1, 2*B]
    candidate_ids: torch.Tensor  # [1, 2*B, k]
    candidate_logits: torch.Tensor  # [1, 2*B, k]


def make_probe(cfg: DraftModelConfig, lm_head_weight: Optional[torch.Tensor] = None, seed: int = 0, context_len: int = 8) -> Probe:
    g = torch.Generator().manual_seed(seed)
    v, h, b = cfg.vocab_size, cfg.hidden_size, cfg.block_size
    anchors = torch.randint(0, v, (1, 2, 1), generator=g)
    blocks = torch.cat([anchors, torch.full((1, 2, b - 1), cfg.mask_token_id)], dim=-1).view(1, 2 * b)
    k = min(cfg.selector_top_k, v)
    head = lm_head_weight.detach().float().cpu() if lm_head_weight is not None else torch.randn(v, h, generator=g) * h**-0.5
    return Probe(
        features=torch.randn(1, context_len, len(cfg.target_layer_ids) * cfg.target_hidden_size, generator=g),
        context_positions=torch.arange(context_len)[None],
        block_ids=blocks,
        block_positions=torch.arange(context_len, context_len + 2 * b)[None],
        embed=nn.Embedding.from_pretrained(torch.randn(v, h, generator=g)),
        lm_head=head,
        predecessor_ids=torch.randint(0, v, (1, 2 * b), generator=g),
        candidate_ids=torch.randint(0, v, (1, 2 * b, k), generator=g),
        candidate_logits=torch.randn(1, 2 * b, k, generator=g),
    )


@torch.no_grad()
def run_probe(draft: nn.Module, probe: Probe) -> torch.Tensor:
    """Logits [1, 2B, V], with the kind's own outputs (KindSpec.probe_outputs: DFlash2's selector scores
    [1, 2B, k], LiLiCorr's lattice scores [1, 2B, k*k], Domino's corrected logits [1, 2B, V], ...) appended along
    the last dim."""
    cfg = draft.config
    kv = draft.context_kv(probe.features, probe.context_positions)
    hidden = draft(draft.embed(probe.block_ids, probe.embed), probe.block_positions, kv, None, cfg.block_size)
    logits = draft.draft_logits(hidden, probe.lm_head)  # a reduced vocabulary: its own head, no -inf fill
    extra = kinds.get(cfg.kind).probe_outputs(draft, probe, hidden)
    return torch.cat([logits, *extra], dim=-1) if extra else logits


def rounded_copy(draft: nn.Module, dtype: str) -> nn.Module:
    """The trained module as the export should hold it: weights through `dtype` and back to fp32."""
    twin = copy.deepcopy(draft).float().cpu()
    twin.load_state_dict({k: v.to(DTYPES[dtype]).float() if v.is_floating_point() else v for k, v in draft.state_dict().items()})
    return twin


def differing_keys(a: nn.Module, b: nn.Module) -> List[str]:
    sa, sb = a.state_dict(), b.state_dict()
    names = sorted(set(sa) | set(sb))
    return [k for k in names if k not in sa or k not in sb or sa[k].dtype.is_floating_point != sb[k].dtype.is_floating_point
            or not torch.equal(sa[k].float(), sb[k].float())]


def reload_check(export_dir: str | Path, trained: nn.Module, dtype: str, lm_head_weight: Optional[torch.Tensor] = None) -> ReloadResult:
    exported, cfg = import_draft(export_dir)
    trained = copy.deepcopy(getattr(trained, "module", trained)).float().cpu().eval()
    rounded = rounded_copy(trained, dtype).eval()
    probe = make_probe(cfg, lm_head_weight)
    want, want_rounded, got = run_probe(trained, probe), run_probe(rounded, probe), run_probe(exported.eval(), probe)
    scale = max(1.0, want.abs().max().item())
    return ReloadResult(
        dtype=dtype,
        max_abs_diff=(got - want).abs().max().item(),
        tolerance=TOLERANCE[dtype] * scale,
        max_abs_diff_rounded=(got - want_rounded).abs().max().item(),
        exact_tolerance=EXACT * scale,
        differing_keys=differing_keys(exported, rounded),
    )

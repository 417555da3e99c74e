"""The fully resolved shape of a draft: what a model is built from and what export writes.

Every field is concrete (no "same as target" placeholders); `blockdraft.models.resolve`
turns a user's draft settings plus a target's HF config into one of these.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from blockdraft import kinds
from blockdraft.errors import ConfigError
from blockdraft.kinds.dflash2.settings import DFlash2Settings
from blockdraft.kinds.domino.settings import DominoSettings
from blockdraft.kinds.dspark.settings import DSparkSettings
from blockdraft.kinds.lilicorr.settings import LiLiCorrSettings

# transformers' and vLLM's names for a layer's attention (`layer_types`).
SLIDING = "sliding_attention"
LAYER_TYPES = ("full_attention", SLIDING)


@dataclass
class DraftModelConfig(DFlash2Settings, DominoSettings, DSparkSettings, LiLiCorrSettings):
    """Every kind's own settings are inherited from the kind's settings class (blockdraft/kinds/<kind>/settings.py),
    as the user's schema (models/resolve.DraftConfig) inherits them: one default each."""

    kind: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_hidden_size: int
    num_target_layers: int
    target_layer_ids: List[int]
    mask_token_id: int
    block_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    hidden_act: str = "silu"
    sliding_window: Optional[int] = None
    layer_types: Optional[List[str]] = None
    """Per draft layer, "full_attention" or "sliding_attention" as transformers and vLLM read `layer_types`
    (null: every layer sliding when sliding_window is set, else every layer full)."""
    sliding_causal: bool = False
    """The sliding-window layers attend causally inside the block while full layers stay bidirectional:
    speculators' trainer default for DFlash and DSpark (`sliding_window_non_causal: false`), which vLLM 0.32
    reproduces from `layer_types` when neither `is_causal` nor `dflash_config.causal` is set."""
    draft_vocab_size: Optional[int] = None
    """DFlash: the draft's own reduced vocabulary (null = the target's full head)."""
    train_mask_embedding: bool = False
    """The MASK slots' embedding is a trained parameter (exported as mask_embedding.pt)."""
    # DFlash2's, where the target has them (identity otherwise): resolved from the target, never set by a user.
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: Optional[float] = None
    # Token ids the mask token must never alias (pad/eos/bos); checked, not serialised.
    forbidden_mask_ids: List[int] = field(default_factory=list)

    def validate(self) -> "DraftModelConfig":
        spec = kinds.get(self.kind)
        check_layer_ids(self.target_layer_ids, self.num_target_layers)
        check_mask_token(self.mask_token_id, self.vocab_size, self.forbidden_mask_ids)
        check_block_size(self.block_size)
        if self.num_hidden_layers < 1:
            raise ConfigError(f"draft.num_layers={self.num_hidden_layers}: set draft.num_layers >= 1.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"draft.num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"draft.num_key_value_heads={self.num_key_value_heads}; pick heads divisible by kv heads."
            )
        self._validate_layer_types()
        spec.check(self)
        if self.draft_vocab_size is not None:
            check_draft_vocab(self.kind, self.draft_vocab_size, self.vocab_size)
        return self

    def _validate_layer_types(self) -> None:
        types = self.layer_types
        if types is None:
            return
        bad = sorted({t for t in types if t not in LAYER_TYPES})
        if len(types) != self.num_hidden_layers or bad:
            raise ConfigError(
                f"draft.layer_types={list(types)}: give one of {list(LAYER_TYPES)} per draft layer "
                f"({self.num_hidden_layers} layers), or null for the same attention in every layer."
            )
        if SLIDING in types and self.sliding_window is None:
            raise ConfigError(
                f"draft.layer_types has sliding layers {[i for i, t in enumerate(types) if t == SLIDING]} but "
                "draft.sliding_window is null; set the window (speculators' default is 2048)."
            )

    @property
    def lilicorr_width(self) -> int:
        """The lattice transformer's width: vLLM reads `lilicorr_hidden_size or hidden_size`."""
        return self.lilicorr_hidden_size or self.hidden_size

    @property
    def num_speculative_tokens(self) -> int:
        return kinds.get(self.kind).drafted_per_round(self.block_size, self)

    @property
    def anchor_predicts(self) -> bool:
        return kinds.get(self.kind).anchor_predicts(self)

    @property
    def is_causal(self) -> bool:
        """Slot k attends to the context and slots 0..k of its block (JetSpec); otherwise the whole block."""
        return kinds.get(self.kind).causal_in_block

    def is_sliding(self, layer: int) -> bool:
        if self.layer_types is None:
            return self.sliding_window is not None
        return self.layer_types[layer] == SLIDING

    @property
    def mixes_attention(self) -> bool:
        """Sliding and full layers in one draft: vLLM 0.32 serves it on its V2 model runner only."""
        return len({self.is_sliding(i) for i in range(self.num_hidden_layers)}) > 1

    def layer_attention(self) -> List[Tuple[Optional[int], bool]]:
        """Per draft layer: (its window, or None for full attention; whether it is causal inside the block)."""
        out = []
        for i in range(self.num_hidden_layers):
            sliding = self.is_sliding(i)
            out.append((self.sliding_window if sliding else None, self.is_causal or (self.sliding_causal and sliding)))
        return out

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DraftModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def check_draft_vocab(kind: str, n: int, vocab_size: Optional[int] = None) -> None:
    """A reduced draft vocabulary of `n` ids: refused for a kind vLLM serves from the full head only, and out of
    range. The one rule training checks before it loads anything and a resolved config checks again."""
    refusal = kinds.get(kind).draft_vocab_refusal
    if refusal:
        raise ConfigError(f"draft.draft_vocab_size={n} with draft.kind={kind}: {refusal}; keep the full vocabulary "
                          "(drop draft.draft_vocab_size), or train draft.kind=dflash for a reduced head.")
    if n < 1 or (vocab_size is not None and n >= vocab_size):
        upper = f", {vocab_size})" if vocab_size is not None else ")"
        raise ConfigError(f"draft.draft_vocab_size={n} must be in [1{upper} (the target's vocabulary); use null for the "
                          "full vocabulary (8192 or 32768 are usual reduced sizes).")


def check_block_size(block_size: int, key: str = "draft.block_size") -> None:
    """The one rule training, the anchors and a resolved config apply: the anchor and at least one drafted slot."""
    if block_size < 2:
        raise ConfigError(f"{key}={block_size}: a block needs the anchor and at least one drafted slot. "
                          f"Set {key} >= 2 (16 is the usual choice).")


def check_layer_ids(ids, num_target_layers: int) -> None:
    """target_layer_ids must be non-empty, sorted, unique, in [0, L-2].

    L-1 is excluded because HF's last hidden state is taken after the final norm,
    and vLLM captures aux layer i+1 as the residual entering that layer.
    """
    key = "draft.target_layer_ids"
    ids = list(ids) if ids is not None else []
    if not ids:
        raise ConfigError(f"{key} is empty; give at least one target layer, e.g. {default_layer_ids(num_target_layers, 1)}.")
    if len(set(ids)) != len(ids):
        raise ConfigError(
            f"{key}={ids} has duplicates (the default spread collapses on small targets); "
            f"give distinct layers, or fewer draft layers, for a {num_target_layers}-layer target."
        )
    if ids != sorted(ids):
        raise ConfigError(f"{key}={ids} is not sorted; use {sorted(ids)}.")
    hi = num_target_layers - 2
    bad = layers_outside(ids, num_target_layers)
    if bad:
        raise ConfigError(
            f"{key}={ids} has {bad} outside [0, {hi}] for a target with {num_target_layers} layers "
            "(the last layer is excluded); pick layers within that range."
        )


def check_mask_token(mask_token_id, vocab_size: int, forbidden: List[int]) -> None:
    key = "draft.mask_token_id"
    if mask_token_id is None:
        raise ConfigError(
            f"{key} is not set and has no default: pick a reserved, rarely used token of the target "
            "(`python -m blockdraft.models.suggest target=<dir>` lists candidates)."
        )
    if not 0 <= int(mask_token_id) < vocab_size:
        raise ConfigError(f"{key}={mask_token_id} is outside the target vocabulary [0, {vocab_size}); pick a reserved token id inside it.")
    if int(mask_token_id) in set(forbidden):
        raise ConfigError(
            f"{key}={mask_token_id} is the target's pad/eos/bos token; the mask would alias it and "
            "quietly erode acceptance. Pick another reserved token."
        )


def layers_outside(ids, num_target_layers: int) -> List[int]:
    """The ids a draft may not read from a target of `num_target_layers` layers: the rule training, export and
    serving check alike. Layer L-1 is out: HF's last hidden state is taken after the final norm, and vLLM captures
    aux layer i+1 as the residual entering that layer."""
    return [i for i in ids if not 0 <= i <= num_target_layers - 2]


def default_layer_ids(num_target_layers: int, n: int) -> List[int]:
    """The usual spread round(1 + i*(L-4)/(n-1)); may collapse on small targets (callers check)."""
    if n == 1:
        return [max(0, min(1, num_target_layers - 2))]
    return [round(1 + i * (num_target_layers - 4) / (n - 1)) for i in range(n)]

"""The `draft` config group (what users set) and its resolution against a target.

Settings left null take the target's value, so `draft.num_layers=5` on Qwen3-8B gives a
draft with Qwen3-8B's width and heads. The result is a concrete `DraftModelConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from blockdraft import kinds
from blockdraft.kinds.dflash2.settings import DFlash2Settings
from blockdraft.kinds.domino.settings import DominoSettings
from blockdraft.kinds.dspark.settings import DSparkSettings
from blockdraft.kinds.lilicorr.settings import LiLiCorrSettings
from blockdraft.models.draft_config import DraftModelConfig, default_layer_ids


@dataclass
class DraftConfig(DFlash2Settings, DominoSettings, DSparkSettings, LiLiCorrSettings):
    """Schema of the `draft` config group: the shared settings here, each kind's own inherited from its settings
    class (blockdraft/kinds/<kind>/settings.py), as the resolved DraftModelConfig inherits them."""

    kind: str = "dflash"
    """A registered kind (blockdraft/kinds/): dflash | dflash2 | jetspec | domino | dspark | lilicorr."""
    num_layers: int = 1
    """Draft decoder layers."""
    block_size: int = 16
    """Slots per block, anchor included; serve with num_speculative_tokens = block_size - 1."""
    mask_token_id: Optional[int] = None
    """Reserved target token filling the drafted slots. No default: see models.suggest."""
    target_layer_ids: Optional[List[int]] = None
    """0-indexed target decoder layers whose outputs condition the draft; null = default spread."""
    num_target_features: Optional[int] = None
    """How many target layers the default spread picks; null = num_layers."""
    hidden_size: Optional[int] = None
    """Draft width; null = the target's."""
    intermediate_size: Optional[int] = None
    """Width of the draft's MLP; null = the target's (3 x hidden_size where the target has none of its own)."""
    num_attention_heads: Optional[int] = None
    """Attention heads of the draft; null = the target's."""
    num_key_value_heads: Optional[int] = None
    """Key/value heads of the draft; null = the target's."""
    head_dim: Optional[int] = None
    """Width of one attention head; null = the target's (or hidden_size / heads for a draft of another width)."""
    sliding_window: Optional[int] = None
    """Sliding-window attention for the draft (null = full attention)."""
    layer_types: Optional[List[str]] = None
    """Per draft layer, full_attention or sliding_attention (null = every layer sliding when sliding_window is set)."""
    sliding_causal: bool = False
    """The sliding layers attend causally inside the block, full layers bidirectionally (speculators' default)."""
    draft_vocab_size: Optional[int] = None
    """DFlash: a reduced head over the N most frequent reply tokens (null = the target's full head)."""
    train_mask_embedding: bool = False
    """Train the embedding of the MASK slots (vLLM reads it from the export's mask_embedding.pt)."""
    mask_embedding_init: str = "token"
    """token (the target's row for mask_token_id) | mean (the mean of the target's embedding table)."""


def _rope_theta(target_config) -> float:
    params = getattr(target_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(target_config, "rope_theta", None) or 10000.0)


def _target_width(target_config, name: str, fallback=None):
    value = getattr(target_config, name, None)
    return value if value is not None else fallback


def _dense_intermediate_size(target_config) -> int:
    """The draft's MLP width: the target's dense one; an all-MoE target (Qwen3.5-MoE) has none,
    so 3 x hidden, the ratio of the dense Qwen3 models (draft.intermediate_size overrides it)."""
    return _target_width(target_config, "intermediate_size") or 3 * target_config.hidden_size


def _own_settings(draft: DraftConfig, hidden: int) -> dict:
    """The kind's own settings as set (KindSpec.settings), resolved by the kind. Other kinds' settings keep the
    DraftModelConfig defaults, so a draft's saved config (and the resume checks) never depends on them."""
    spec = kinds.get(draft.kind)
    own = {key: getattr(draft, key) for key in spec.settings if hasattr(draft, key)}
    return spec.resolve_settings(own, hidden)


def resolve_layer_ids(draft: DraftConfig, target_config) -> List[int]:
    """The target layers the draft reads: as set, or the default spread over the target."""
    if draft.target_layer_ids is not None:
        return list(draft.target_layer_ids)
    return default_layer_ids(target_config.num_hidden_layers, draft.num_target_features or draft.num_layers)


def resolve_draft_config(
    draft: DraftConfig, target_config, forbidden_mask_ids: Sequence[int] = ()
) -> DraftModelConfig:
    """Combine user settings with the target's HF config; validates before returning."""
    kinds.get(draft.kind)  # an unknown kind, refused with the list
    num_target_layers = target_config.num_hidden_layers
    layer_ids = resolve_layer_ids(draft, target_config)
    t_hidden = target_config.hidden_size
    n_heads = draft.num_attention_heads or target_config.num_attention_heads
    hidden = draft.hidden_size or t_hidden
    head_dim = draft.head_dim or (
        _target_width(target_config, "head_dim") if draft.hidden_size is None else None
    ) or hidden // n_heads
    cfg = DraftModelConfig(
        kind=draft.kind,
        hidden_size=hidden,
        intermediate_size=draft.intermediate_size or _dense_intermediate_size(target_config),
        num_hidden_layers=draft.num_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=draft.num_key_value_heads or _target_width(target_config, "num_key_value_heads", n_heads),
        head_dim=head_dim,
        vocab_size=target_config.vocab_size,
        target_hidden_size=t_hidden,
        num_target_layers=num_target_layers,
        target_layer_ids=list(layer_ids),
        mask_token_id=draft.mask_token_id,
        block_size=draft.block_size,
        rms_norm_eps=_target_width(target_config, "rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(target_config),
        max_position_embeddings=_target_width(target_config, "max_position_embeddings", 40960),
        sliding_window=draft.sliding_window,
        layer_types=list(draft.layer_types) if draft.layer_types is not None else None,
        sliding_causal=draft.sliding_causal,
        draft_vocab_size=draft.draft_vocab_size,
        train_mask_embedding=draft.train_mask_embedding,
        **_own_settings(draft, hidden),
        # Supported targets (Qwen/Llama families) have no embedding scale or logit transform,
        # so input_embedding_scale / output_multiplier / softcapping keep their identity defaults.
        forbidden_mask_ids=list(forbidden_mask_ids),
    )
    return cfg.validate()

"""vLLM's `config.json` for a draft (the way back from one: draft_format/config_reader.py).

What vLLM 0.32 reads (see docs/vllm-dflash-contract.md): the draft is parsed as a Qwen3
config, so every shape key is written explicitly. Two defaults would otherwise bite
silently: transformers fills `head_dim=128` and `rope_theta=10000` when they are absent.
`dflash_config.target_layer_ids` is written and `eagle_aux_hidden_state_layer_ids` /
`eagle_config` never are: vLLM prefers those and reads them without the +1 shift.
"""

from __future__ import annotations

from typing import Mapping, Optional

from blockdraft import kinds
from blockdraft.export.reference_only import reference_only_keys
from blockdraft.models.draft_config import SLIDING, DraftModelConfig


def vllm_config(cfg: DraftModelConfig, target_config: Optional[Mapping] = None, dtype: str = "bfloat16") -> dict:
    """The config.json vLLM serves `cfg` from.

    RoPE is the draft's own (default rope at cfg.rope_theta: what training computed).
    `target_config` (the target's config.json as a dict, or its HF config) only raises
    max_position_embeddings, because vLLM caps the draft's max_model_len by it.
    """
    if target_config is not None and hasattr(target_config, "to_dict"):
        target_config = target_config.to_dict()
    out = {
        "architectures": [kinds.get(cfg.kind).architecture],
        "model_type": "qwen3",
        **_shape_keys(cfg, target_config),
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False,
        **_is_causal_key(cfg),
        "tie_word_embeddings": False,
        "target_hidden_size": cfg.target_hidden_size,
        "num_target_layers": cfg.num_target_layers,
        "block_size": cfg.block_size,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    out.update(_sliding_window_keys(cfg))
    if cfg.draft_vocab_size:
        # vLLM then builds the draft's own head of this size and reads `d2t` (draft id -> target id offset).
        out["draft_vocab_size"] = cfg.draft_vocab_size
    kind_dflash_keys, kind_top_keys = kinds.get(cfg.kind).export_keys(cfg)
    out["dflash_config"] = {**_dflash_config(cfg), **kind_dflash_keys}
    out.update(reference_only_keys(cfg))
    out.update(kind_top_keys)
    return out


def _shape_keys(cfg: DraftModelConfig, target_config: Optional[Mapping]) -> dict:
    max_positions = cfg.max_position_embeddings
    if target_config and target_config.get("max_position_embeddings"):
        max_positions = max(max_positions, int(target_config["max_position_embeddings"]))
    return {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": max_positions,
        "vocab_size": cfg.vocab_size,
    }


def _sliding_window_keys(cfg: DraftModelConfig) -> dict:
    if cfg.sliding_window is None:
        return {}
    # use_sliding_window is needed too: without it transformers drops the window and vLLM raises.
    # layer_types always: transformers would otherwise fill it from max_window_layers (all full here).
    return {
        "use_sliding_window": True,
        "sliding_window": cfg.sliding_window,
        "layer_types": [SLIDING if cfg.is_sliding(i) else "full_attention" for i in range(cfg.num_hidden_layers)],
    }


def _is_causal_key(cfg: DraftModelConfig) -> dict:
    """`is_causal` when every layer agrees, written explicitly: vLLM reads it first, and without it a
    sliding-window draft silently turns causal. A draft causal in its sliding layers only leaves it
    (and dflash_config.causal) out, so that vLLM resolves each layer from layer_types as trained."""
    causal = {c for _, c in cfg.layer_attention()}
    return {"is_causal": causal.pop()} if len(causal) == 1 else {}


def _dflash_config(cfg: DraftModelConfig) -> dict:
    """The keys every kind's dflash_config carries; a kind adds its own (KindSpec.export_keys)."""
    return {
        "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": list(cfg.target_layer_ids),
        "block_size": cfg.block_size,
    }


def fields_not_written(kind: str) -> tuple:
    """Other kinds' settings, which a `kind` export does not carry (its import holds the dataclass defaults)."""
    own = set(kinds.get(kind).settings)
    return tuple(sorted({key for spec in kinds.all_kinds() for key in spec.settings} - own))

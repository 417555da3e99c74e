"""vLLM's `config.json` for a draft, and the way back from one.

What vLLM 0.32 reads (see docs/vllm-dflash-contract.md): the draft is parsed as a Qwen3
config, so every shape key is written explicitly. Two defaults would otherwise bite
silently: transformers fills `head_dim=128` and `rope_theta=10000` when they are absent.
`dflash_config.target_layer_ids` is written and `eagle_aux_hidden_state_layer_ids` /
`eagle_config` never are: vLLM prefers those and reads them without the +1 shift.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

from blockdraft import kinds
from blockdraft.errors import ConfigError
from blockdraft.export.causality import kind_and_sliding_causal
from blockdraft.export.reference_only import reference_only_keys
from blockdraft.export.speculators_format import is_speculators_config, vllm_style_config
from blockdraft.kinds.registry import architectures, recognized
from blockdraft.models.draft_config import SLIDING, DraftModelConfig

# transformers' Qwen3Config default, which vLLM inherits when a config has no rope_theta.
QWEN3_DEFAULT_ROPE_THETA = 10000.0


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


# --- the way back -------------------------------------------------------------------


def draft_kind_of(config: Mapping, where: str = "config.json") -> str:
    """The kind `architectures` names (KindSpec.architecture and .reads); anything else is refused with the
    supported list."""
    archs = list(config.get("architectures") or [])
    read = architectures()
    known = [read[a] for a in archs if a in read]
    if not known:
        raise ConfigError(
            f"{where}: architectures={archs} is not a DFlash draft this importer reads; "
            f"supported: {sorted(read)}, and speculators' DSpark checkpoints "
            "(speculators_model_type: dspark). Set `architectures` to one of them."
        )
    return known[0]


def draft_config_from_vllm_config(config: Mapping, where: str = "config.json") -> DraftModelConfig:
    """A DraftModelConfig from a vLLM-style (or Automodel-style, or speculators') draft config.json."""
    if is_speculators_config(config):
        config = vllm_style_config(config, where)
    kind, sliding_causal = kind_and_sliding_causal(draft_kind_of(config, where), config, where)
    kind = recognized(kind, config)  # a kind sharing the architecture, told apart by its config (KindSpec.recognize)
    spec = kinds.get(kind)
    dflash = {**spec.backbone_keys(config), **dict(config.get("dflash_config") or {})}
    hidden = _required(config, "hidden_size", where)
    heads = _required(config, "num_attention_heads", where)
    layer_ids = _required(dflash, "target_layer_ids", where, "dflash_config.")
    cfg = DraftModelConfig(
        kind=kind,
        hidden_size=hidden,
        intermediate_size=_required(config, "intermediate_size", where),
        num_hidden_layers=_required(config, "num_hidden_layers", where),
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        vocab_size=_required(config, "vocab_size", where),
        target_hidden_size=config.get("target_hidden_size") or hidden,
        # Informational in vLLM and absent from some stacks' configs: the smallest target
        # the layer ids fit. The target checks compare the ids with the real target.
        num_target_layers=config.get("num_target_layers") or max(layer_ids) + 2,
        target_layer_ids=list(layer_ids),
        mask_token_id=_required(dflash, "mask_token_id", where, "dflash_config."),
        block_size=_block_size(config, dflash, where),
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(config),
        max_position_embeddings=config.get("max_position_embeddings", 40960),
        hidden_act=config.get("hidden_act", "silu"),
        sliding_window=_sliding_window(config),
        layer_types=_mixed_layer_types(config),
        sliding_causal=sliding_causal,
        draft_vocab_size=_draft_vocab_size(config),
    )
    spec.read_keys(cfg, config, dflash, where)
    return cfg.validate()


def _required(mapping: Mapping, key: str, where: str, prefix: str = ""):
    if mapping.get(key) is None:
        raise ConfigError(f"{where}: `{prefix}{key}` is missing; a DFlash draft config must set it.")
    return mapping[key]


def _block_size(config: Mapping, dflash: Mapping, where: str) -> int:
    value = dflash.get("block_size", config.get("block_size"))
    if value is None:
        raise ConfigError(
            f"{where}: neither `dflash_config.block_size` nor a top-level `block_size` is set; "
            "add the block size the draft was trained with (serving uses block_size - 1 speculative tokens)."
        )
    return int(value)


def _draft_vocab_size(config: Mapping) -> Optional[int]:
    # vLLM treats draft_vocab_size == vocab_size (or absent) as the full vocabulary.
    n = config.get("draft_vocab_size")
    return int(n) if n is not None and int(n) != int(config.get("vocab_size", -1)) else None


def _rope_theta(config: Mapping) -> float:
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta") or config.get("rope_theta")
    return float(theta) if theta else QWEN3_DEFAULT_ROPE_THETA


def _sliding_window(config: Mapping) -> Optional[int]:
    sliding = config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or [])
    return config.get("sliding_window") if sliding else None


def _mixed_layer_types(config: Mapping) -> Optional[List[str]]:
    """`layer_types` when it mixes sliding and full layers; None when every layer is alike (the window says which)."""
    types = list(config.get("layer_types") or [])
    return types if SLIDING in types and len(set(types)) > 1 else None

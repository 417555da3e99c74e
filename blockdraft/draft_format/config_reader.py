"""The way back from vLLM's `config.json` for a draft (export/vllm_config.py writes it): a DraftModelConfig from
a vLLM-style, Automodel-style or speculators' config. What reads a draft directory (the importer, `inspect`, the
deploy line, the smoke serve's preflight, training's init_from) asks it, so it sits below them all."""

from __future__ import annotations

from typing import List, Mapping, Optional

from blockdraft import kinds
from blockdraft.draft_format.causality import kind_and_sliding_causal
from blockdraft.draft_format.speculators import is_speculators_config, vllm_style_config
from blockdraft.errors import ConfigError
from blockdraft.kinds.registry import architectures, recognized
from blockdraft.models.draft_config import SLIDING, DraftModelConfig

# transformers' Qwen3Config default, which vLLM inherits when a config has no rope_theta.
QWEN3_DEFAULT_ROPE_THETA = 10000.0


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

"""DSpark's keys in an export's config.json, and the way back.

vLLM 0.32 reads a Qwen3 DSpark draft (`architectures: ["Qwen3DSparkModel"]`) as a plain Qwen3
config, not through EAGLEConfig: its heads read top-level keys (qwen3_dspark.py: `markov_rank`,
`enable_confidence_head`, `confidence_head_with_markov`, `draft_vocab_size`, `logit_scale`), its
speculator reads `sample_from_anchor` (default true when absent) and `dspark_draft_topk`, and
config/speculative.py defaults num_speculative_tokens to `block_size`. The DFlash backbone under it
still reads `dflash_config` (mask token, target layers), which the export writes for every kind;
the top-level `target_layer_ids` and `mask_token_id` are written too, as DSpark's own configs and
the speculators converter spell them. `sample_from_anchor` never goes into `dflash_config`: vLLM's
DFlash speculator refuses it there.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Mapping

from blockdraft.errors import ConfigError
from blockdraft.kinds.dspark.settings import DSparkSettings

# The settings that shape a DSpark draft beyond its DFlash backbone (its weights and its block layout).
DSPARK_SETTINGS = tuple(f.name for f in fields(DSparkSettings))
DSPARK_HEAD_KEYS = tuple(key for key in DSPARK_SETTINGS if key != "dspark_draft_topk")  # written whatever their value

# The speculators converter's default when its config has no sample_from_anchor, unlike vLLM's own (true).
SPECULATORS_SAMPLE_FROM_ANCHOR_DEFAULT = False


def dspark_keys(cfg) -> dict:
    out = {key: getattr(cfg, key) for key in DSPARK_HEAD_KEYS}
    out.update({"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id})
    if cfg.dspark_draft_topk is not None:
        out["dspark_draft_topk"] = cfg.dspark_draft_topk
    return out


def dspark_backbone_keys(config: Mapping) -> dict:
    """The backbone's keys where a DSpark config without `dflash_config` keeps them, as vLLM reads them:
    the target layers from `dspark_target_layer_ids` or `target_layer_ids` (eagle3_utils.py), the mask
    from `mask_token_id` or `dspark_noise_token_id` (spec_decode/utils.py), the block from `block_size`
    or `dspark_block_size` (config/speculative.py)."""
    found = {
        "target_layer_ids": config.get("dspark_target_layer_ids", config.get("target_layer_ids")),
        "mask_token_id": config.get("mask_token_id", config.get("dspark_noise_token_id")),
        "block_size": config.get("block_size", config.get("dspark_block_size")),
    }
    return {key: value for key, value in found.items() if value is not None}


def read_dspark(cfg, config: Mapping, where: str, sample_from_anchor_default: bool = True) -> None:
    """Fill `cfg`'s DSpark fields from a config.json (vLLM's, or speculators' after its renames)."""
    if config.get("markov_rank") is None:
        raise ConfigError(f"{where}: a DSpark draft needs `markov_rank` (the Markov head's rank); re-export it.")
    cfg.markov_rank = int(config["markov_rank"])
    cfg.markov_head_type = str(config.get("markov_head_type") or "vanilla")
    cfg.enable_confidence_head = bool(config.get("enable_confidence_head", False))
    cfg.confidence_head_with_markov = bool(config.get("confidence_head_with_markov", False)) and cfg.enable_confidence_head
    cfg.sample_from_anchor = bool(config.get("sample_from_anchor", sample_from_anchor_default))
    topk = config.get("dspark_draft_topk")
    cfg.dspark_draft_topk = int(topk) if topk is not None else None
    scale = config.get("logit_scale", 1.0)
    if scale not in (None, 1, 1.0):
        raise ConfigError(f"{where}: logit_scale={scale}; this project's DSpark drafts use 1.0 (the Qwen3 head).")


def export_keys(cfg) -> tuple:
    """(its dflash_config keys, its top-level keys): vLLM's DSpark heads read top-level keys only."""
    return {}, dspark_keys(cfg)


def read_keys(cfg, config: Mapping, dflash: Mapping, where: str) -> None:
    read_dspark(cfg, config, where)


def resolve_settings(own: dict, hidden_size: int) -> dict:
    # vLLM reads confidence_head_with_markov only with the head; a config without the head says so once.
    return {**own, "confidence_head_with_markov": own["confidence_head_with_markov"] and own["enable_confidence_head"]}

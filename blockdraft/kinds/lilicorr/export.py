"""LiLiCorr's keys in an export's `dflash_config`, and the way back.

vLLM 0.32 (model_executor/models/lilicorr.py) reads them from `dflash_config`: every `lilicorr_*`
head key by subscript (a missing one is a KeyError at load), `lilicorr_enabled` (must be true),
and the optional convolution `conv_kernel_size` / `conv_group_size` (both or neither; absent = 0).
The speculator reads `lilicorr_candidate_topk` as the walk's k. The user still serves it with
`method: "dflash"`; the architecture `LiLiCorrDraftModel` selects this drafter.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Mapping

from blockdraft.errors import ConfigError
from blockdraft.kinds.lilicorr.settings import LiLiCorrSettings

# LiLiCorr's head settings: vLLM's dflash_config keys of the same names (lilicorr_enabled aside).
LILICORR_KEYS = tuple(f.name for f in fields(LiLiCorrSettings))
INT_KEYS = ("lilicorr_candidate_topk", "lilicorr_num_heads", "lilicorr_factor_dim", "lilicorr_num_layers")


def lilicorr_keys(cfg) -> dict:
    """What vLLM's LiLiCorr reads beyond the DFlash keys. The width is written as 0 when it is the
    draft's own: vLLM reads `lilicorr_hidden_size or hidden_size`."""
    out = {key: getattr(cfg, key) for key in LILICORR_KEYS}
    out["lilicorr_hidden_size"] = cfg.lilicorr_hidden_size or 0
    out["lilicorr_enabled"] = True
    out["conv_kernel_size"] = cfg.conv_kernel_size
    out["conv_group_size"] = cfg.conv_group_size
    return out


def read_keys(cfg, config: Mapping, dflash: Mapping, where: str) -> None:
    """Fill `cfg`'s LiLiCorr fields from a config.json's dflash_config, refusing what vLLM refuses."""
    missing = [key for key in LILICORR_KEYS if dflash.get(key) is None]
    if missing:
        raise ConfigError(
            f"{where}: a LiLiCorr draft needs dflash_config.{missing[0]} (all of {list(LILICORR_KEYS)}; vLLM "
            "reads each without a default); re-export it."
        )
    if not dflash.get("lilicorr_enabled", True):
        raise ConfigError(f"{where}: dflash_config.lilicorr_enabled is false; vLLM's LiLiCorr refuses it. Set it true.")
    for key in LILICORR_KEYS:
        setattr(cfg, key, int(dflash[key]) if key in INT_KEYS else float(dflash[key]))
    cfg.lilicorr_hidden_size = int(dflash["lilicorr_hidden_size"]) or None
    cfg.conv_kernel_size = int(dflash.get("conv_kernel_size", 0))
    cfg.conv_group_size = int(dflash.get("conv_group_size", 0))


def export_keys(cfg) -> tuple:
    """(its dflash_config keys, its top-level keys)."""
    return lilicorr_keys(cfg), {}

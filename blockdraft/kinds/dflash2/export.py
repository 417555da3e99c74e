"""DFlash2's keys in an export's `dflash_config`, and the way back (vLLM 0.32's DFlash2 speculator reads the
four required ones without a default; the other three are optional and identity by default)."""

from __future__ import annotations

from dataclasses import fields
from typing import Mapping

from blockdraft.errors import ConfigError

from blockdraft.kinds.dflash2.settings import DFlash2Settings

REQUIRED = tuple(f.name for f in fields(DFlash2Settings))


def export_keys(cfg) -> tuple:
    out = {key: getattr(cfg, key) for key in REQUIRED}
    # Optional in vLLM and identity by default: written only when the target has them.
    if cfg.input_embedding_scale != 1.0:
        out["input_embedding_scale"] = cfg.input_embedding_scale
    if cfg.output_multiplier != 1.0:
        out["output_multiplier"] = cfg.output_multiplier
    if cfg.final_logit_softcapping:
        out["final_logit_softcapping"] = cfg.final_logit_softcapping
    return out, {}


def read_keys(cfg, config: Mapping, dflash: Mapping, where: str) -> None:
    for key in REQUIRED:
        if dflash.get(key) is None:
            raise ConfigError(f"{where}: `dflash_config.{key}` is missing; a DFlash draft config must set it.")
        setattr(cfg, key, int(dflash[key]))
    cfg.input_embedding_scale = float(dflash.get("input_embedding_scale", 1.0))
    cfg.output_multiplier = float(dflash.get("output_multiplier", 1.0))
    cap = dflash.get("final_logit_softcapping")
    cfg.final_logit_softcapping = float(cap) if cap else None

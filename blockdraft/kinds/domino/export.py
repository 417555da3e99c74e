"""Domino's keys in an export's `dflash_config` (its head sizes), and the way back. vLLM never reads them: the
export says vLLM cannot serve it (export/reference_only.py), and the reference engine reads them."""

from __future__ import annotations

from dataclasses import fields
from typing import Mapping

from blockdraft.errors import ConfigError

from blockdraft.kinds.domino.settings import DominoSettings

DOMINO_KEYS = tuple(f.name for f in fields(DominoSettings))


def export_keys(cfg) -> tuple:
    return {key: getattr(cfg, key) for key in DOMINO_KEYS}, {}


def read_keys(cfg, config: Mapping, dflash: Mapping, where: str) -> None:
    for key in DOMINO_KEYS:
        if dflash.get(key) is None:
            raise ConfigError(
                f"{where}: a Domino draft needs dflash_config.{key} (all of {list(DOMINO_KEYS)}); re-export it."
            )
        setattr(cfg, key, int(dflash[key]))


def resolve_settings(own: dict, hidden_size: int) -> dict:
    """The GRU state's width, when null: min(hidden_size, 1024) (1024: the published recipe's)."""
    state = own["correction_hidden_size"]
    return {**own, "correction_hidden_size": state if state is not None else min(hidden_size, 1024)}

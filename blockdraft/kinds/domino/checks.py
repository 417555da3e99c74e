"""Domino's own settings checked."""

from __future__ import annotations

from blockdraft.errors import ConfigError


def check(cfg) -> None:
    for key in ("correction_hidden_size", "correction_rank"):
        if getattr(cfg, key) is None or getattr(cfg, key) < 1:
            raise ConfigError(f"draft.{key}={getattr(cfg, key)}: set it >= 1 (1024 and 256 are the published sizes).")

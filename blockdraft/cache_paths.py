"""Where blockdraft keeps what outlives a run, under one folder that one variable moves.

    $BLOCKDRAFT_CACHE_DIR            the root (default $XDG_CACHE_HOME/blockdraft, else ~/.cache/blockdraft)
      tokenized/                     the token files training and capture map (`data.cache_dir` null)
      round_costs.json               the round costs this machine measured (the pipeline's probe)

A run's own artifacts never land here: they go under its `out=` or `run_dir=`. The pipeline points the
token files at `<out>/tokenized` instead, so that every node of a run maps the same ones.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

ROOT_ENV = "BLOCKDRAFT_CACHE_DIR"
# The token files' folder had a variable of its own before the cache had one root; a user who still sets it
# keeps that folder, and is told the one name to use.
RETIRED_TOKEN_ENV = "BLOCKDRAFT_CACHE"
TOKEN_FILES = "tokenized"
ROUND_COSTS = "round_costs.json"


def cache_root() -> Path:
    explicit = os.environ.get(ROOT_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "blockdraft"


def token_files_dir() -> Path:
    """Where token files go when `data.cache_dir` is null."""
    retired = os.environ.get(RETIRED_TOKEN_ENV)
    if retired:
        warnings.warn(
            f"{RETIRED_TOKEN_ENV}={retired} is read as the token files' folder this time, but that variable is "
            f"retired: set {ROOT_ENV}=<folder> for the whole cache (token files go to <folder>/{TOKEN_FILES}), "
            "or data.cache_dir=<folder> for the token files alone.",
            FutureWarning,
            stacklevel=2,
        )
        return Path(retired).expanduser()
    return cache_root() / TOKEN_FILES


def round_cost_record() -> Path:
    return cache_root() / ROUND_COSTS

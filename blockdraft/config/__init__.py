"""Hydra plumbing: the schemas registered in the ConfigStore and a compose helper for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hydra.core.config_store import ConfigStore

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def register_schema(name: str, node) -> None:
    """Apps register their top-level dataclass; `<app>.yaml` lists it first in its defaults."""
    ConfigStore.instance().store(name=name, node=node)


def compose(app: str, overrides: Sequence[str] = ()):
    """Compose `configs/<app>.yaml` with overrides, exactly as the command line would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=app, overrides=list(overrides))

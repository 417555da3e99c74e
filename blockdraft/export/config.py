"""Schema of the export app (`configs/export.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from blockdraft.errors import ConfigError


@dataclass
class ExportConfig:
    checkpoint: Optional[str] = None
    """A run directory (its latest complete checkpoint) or one checkpoints/step_<N> directory."""
    out: Optional[str] = None
    """Where the vLLM-ready draft goes; must be empty or absent unless overwrite=true."""
    dtype: str = "bfloat16"
    """bfloat16 (GPU serving) | float32 (vLLM on CPU) | float16."""
    target_dir: Optional[str] = None
    """The target's HF directory, checked against the draft; null = target.path of the training config.

    On the command line `target=<dir>` works too. The field cannot be named `target`: Hydra
    would read `target=<dir>` as a choice in the training app's `target/` config group.
    """
    overwrite: bool = False
    """Replace a non-empty `out`, once the new export has passed its checks."""
    inspect: Optional[str] = None
    """Only describe this directory (an export, a checkpoint or a run) and exit."""
    shard_size_bytes: int = 5 * 2**30
    """Above this total the weights are split into shards with a model.safetensors.index.json."""

    # Change nothing in the export's files (the pipeline's export key leaves them out).
    OUTPUT_NEUTRAL = ("overwrite", "inspect")

    def check_export_keys(self) -> None:
        for key in ("checkpoint", "out"):
            if not getattr(self, key):
                raise ConfigError(
                    f"{key} is not set; run `python -m blockdraft.export checkpoint=<run or step dir> out=<dir>` "
                    "(or `inspect=<dir>` to describe a directory)."
                )

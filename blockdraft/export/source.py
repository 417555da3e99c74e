"""What an export reads from a training run: which checkpoint, its training config, its metrics.

`checkpoint=<run_dir>` means the run's latest complete `checkpoints/step_<N>`; a
directory still named `.tmp` is a save in progress (or killed) and never counts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from blockdraft.errors import ConfigError
from blockdraft.models.io import DRAFT_CONFIG_NAME, WEIGHTS_NAME

STEP_DIR = re.compile(r"^step_(\d+)$")
TRAINING_CONFIG = "config.yaml"
METRICS = "metrics.jsonl"


@dataclass
class CheckpointSource:
    path: Path
    """The checkpoint directory holding the draft (model.safetensors + draft_config.json)."""
    step: Optional[int]
    run_dir: Optional[Path]
    training_config: dict = field(default_factory=dict)

    @property
    def target_path(self) -> Optional[str]:
        return (self.training_config.get("target") or {}).get("path")

    @property
    def train_data(self) -> Optional[str]:
        return (self.training_config.get("data") or {}).get("train")


def resolve_checkpoint(path: str | Path, key: str = "checkpoint") -> CheckpointSource:
    """`key` is the setting the path came from, so an error names what the user typed."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{key}={path} does not exist; give a run directory or a checkpoints/step_<N> directory.")
    step_dir = path if is_draft_dir(path) else latest_checkpoint(path, key)
    match = STEP_DIR.match(step_dir.name)
    run_dir = step_dir.parent.parent if step_dir.parent.name == "checkpoints" else None
    return CheckpointSource(
        path=step_dir,
        step=int(match.group(1)) if match else None,
        run_dir=run_dir,
        training_config=read_training_config(step_dir, run_dir),
    )


def is_draft_dir(path: Path) -> bool:
    """model.safetensors, or the shards a train.draft_sharding=fsdp run writes, beside draft_config.json."""
    from blockdraft.models.sharded_io import is_sharded

    return ((path / WEIGHTS_NAME).is_file() or is_sharded(path)) and (path / DRAFT_CONFIG_NAME).is_file()


def latest_checkpoint(run_dir: Path, key: str = "checkpoint") -> Path:
    root = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    steps = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and is_draft_dir(p)]
    if steps:
        return max(steps)[1]
    raise ConfigError(
        f"{key}={run_dir} is neither a checkpoint ({WEIGHTS_NAME} + {DRAFT_CONFIG_NAME}) nor a run "
        f"directory with a complete checkpoints/step_<N> (directories ending in .tmp are half-written). "
        "Point it at a run directory that has saved at least once, or at one step_<N> directory."
    )


def read_training_config(step_dir: Path, run_dir: Optional[Path]) -> dict:
    """The resolved training config saved with the checkpoint (else the run's); {} when absent."""
    from omegaconf import OmegaConf

    for candidate in (step_dir / TRAINING_CONFIG, run_dir / TRAINING_CONFIG if run_dir else None):
        if candidate is not None and candidate.is_file():
            try:
                return OmegaConf.to_container(OmegaConf.load(candidate), resolve=False) or {}
            except Exception as err:  # the config only feeds the model card and defaults
                raise ConfigError(f"{candidate} cannot be read as YAML ({err}); repair or remove it.") from err
    return {}


def read_metrics(run_dir: Optional[Path]) -> list:
    """Complete JSON lines of metrics.jsonl; a torn last line from a killed run is skipped."""
    path = run_dir / METRICS if run_dir else None
    if path is None or not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def last_accept_lengths(source: CheckpointSource) -> dict:
    """{'train': (step, accept_len), 'val': (step, val/accept_len)} up to the checkpoint's step."""
    found = {}
    for row in read_metrics(source.run_dir):
        step = row.get("step")
        # Lines logged after this checkpoint describe a later model, not the exported one.
        if source.step is not None and isinstance(step, int) and step > source.step:
            continue
        if row.get("split") == "val" and row.get("val/accept_len") is not None:
            found["val"] = (step, row["val/accept_len"])
        elif row.get("split") != "val" and row.get("accept_len") is not None:
            found["train"] = (step, row["accept_len"])
    return found

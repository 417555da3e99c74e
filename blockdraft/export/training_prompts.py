"""The record of training prompts an export carries (blockdraft/data/prompt_record.py): copied from the
checkpoint (or its run directory), named in blockdraft_export.json and the model card, and read by
`blockdraft serve` and `blockdraft eval`, which refuse prompts it holds."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from blockdraft.data.prompt_record import RECORD_NAME, PromptRecord
from blockdraft.export.source import CheckpointSource


def record_path(source: CheckpointSource) -> Optional[Path]:
    """The checkpoint's own record, else its run's (a checkpoint saved before checkpoints carried one)."""
    for directory in (source.path, source.run_dir):
        if directory is not None and (directory / RECORD_NAME).is_file():
            return directory / RECORD_NAME
    return None


def copy_record(source: CheckpointSource, export_dir: Path) -> Optional[dict]:
    """Into the export being written; what blockdraft_export.json says of it (None: there is none)."""
    path = record_path(source)
    if path is None:
        return None
    record = PromptRecord.read(path)  # a damaged record is named here, not by serve later
    shutil.copyfile(path, Path(export_dir) / RECORD_NAME)
    return {"file": RECORD_NAME, "prompts": len(record), "complete": record.complete}


def card_line(source: CheckpointSource) -> str:
    """The model card's line on the record."""
    path = record_path(source)
    if path is None:
        return ("- training prompts: not recorded (serve and eval measure this draft with a warning: nothing says "
                "their prompts are held out)")
    record = PromptRecord.read(path)
    incomplete = "; incomplete: it started from a draft without a record" if not record.complete else ""
    return (f"- training prompts: {len(record)}, recorded in `{RECORD_NAME}` (content hashes; `blockdraft serve` and "
            f"`blockdraft eval` refuse prompts among them unless allow_training_prompts=true){incomplete}")

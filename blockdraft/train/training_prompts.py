"""The record of the prompts a run trains on (blockdraft/data/prompt_record.py): every prompt of its
training rows, from a data file or a feature store alike, plus those of the draft it started from
(init_from). Written into the run directory before the first step, and into each checkpoint beside
the weights, so that an export carries it to `blockdraft serve` and `blockdraft eval`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from blockdraft.data.prompt_record import RECORD_NAME, PromptRecord, find_record


def say(message: str) -> None:
    print(f"[train] {message}", flush=True)


def run_record(train_data, init_from: Optional[str]) -> Optional[PromptRecord]:
    """What this run learns from; None when its rows do not say (a feature store captured before stores
    carried prompt hashes)."""
    hashes = train_data.prompt_hashes()
    if hashes is None:
        say(f"note: the feature store {train_data.store.root} carries no prompt hashes (captured before stores did): "
            f"this run writes no {RECORD_NAME}, so serve and eval cannot tell its training prompts from held-out ones; "
            "capture the store again to have one")
        return None
    record = PromptRecord.of(hashes.numpy())
    if init_from:
        inherited = find_record(Path(init_from))
        if inherited is None:
            say(f"note: init_from={init_from} carries no {RECORD_NAME}: this run's record names its own training "
                "prompts only and is marked incomplete")
            record.complete = False
        else:
            record = record.union(inherited)
    return record


def write_run_record(run_dir: Path, record: Optional[PromptRecord], resumed: bool) -> None:
    """A resumed run keeps what it trained on before (its rows may have changed since); a new one starts afresh."""
    path = Path(run_dir) / RECORD_NAME
    if record is None:
        if not resumed:
            path.unlink(missing_ok=True)  # an earlier run's record would name prompts this one never read
        return
    earlier = find_record(run_dir) if resumed else None
    (record.union(earlier) if earlier is not None else record).write(path)


def copy_run_record(run_dir: Path, checkpoint_dir: Path) -> None:
    """Into a checkpoint being written, so that it travels with the weights."""
    source = Path(run_dir) / RECORD_NAME
    if source.is_file():
        shutil.copyfile(source, Path(checkpoint_dir) / RECORD_NAME)

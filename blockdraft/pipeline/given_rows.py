"""`rows=`: the pipeline started from rows the target already answered, checked before any work.

What is checked is what a user gets wrong: a path that is not there, rows that are not chat rows or
hold no reply (prompts passed as rows), and too few rows to hold out `regen.num_heldout` and train on
the rest. The rows' identity is their content, hashed as it streams (a file of GBs is read once, in
blocks of 1 MiB, never held): moving or renaming the file keeps every stage, new content reruns them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from blockdraft.errors import ConfigError

FIX_SHAPE = ("rows= takes rows the target already answered: `messages` (or ShareGPT `conversations`) with the "
             "assistant's reply")


@dataclass
class GivenRows:
    rows: str
    heldout_rows: Optional[str]
    identity: dict
    """{"rows": {"sha256", "rows"}, "heldout_rows": the same or None}: what the regen stage is keyed by."""

    @property
    def count(self) -> int:
        """Rows in `rows` (for a JSONL file, its lines: an upper bound, blank and unreadable ones included)."""
        return int(self.identity["rows"]["rows"])


def absolute_source(spec: Optional[str]) -> Optional[str]:
    """A path as an absolute path (stages run from the repository); a dataset id as given."""
    if not spec:
        return spec
    path = Path(spec).expanduser()
    return str(path.absolute()) if path.exists() else spec


def inspect_given(rows: str, heldout_rows: Optional[str], num_heldout: int) -> GivenRows:
    """Every check of the given rows that needs no stage, in one line each with the fix; then their identity."""
    from blockdraft.data.sources import check_source

    for key, spec in (("rows", rows), ("heldout_rows", heldout_rows)):
        if spec:
            check_source(spec, key)  # a missing file, an unreadable folder, a dataset not in the cache
            check_first_row(spec, key)
    identity = {"rows": source_identity(rows), "heldout_rows": source_identity(heldout_rows) if heldout_rows else None}
    have = identity["rows"]["rows"]
    if heldout_rows is None and have <= num_heldout:
        raise ConfigError(f"rows={rows} holds {have} rows: too few to hold out regen.num_heldout={num_heldout} and train "
                          f"on the rest; lower regen.num_heldout= below {have}, or give the held-out rows as heldout_rows=.")
    if heldout_rows is not None and identity["heldout_rows"]["rows"] == 0:
        raise ConfigError(f"heldout_rows={heldout_rows} holds no rows; point it at the held-out rows, or drop it to "
                          "carve them out of rows=.")
    return GivenRows(rows, heldout_rows, identity)


def check_first_row(spec: str, key: str) -> None:
    """The first row reads as a chat and holds a reply: a file of another shape, or of prompts, is said here."""
    from blockdraft.data.rows import iter_rows, new_report

    report = new_report(spec)
    first = next(iter_rows(spec, report, max_rows=1), None)  # rows set aside before it are training's to report
    if first is None and not report.rejected:
        raise ConfigError(f"{key}={spec} holds no rows; {FIX_SHAPE}.")
    if first is None:
        reason, detail = next(iter(report.first_detail.items()))
        raise ConfigError(f"{key}={spec}: none of its {report.total_rejected} {report.unit}s is a chat row (first: "
                          f"{reason}: {detail}); {FIX_SHAPE}.")
    if not any(m["role"] == "assistant" and m["content"].strip() for m in first.messages):
        raise ConfigError(f"{key}={spec}: {report.unit} {first.line} holds no assistant reply: these are prompts, not "
                          "regenerated rows. Pass them as prompts= for the target to answer, or give rows it answered.")


def source_identity(spec: str) -> dict:
    """{"sha256": the content's hash, "rows": how many}, read as it streams."""
    from blockdraft.data.sources import parse_source

    source = parse_source(spec, "rows")
    if source.kind == "jsonl":
        return _jsonl_identity(Path(source.spec).expanduser())
    from blockdraft.data.dataset import source_fingerprint

    return {"sha256": source_fingerprint(spec), "rows": _dataset_rows(source)}


def _jsonl_identity(path: Path) -> dict:
    digest, lines, last = hashlib.sha256(), 0, b"\n"
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            lines += block.count(b"\n")
            last = block[-1:]
    return {"sha256": digest.hexdigest(), "rows": lines + (last != b"\n")}


def _dataset_rows(source) -> int:
    """Rows of a parquet source from its files' footers; of any other, from the memory-mapped dataset."""
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(f).metadata.num_rows for f in source.files)
    from blockdraft.data.sources import load_rows

    return len(load_rows(source))

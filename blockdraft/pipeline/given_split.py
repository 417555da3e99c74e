"""The regen stage when rows are given (`rows=`): training and held-out rows, apart by prompt content.

The held-out rows are `heldout_rows=` as given, or carved out of `rows=`: the `regen.num_heldout`
distinct prompts whose content hashes are smallest (`blockdraft.data.prompt_record.prompt_hash`, the
identity training records and serving checks). A hash orders prompts as a fixed shuffle, so the carve
is the same for the same rows in any order on any machine, it samples the whole file rather than its
first or last lines (files are often sorted by source or length), and a prompt the file repeats goes
to one side only: its first row is held out, its repeats are set aside (counted), none trained on.

Written under <out>/regen/: heldout.jsonl (the serve check reads JSONL), train.jsonl when carved (given
held-out rows leave rows= as it is: training reads it in place, a copy of GBs saved), and given.json,
the account of the split. Files are written under a temporary name and renamed: a kill leaves none half
written. Every row set aside is counted there and said, never dropped silently.
"""

from __future__ import annotations

import heapq
import json
import os
from pathlib import Path
from typing import List, Optional, Set

from blockdraft.durable import fsync_dir
from blockdraft.errors import ConfigError

SPLIT_RULE = 1  # the carve's rule, in the stage's key: a new rule splits anew
GIVEN_NAME = "given.json"


class RowsWriter:
    """JSONL rows of `{"messages": ...}` to `path`, under a temporary name until `close`."""

    def __init__(self, path: Path):
        self.path, self.tmp, self.count = path, path.with_name(path.name + ".tmp"), 0
        self.fh = open(self.tmp, "w", encoding="utf-8")

    def write(self, messages: list) -> None:
        self.fh.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
        self.count += 1

    def close(self) -> int:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)
        return self.count


def write_given_split(rows: str, heldout_rows: Optional[str], num_heldout: int, out: Path, say) -> dict:
    """The split's files in `out`; returns (and writes as given.json) its account."""
    out.mkdir(parents=True, exist_ok=True)
    account = _apart(rows, heldout_rows, out) if heldout_rows else _carve(rows, num_heldout, out)
    account = {"rows": rows, "heldout_rows": heldout_rows, "rule": SPLIT_RULE, **account}
    for key in ("rows_set_aside", "heldout_rows_set_aside"):
        if account.get(key):
            say(f"regen: {account[key]}")
    (out / GIVEN_NAME).write_text(json.dumps(account, indent=2) + "\n")
    return account


def _hashed(spec: str):
    """(row, its prompt hash) of every chat row of `spec`, and the report of those set aside."""
    from blockdraft.data.prompt_record import prompt_hash
    from blockdraft.data.rows import iter_rows, new_report

    report = new_report(spec)
    return ((row, prompt_hash(row.messages)) for row in iter_rows(spec, report)), report


def smallest_prompts(rows: str, n: int) -> Set[int]:
    """The `n` smallest distinct prompt hashes of `rows` (rows with no prompt never held out)."""
    from blockdraft.data.prompt_record import NO_PROMPT

    heap: List[int] = []  # negated: heap[0] is minus the largest hash kept
    kept: Set[int] = set()
    pairs, _ = _hashed(rows)
    for _, h in pairs:
        if h == NO_PROMPT or h in kept:
            continue
        if len(heap) < n:
            heapq.heappush(heap, -h)
            kept.add(h)
        elif h < -heap[0]:
            kept.discard(-heapq.heappushpop(heap, -h))
            kept.add(h)
    return kept


def _carve(rows: str, n: int, out: Path) -> dict:
    held = smallest_prompts(rows, n)
    train, heldout = RowsWriter(out / "train.jsonl"), RowsWriter(out / "heldout.jsonl")
    seen, repeats = set(), 0
    pairs, report = _hashed(rows)
    for row, h in pairs:
        if h not in held:
            train.write(row.messages)
        elif h in seen:
            repeats += 1  # a held-out prompt asked again: on neither side
        else:
            seen.add(h)
            heldout.write(row.messages)
    counts = {"train": train.close(), "heldout": heldout.close(), "heldout_repeats_set_aside": repeats}
    if len(held) < n or not counts["train"]:
        (out / "train.jsonl").unlink()
        (out / "heldout.jsonl").unlink()
        raise ConfigError(f"rows={rows} holds {len(held) if len(held) < n else n} distinct prompts and "
                          f"{counts['train']} rows besides: too few to hold out regen.num_heldout={n} and train on the "
                          f"rest; lower regen.num_heldout=, or give the held-out rows as heldout_rows=.")
    return {**counts, "rows_set_aside": _aside(report)}


def _apart(rows: str, heldout_rows: str, out: Path) -> dict:
    """The given held-out rows as JSONL, once none of their prompts is in `rows`."""
    from blockdraft.data.prompt_record import NO_PROMPT

    heldout = RowsWriter(out / "heldout.jsonl")
    held, unasked = set(), 0
    pairs, held_report = _hashed(heldout_rows)
    for row, h in pairs:
        if h == NO_PROMPT:
            unasked += 1  # nothing to serve: no user question before the reply
            continue
        heldout.write(row.messages)
        held.add(h)
    overlap: List[int] = []
    total = 0
    pairs, report = _hashed(rows)
    for row, h in pairs:
        total += 1
        if h in held:
            overlap.append(row.line)
    if overlap:
        heldout.fh.close()
        os.unlink(heldout.tmp)
        shown = ", ".join(str(n) for n in overlap[:5]) + (", ..." if len(overlap) > 5 else "")
        raise ConfigError(f"{len(overlap)} rows of rows={rows} ask a prompt heldout_rows={heldout_rows} holds "
                          f"({report.unit}s {shown}): drop them from one of the two, or drop heldout_rows= to carve a "
                          "held-out set out of rows= apart by prompt content.")
    count = heldout.close()
    if not count:
        raise ConfigError(f"heldout_rows={heldout_rows} holds no row with a user prompt to serve; point it at "
                          "held-out chat rows, or drop it to carve them out of rows=.")
    return {"train": total, "heldout": count, "heldout_without_prompt_set_aside": unasked,
            "rows_set_aside": _aside(report), "heldout_rows_set_aside": _aside(held_report)}


def _aside(report) -> Optional[str]:
    """The rows the reader set aside (unreadable, not a chat), as its report says; None when none was."""
    return report.summary() if report.total_rejected else None

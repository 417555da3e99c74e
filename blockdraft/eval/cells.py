"""The eval's unit of work, a cell (dataset x setting x concurrency x server), and where finished
cells are kept (`<out>/cells/<name>.json`): a rerun skips a cell whose inputs did not change."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional

from blockdraft.serve.client import Completion, SpecMetrics

BASELINE = "baseline"


@dataclass(frozen=True)
class CellKey:
    dataset: str
    setting: str
    concurrency: int
    server: str
    """"baseline" (the target alone) or a draft's label."""

    @property
    def name(self) -> str:
        raw = f"{Path(self.dataset).name}__{self.setting}__c{self.concurrency}__{self.server}"
        return "".join(c if c.isalnum() or c in "._-" else "_" for c in raw)


@dataclass
class Cell:
    key: CellKey
    identity: str
    engine: str  # "vllm" | "reference"
    completions: List[Completion]
    wall_s: float
    metrics: Optional[SpecMetrics] = None  # drafts only
    # The reference engine decodes the target alone in-process too: its own baseline.
    reference_baseline: Optional[List[Completion]] = None
    reference_baseline_wall_s: Optional[float] = None

    @property
    def tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)

    @property
    def tokens_per_s(self) -> Optional[float]:
        return self.tokens / self.wall_s if self.wall_s > 0 else None


def identity(**inputs) -> str:
    """A digest of everything a cell's result depends on."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def directory_fingerprint(path: str) -> list:
    """(name, size, mtime) of a model directory's files: changes when it is re-exported or replaced."""
    root = Path(path).expanduser().resolve()
    return [str(root)] + sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir() if p.is_file())


class CellStore:
    def __init__(self, out: Path):
        self.root = Path(out) / "cells"
        self.root.mkdir(parents=True, exist_ok=True)

    def load(self, key: CellKey, wanted_identity: str) -> Optional[Cell]:
        path = self.root / f"{key.name}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # never finished, or torn by a kill: run it again
        if data.get("identity") != wanted_identity:
            return None
        return _cell_from_dict(data)

    def save(self, cell: Cell) -> None:
        """Written to a temporary name, then renamed: a kill never leaves a half cell behind."""
        path = self.root / f"{cell.key.name}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(cell)))
        os.replace(tmp, path)


def _completions(rows) -> Optional[List[Completion]]:
    if rows is None:
        return None
    return [Completion(r["prompt_index"], r["token_ids"], r["seconds"], r.get("finish_reason"),
                       [{int(k): v for k, v in t.items()} for t in r.get("top_logprobs", [])]) for r in rows]


def _cell_from_dict(data: dict) -> Cell:
    metrics = SpecMetrics(**data["metrics"]) if data.get("metrics") else None
    return Cell(CellKey(**data["key"]), data["identity"], data["engine"], _completions(data["completions"]),
                data["wall_s"], metrics, _completions(data.get("reference_baseline")), data.get("reference_baseline_wall_s"))

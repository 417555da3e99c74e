"""`<out>/stages.json`: per stage, the key of its inputs, whether it finished, and its seconds."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Optional


class StageRecords:
    def __init__(self, path: Path):
        self.path = path
        self.records = json.loads(path.read_text()) if path.is_file() else {}

    def finished(self, stage: str, key: str) -> bool:
        record = self.records.get(stage, {})
        return record.get("key") == key and record.get("done", False)

    def started_with(self, stage: str) -> Optional[str]:
        return self.records.get(stage, {}).get("key")

    def mark(self, stage: str, key: str, done: bool, seconds: Optional[float] = None) -> None:
        self.records[stage] = {"key": key, "done": done, "seconds": seconds,
                               "at": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.records, indent=2) + "\n")
        os.replace(tmp, self.path)  # a kill mid-write leaves the previous records whole

    def reload(self) -> "StageRecords":
        self.records = json.loads(self.path.read_text()) if self.path.is_file() else {}
        return self


def stage_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]

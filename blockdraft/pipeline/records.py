"""`<out>/stages.json`: per stage, the key of its inputs, whether it finished, and its seconds.

One process writes it: node 0 (or the only node). Every other node reads it to follow node 0:
a node that wrote its own copy would put back records node 0 has since replaced.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Optional

from blockdraft.durable import write_json

# Not a stage: the pipeline's own decisions that hold for the whole `out` (the feature store choice).
CHOICES = "pipeline"


class StageRecords:
    def __init__(self, path: Path, writer: bool = True):
        self.path = path
        self.writer = writer
        self.records = self._read()

    def _read(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def get(self, stage: str) -> dict:
        return self.records.get(stage, {})

    def mark(self, stage: str, key: str, done: bool, seconds: Optional[float] = None, **extra) -> None:
        """`made` names one making of the stage's artifact: the later stages' keys include it, so a stage
        that made its artifact again (or trained on) makes every later one run again."""
        record = {"key": key, "done": done, "seconds": seconds, "at": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "at_epoch": time.time(), **extra}
        if done:
            record["made"] = uuid.uuid4().hex[:12]
        self.records[stage] = record
        self.write()

    def fail(self, stage: str, reason: str) -> None:
        """The stage stopped without a result: a node waiting for it reads why and exits."""
        record = dict(self.records.get(stage, {}))
        record.update(done=False, failed=reason, at=time.strftime("%Y-%m-%d %H:%M:%S"), at_epoch=time.time())
        self.records[stage] = record
        self.write()

    def choose(self, name: str, value: dict) -> None:
        self.records.setdefault(CHOICES, {})[name] = value
        self.write()

    def choice(self, name: str) -> Optional[dict]:
        return self.records.get(CHOICES, {}).get(name)

    def write(self) -> None:
        if not self.writer:
            raise RuntimeError("only node 0 writes stages.json")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A kill mid-write leaves the previous records whole; a power loss after it, these.
        write_json(self.path, self.records)

    def reload(self) -> "StageRecords":
        try:
            self.records = self._read()
        except json.JSONDecodeError:  # never torn (os.replace), but a copy in flight on a network file system may be
            pass
        return self


def stage_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]

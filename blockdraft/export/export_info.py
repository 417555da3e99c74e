"""blockdraft_export.json: what an export records of itself (the kind it trained as, its source checkpoint, the
target it was checked against). The writer writes it; serving and the deploy line read it."""

from __future__ import annotations

import json
from pathlib import Path

EXPORT_INFO = "blockdraft_export.json"


def read_export_info(directory: Path) -> dict:
    """The record, or {} for a directory no exporter of this project wrote (another stack's draft)."""
    path = Path(directory) / EXPORT_INFO
    return json.loads(path.read_text()) if path.is_file() else {}

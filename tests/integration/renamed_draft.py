"""A copy of an export whose config.json names the draft as another training stack does
(Qwen3DFlashDraftModel, ...): the directory such a stack hands to vLLM."""

import json
import shutil
from pathlib import Path


def renamed_copy(export: Path, out: Path, architecture: str) -> Path:
    shutil.copytree(export, out)
    (out / "checksums.json").unlink(missing_ok=True)  # config.json is edited on purpose
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = [architecture]
    config_path.write_text(json.dumps(config, indent=2))
    return out

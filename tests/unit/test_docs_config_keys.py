"""Every key a file under configs/ sets is documented somewhere under docs/.

Each leaf key is collected as a user writes it on the command line: a file with the
`# @package _global_` header from the root (configs/experiment/tiny_cpu.yaml gives
`draft.num_layers`), a group file without it under its group's package
(configs/optim/muon.yaml gives `optim.muon_lr`), a top-level app file as it is (`run_dir`).
The `defaults` list and the `hydra` section are not keys a user sets.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
DOCS = REPO / "docs"
SKIPPED = ("defaults", "hydra")
GLOBAL_HEADER = re.compile(r"^\s*#\s*@package\s+_global_\s*$", re.MULTILINE)


def package_of(path: Path) -> str:
    """The dotted prefix a file's keys sit under, as Hydra places them."""
    if GLOBAL_HEADER.search(path.read_text()):
        return ""
    group = path.parent.relative_to(CONFIGS)
    return ".".join(group.parts)  # "" for the top-level app files


def leaves(node, prefix: str) -> Iterator[str]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            if not prefix and key in SKIPPED:
                continue
            yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif prefix:
        yield prefix


def config_keys() -> Dict[str, List[str]]:
    """dotted key -> the configs/ files that set it."""
    keys: Dict[str, List[str]] = {}
    for path in sorted(CONFIGS.rglob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        assert isinstance(data, dict), f"{path} is not a mapping"
        for key in leaves(data, package_of(path)):
            keys.setdefault(key, []).append(str(path.relative_to(REPO)))
    return keys


def mentioned(key: str, text: str) -> bool:
    """The key verbatim, not as part of a longer key (`train.gamma` is not `train.gamma_x` or `x.train.gamma`)."""
    return re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", text) is not None


def test_the_collection_reads_keys_as_a_user_writes_them():
    keys = config_keys()
    for key in ("draft.num_layers", "train.max_steps", "name", "target.path", "optim.muon_lr",
                "data.seq_length", "run_dir", "draft.target_layer_ids", "target.dtype"):
        assert key in keys, key
    assert not any(k.split(".")[0] in SKIPPED for k in keys)


def test_every_config_key_is_documented():
    text = "\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    missing: List[Tuple[str, List[str]]] = [(k, files) for k, files in sorted(config_keys().items())
                                            if not mentioned(k, text)]
    assert not missing, "config keys no page under docs/ mentions:\n" + "\n".join(
        f"  {key}  (set in {', '.join(files)})" for key, files in missing)

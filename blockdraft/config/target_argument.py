"""`target=<dir>` in the training and capture apps, where `target` is also a config group.

Every other app takes `target=<dir>` for a local model directory; here a name of configs/target/ still
selects the group (recipes and tests use them), and anything else is a directory, given as the pipeline
composes it: `target.path=<dir> target.tiny=null` (no tiny random target is built in its place).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

from blockdraft.config import CONFIG_DIR
from blockdraft.errors import ConfigError

PREFIX = "target="


def target_groups() -> List[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "target").glob("*.yaml"))


def directory_overrides(value: str) -> List[str]:
    """`target=<value>` when value is not a group name: the directory's overrides, or a refusal."""
    path = Path(value).expanduser()
    fix = f"give a local Hugging Face model directory, or one of the target configs: {', '.join(target_groups())}"
    if not path.is_dir():
        raise ConfigError(f"target={value} is neither a directory nor a target config (configs/target/<name>.yaml); {fix}.")
    if not (path / "config.json").is_file():
        raise ConfigError(f"target={value} has no config.json, so it is not a model directory; {fix}.")
    return [f"target.path={value}", "target.tiny=null"]


def rewrite_target_argument(argv: List[str]) -> List[str]:
    """argv with `target=<dir>` as `target.path=<dir> target.tiny=null`; a group name is kept as it is."""
    out: List[str] = []
    for arg in argv:
        value = arg[len(PREFIX):] if arg.startswith(PREFIX) else None
        if value is None or value in target_groups() or value == "null":
            out.append(arg)
        else:
            out += directory_overrides(value)
    return out


def target_argument_or_exit(argv: List[str]) -> List[str]:
    """rewrite_target_argument for an app's entry: a refusal is one line and exit status 2, before any work."""
    try:
        return rewrite_target_argument(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)

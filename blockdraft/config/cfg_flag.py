"""`--cfg job` for the commands that are not Hydra apps: they print their settings and exit without work,
as the Hydra apps do; any other `--cfg` value is refused in one line."""

from __future__ import annotations

from typing import List, Tuple

from blockdraft.errors import ConfigError


def split_cfg_job(argv: List[str], what: str) -> Tuple[List[str], bool]:
    """(argv without `--cfg job`, whether it was there); `what` says what the command prints for it."""
    if "--cfg" not in argv and "-c" not in argv:
        return argv, False
    at = argv.index("--cfg") if "--cfg" in argv else argv.index("-c")
    if argv[at + 1:at + 2] != ["job"]:
        raise ConfigError(f"--cfg takes job here ({what}); write --cfg job.")
    return argv[:at] + argv[at + 2:], True

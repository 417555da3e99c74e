"""`--cfg job` for the commands that are not Hydra apps: they print their settings and exit without work,
as the Hydra apps do; any other `--cfg` value is refused in one line. `front_door` is the rest of such a
command's start (`--help`, a refused argument)."""

from __future__ import annotations

import sys
from typing import Callable, List, Optional, Tuple, TypeVar

from blockdraft.errors import ConfigError

S = TypeVar("S")


def split_cfg_job(argv: List[str], what: str) -> Tuple[List[str], bool]:
    """(argv without `--cfg job`, whether it was there); `what` says what the command prints for it."""
    if "--cfg" not in argv and "-c" not in argv:
        return argv, False
    at = argv.index("--cfg") if "--cfg" in argv else argv.index("-c")
    if argv[at + 1:at + 2] != ["job"]:
        raise ConfigError(f"--cfg takes job here ({what}); write --cfg job.")
    return argv[:at] + argv[at + 2:], True


def front_door(argv: List[str], usage: Callable[[], str], parse: Callable[[List[str]], S],
               show: Callable[[S], str], what: str) -> Tuple[Optional[int], Optional[S]]:
    """What every small key=value command does before its work: `--help`, a refused argument (exit 2, one line
    on stderr) and `--cfg job` end it with their exit status; otherwise (None, its settings)."""
    if any(a in ("-h", "--help") for a in argv):
        print(usage())
        return 0, None
    try:
        argv, show_config = split_cfg_job(argv, what)
        settings = parse(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2, None
    if show_config:
        print(show(settings))
        return 0, None
    return None, settings

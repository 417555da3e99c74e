"""Which blockdraft wrote a file: the version and, run from a git checkout, the commit.

Exports, serve reports and eval reports carry both, so a figure or a draft can be traced to the
code that made it. Finding the commit never fails a run: anything unexpected gives "unknown".
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from blockdraft import __version__

UNKNOWN = "unknown"
# The checkout that holds this package, when it runs from one (an installed copy has no .git beside it).
CHECKOUT = Path(__file__).resolve().parent.parent


def build_info() -> dict:
    """{"blockdraft_version": "0.1.0", "blockdraft_commit": "<40 hex>[-dirty]" or "unknown"}."""
    return {"blockdraft_version": __version__, "blockdraft_commit": git_commit()}


def card_line() -> str:
    info = build_info()
    return f"- exported by: blockdraft {info['blockdraft_version']}, commit {info['blockdraft_commit']}"


@functools.lru_cache(maxsize=1)
def git_commit(checkout: Path = CHECKOUT) -> str:
    """HEAD of the checkout this package runs from; "-dirty" when tracked files differ from it."""
    if not (checkout / ".git").exists():
        return UNKNOWN
    try:
        # A package copied inside some other repository must not report that repository's commit.
        if Path(_git(checkout, "rev-parse", "--show-toplevel")).resolve() != checkout:
            return UNKNOWN
        commit = _git(checkout, "rev-parse", "HEAD")
        # --no-optional-locks: a report written beside a running `git commit` must not take its index lock
        dirty = _git(checkout, "--no-optional-locks", "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):  # no git, a broken repository, a hung filesystem
        return UNKNOWN
    return commit + ("-dirty" if dirty else "")


def _git(checkout: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=20, check=True)
    return done.stdout.strip()

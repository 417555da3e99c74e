"""Named fault-injection points, for the fault suite (tests/faults); off unless asked for.

Code marks a moment with `faults.point("checkpoint.after_weights")`. Nothing happens
unless the environment variable BLOCKDRAFT_FAULT names that point:

    BLOCKDRAFT_FAULT=<point>[@<hit>]:<action>[,<point>[@<hit>]:<action> ...]

    <hit>     which pass through the point fires (1 = the first, the default)
    <action>  kill      SIGKILL this process (no handler, no cleanup: as the OOM killer does)
              term      SIGTERM this process (what a scheduler sends before preempting)
              sleep=S   pause S seconds, so a test can kill the process at exactly this moment
              raise     raise FaultInjected

Before acting, the process writes the point's name to the file named by
BLOCKDRAFT_FAULT_MARK (when set) and to stderr, so a test knows the moment has come.
Unset, a point costs one dictionary lookup: the points sit on hot paths (every step).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Dict, Tuple

ENV = "BLOCKDRAFT_FAULT"
MARK_ENV = "BLOCKDRAFT_FAULT_MARK"
ACTIONS = ("kill", "term", "sleep", "raise")

_hits: Dict[str, int] = {}
_parsed: Tuple[str, Dict[str, Tuple[int, str, float]]] = ("", {})


class FaultInjected(RuntimeError):
    """Raised at a point whose action is `raise`."""


def point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    plan = _plan(spec).get(name)
    if plan is None:
        return
    _hits[name] = _hits.get(name, 0) + 1
    hit, action, seconds = plan
    if _hits[name] == hit:
        _act(name, action, seconds)


def _plan(spec: str) -> Dict[str, Tuple[int, str, float]]:
    """{point: (hit, action, seconds)}; parsed once per distinct value of the variable."""
    global _parsed
    if _parsed[0] != spec:
        _parsed = (spec, parse(spec))
    return _parsed[1]


def parse(spec: str) -> Dict[str, Tuple[int, str, float]]:
    plan = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        where, _, action = item.partition(":")
        name, _, hit = where.partition("@")
        action, _, arg = action.partition("=")
        if not name or action not in ACTIONS or (hit and not hit.isdigit()) or (action == "sleep" and not _is_number(arg)):
            # A typo here would silently inject nothing and let a fault test pass for the wrong reason.
            raise ValueError(
                f"{ENV}={spec!r}: cannot read {item!r}; write <point>[@<hit>]:<action> with action one of "
                "kill, term, raise or sleep=<seconds>, e.g. checkpoint.after_weights@2:sleep=30."
            )
        plan[name] = (int(hit or 1), action, float(arg or 0))
    return plan


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _act(name: str, action: str, seconds: float) -> None:
    mark = os.environ.get(MARK_ENV)
    if mark:
        with open(mark, "a") as fh:
            fh.write(name + "\n")
    print(f"[fault] {name}: {action}" + (f" {seconds:g} s" if action == "sleep" else ""), file=sys.stderr, flush=True)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "sleep":
        time.sleep(seconds)
    else:
        raise FaultInjected(f"fault injected at {name} ({ENV})")

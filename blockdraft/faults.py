"""Named fault-injection points, for the fault suite (tests/faults); off unless asked for.

Code marks a moment with `faults.point("checkpoint.after_weights")`. Nothing happens
unless the environment variable BLOCKDRAFT_FAULT names that point:

    BLOCKDRAFT_FAULT=<point>[@<hit>][~<filter> ...]:<action>[,<point>[@<hit>][~<filter> ...]:<action> ...]

    <hit>     which pass through the point fires (1 = the first, the default); N+ = every pass from the Nth
    <filter>  which processes it fires in (every one, the default):
              rank=R     only in the process of global rank R (the RANK torchrun sets; 0 without torchrun)
              attempt=A  only in torchrun's restart attempt A (TORCHELASTIC_RESTART_COUNT; 0 = the first), so a
                         fault that kills a worker does not kill it again in the group torchrun restarts
              e.g. train.after_backward@3~rank=1~attempt=0:kill kills rank 1 in its third step, first attempt only
    <action>  kill      SIGKILL this process (no handler, no cleanup: as the OOM killer does)
              term      SIGTERM this process (what a scheduler sends before preempting)
              sleep=S   pause S seconds, so a test can kill the process at exactly this moment; a signal
                        the process handles (SIGTERM) ends the pause, and its handler's work goes on at once
              raise     raise FaultInjected
              nan[=R]   at a value point (`faults.corrupt`): the value becomes NaN, on every rank or
                        on rank R only (the RANK torchrun sets), as a bad row or a bad kernel would

Before acting, the process writes the point's name to the file named by
BLOCKDRAFT_FAULT_MARK (when set) and to stderr, so a test knows the moment has come.
Unset, a point costs one dictionary lookup: the points sit on hot paths (every step).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Dict, Optional, Tuple

ENV = "BLOCKDRAFT_FAULT"
MARK_ENV = "BLOCKDRAFT_FAULT_MARK"
ACTIONS = ("kill", "term", "sleep", "raise", "nan")

_hits: Dict[str, int] = {}
FILTERS = ("rank", "attempt")

# {point: (first hit, every later hit too, action, argument)}: this process's faults
Plan = Dict[str, Tuple[int, bool, str, float]]
_parsed: Tuple[tuple, Plan] = ((), {})


class FaultInjected(RuntimeError):
    """Raised at a point whose action is `raise`."""


def point(name: str) -> None:
    fired = _fires(name)
    if fired is not None:
        _act(name, *fired)


def corrupt(name: str, value):
    """`value` (a tensor), or NaN of its shape where the point fires with action nan."""
    fired = _fires(name)
    if fired is None:
        return value
    action, arg = fired
    if action != "nan":
        _act(name, action, arg)
        return value
    if arg >= 0 and int(arg) != int(os.environ.get("RANK", "0")):
        return value
    _mark(name, f"nan{'' if arg < 0 else f' on rank {int(arg)}'}")
    return value * float("nan")


def _fires(name: str) -> Optional[Tuple[str, float]]:
    """(action, argument) when this pass through `name` fires, else None."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    plan = _plan(spec).get(name)
    if plan is None:
        return None
    _hits[name] = _hits.get(name, 0) + 1
    hit, onwards, action, arg = plan
    if _hits[name] == hit or (onwards and _hits[name] > hit):
        return action, arg
    return None


def this_process() -> Dict[str, int]:
    """The values the filters compare with: this process's global rank and torchrun restart attempt."""
    return {"rank": int(os.environ.get("RANK") or 0), "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)}


def _plan(spec: str) -> Plan:
    """Parsed once per distinct value of the variable (and of the rank and attempt it may be filtered by)."""
    global _parsed
    process = this_process()
    key = (spec, tuple(sorted(process.items())))
    if _parsed[0] != key:
        _parsed = (key, parse(spec, process))
    return _parsed[1]


def parse(spec: str, process: Optional[Dict[str, int]] = None) -> Plan:
    """The faults `spec` asks of `process` (this one by default): an item filtered to another rank or restart
    attempt is not among them."""
    process = this_process() if process is None else process
    plan = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        where, _, action = item.partition(":")
        where, *filters = where.split("~")
        wanted = dict(f.partition("=")[::2] for f in filters)
        bad_filter = len(wanted) != len(filters) or any(k not in FILTERS or not v.isdigit() for k, v in wanted.items())
        name, _, hit = where.partition("@")
        action, _, arg = action.partition("=")
        onwards = hit.endswith("+")
        hit = hit[:-1] if onwards else hit
        bad_arg = (action == "sleep" and not _is_number(arg)) or (action == "nan" and arg and not arg.isdigit())
        if not name or action not in ACTIONS or (hit and not hit.isdigit()) or (onwards and not hit) or bad_arg or bad_filter:
            # A typo here would silently inject nothing and let a fault test pass for the wrong reason.
            raise ValueError(
                f"{ENV}={spec!r}: cannot read {item!r}; write <point>[@<hit>[+]][~rank=<R>][~attempt=<A>]:<action> "
                "with action one of kill, term, raise, sleep=<seconds> or nan[=<rank>], e.g. "
                "checkpoint.after_weights@2:sleep=30 or train.after_backward@3~rank=1~attempt=0:kill."
            )
        if any(int(v) != process[k] for k, v in wanted.items()):
            continue  # another process's fault
        default = -1.0 if action == "nan" else 0.0  # nan with no rank: every rank
        plan[name] = (int(hit or 1), onwards, action, float(arg) if arg else default)
    return plan


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _mark(name: str, what: str) -> None:
    mark = os.environ.get(MARK_ENV)
    if mark:
        with open(mark, "a") as fh:
            fh.write(name + "\n")
    print(f"[fault] {name}: {what}", file=sys.stderr, flush=True)


def _pause(seconds: float) -> None:
    """Sleep `seconds`, or until a signal with a Python handler arrives: time.sleep resumes after the handler
    (PEP 475), which would hold a SIGTERM test idle for the rest of the pause before the stop it asked for."""
    import select

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end)  # the interpreter writes a byte there on each signal
    except ValueError:  # not the main thread: no wake-up fd to be had
        os.close(read_end), os.close(write_end)
        time.sleep(seconds)
        return
    try:
        select.select([read_end], [], [], seconds)
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read_end), os.close(write_end)


def _act(name: str, action: str, seconds: float) -> None:
    if action == "nan":
        raise ValueError(f"{ENV}: {name} is not a value point; nan applies only where code calls faults.corrupt")
    _mark(name, action + (f" {seconds:g} s" if action == "sleep" else ""))
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "sleep":
        _pause(seconds)
    else:
        raise FaultInjected(f"fault injected at {name} ({ENV})")

"""One training run per run directory: `.lock` is a lease that rank 0 holds and renews while it trains.

The lease itself (how it is taken, renewed, judged stale and taken over atomically) is every app's out lock,
blockdraft/out_lock.py: the holder is named (host, pid, the job and the restart attempt it belongs to), a daemon
thread renews it every lease_s / 4, and it is taken over only where its holder is gone (expired on any host, an
earlier restart attempt of this job, a dead pid here). A live lease of another run is never taken: that run is
refused, naming the holder.

A holder that stalled past lease_s (swapping, a frozen file system) can wake to find another run holding the
directory: its heartbeat then marks the lock lost, and `check_held` (called before each checkpoint save) stops it
before it writes over the new holder's checkpoints.
"""

from __future__ import annotations

import os  # noqa: F401  (tests reach the os module through this one)

# The names training's code and tests have always taken from here.
from blockdraft.out_lock import LOCK_NAME, TRIES, OutLock, _clock, _same_file, _who, job_id, restart_attempt  # noqa: F401


class RunLock(OutLock):
    """The run directory's lease, in the words of training: run_dir, checkpoints, resume=auto."""

    key = "run_dir"
    harm = "two runs would overwrite each other's checkpoints"
    remedy = "Use another run_dir"

    def __init__(self, run_dir, lease_s: float = 120.0):
        super().__init__(run_dir, lease_s, app="training run")

    def lost_consequence(self) -> str:
        return "this run saves nothing more and stops at its next checkpoint."

    def taken_over_message(self) -> str:
        return (f"run_dir {self.directory} was taken over by {_who(self.taken_by)} while this run stalled past "
                f"its lease (distributed.lease_s={self.lease_s:g} s): this run stops without saving, so as not to "
                "overwrite that run's checkpoints. Let that run go on; to continue this one instead, stop that one and "
                "rerun with resume=auto. Where stalls this long are expected, raise distributed.lease_s.")

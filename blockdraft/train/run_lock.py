"""One training run per run directory: a lock file naming the owner's host and pid.

A lock left by a process that no longer exists on this host is stale and taken over.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from blockdraft.errors import ConfigError
from blockdraft.machine import pid_alive

LOCK_NAME = ".lock"


class RunLock:
    def __init__(self, run_dir):
        self.path = Path(run_dir) / LOCK_NAME
        self.held = False

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                self._refuse_or_clear_stale()
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump(me, fh)
            self.held = True
            return self
        raise ConfigError(f"could not take {self.path}; remove it if no run uses {self.path.parent}.")

    def _refuse_or_clear_stale(self) -> None:
        try:
            owner = json.loads(self.path.read_text())
        except (json.JSONDecodeError, OSError):
            owner = {}
        same_host = owner.get("host") == socket.gethostname()
        if same_host and isinstance(owner.get("pid"), int) and not pid_alive(owner["pid"]):
            print(f"[lock] taking over a stale lock of pid {owner['pid']} (no such process)", flush=True)
            self.path.unlink(missing_ok=True)
            return
        raise ConfigError(
            f"run_dir {self.path.parent} is in use by pid {owner.get('pid')} on {owner.get('host')} "
            f"since {owner.get('since')}; two runs would overwrite each other's checkpoints. "
            f"Use another run_dir, or delete {self.path} if that run is gone."
        )

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

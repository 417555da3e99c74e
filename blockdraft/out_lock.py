"""One writer per output directory: a lease file that the process writing there holds and renews.

Every app that writes an output directory takes one before any work: training on its run_dir (train/run_lock.py),
the pipeline on its out (`stages.json`, `superseded/`), regen on its out, the capture on its store, the export on
its out. Under torchrun only global rank 0 takes it (`hold_out_lock`). The pipeline's stages write into
sub-directories of the pipeline's out and take their own locks there: the pipeline's lock file is none of theirs.

The lease names its holder (host, pid, the app, when it started, the job and the restart attempt it belongs to)
and when it was last renewed; a daemon thread rewrites it every lease_s / 4. Another process takes it over only
where its holder is gone:

- the lease is older than its lease_s: the holder stopped renewing it (its node was lost), on any host;
- it is this job's lease from an earlier restart attempt: torchrun stops every worker of a group before it
  starts the next attempt, so that holder no longer runs;
- it names a process of this host that no longer exists.

A live lease of another process is never taken: that one is refused at once, naming the holder and what to do.
A lease's age is judged on the reader's clock against the renewal time its holder wrote, so the hosts' clocks
must agree to well within lease_s.

A holder that stalled past lease_s (swapping, a frozen file system) can wake to find another process holding the
directory: its heartbeat then marks the lock lost, and `check_held` (training calls it before each checkpoint
save) stops it before it writes over the new holder's files.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Tuple

from blockdraft.errors import ConfigError
from blockdraft.machine import pid_alive

LOCK_NAME = ".lock"
TRIES = 8  # looks at the lock before giving up on a contended one: each lost race re-reads it
DEFAULT_LEASE_S = 120.0


def job_id() -> Optional[str]:
    """The job this process belongs to: torchrun's rendezvous id, else the Slurm job's, else none."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    # "none" is torchrun's id when no --rdzv-id was given: the same for every job, so it tells none apart.
    if run_id and run_id != "none":
        return run_id
    return os.environ.get("SLURM_JOB_ID") or None


def restart_attempt() -> int:
    """0 for the first attempt of a torchrun group, n for its nth restart."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


def global_rank() -> int:
    """torchrun's global rank of this process; 0 without torchrun."""
    return int(os.environ.get("RANK") or 0)


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def beside(out) -> Path:
    """`<out>.lock`, next to `out`: the lock of an app whose out must hold only what it writes there (a feature
    store refuses a non-empty directory that holds none; an export replaces its out by a rename)."""
    out = Path(out).absolute()
    return out.with_name(out.name + LOCK_NAME)


class OutLock:
    """The lease on `directory`, in `directory/.lock` unless `lock_path` says where.

    `app`: who holds it (said in a refusal: "a regen started at ..."); `key`: the setting that names the directory
    ("out", "run_dir"); `harm`: what two writers would do; `remedy`: what to do instead, formatted with the holder's
    fields ({pid}, {host})."""

    key = "out"
    harm = "two processes writing one directory would overwrite each other's files"
    remedy = "Wait for it to end, or stop it (kill {pid} on {host}) and rerun the same command to resume; use another {key} for a separate run"

    def __init__(self, directory, lease_s: float = DEFAULT_LEASE_S, app: str = "run", lock_path=None,
                 key: Optional[str] = None, harm: Optional[str] = None, remedy: Optional[str] = None):
        if not isinstance(lease_s, (int, float)) or not lease_s > 0:
            raise ConfigError(f"distributed.lease_s={lease_s}: use a positive number of seconds (120 by default): "
                              "how long a run's lock stays its own without being renewed.")
        self.directory = Path(directory)
        self.path = Path(lock_path) if lock_path is not None else self.directory / LOCK_NAME
        self.lease_s = float(lease_s)
        self.app = app
        self.key = key or self.key
        self.harm = harm or self.harm
        self.remedy = remedy or self.remedy
        self.token = uuid.uuid4().hex  # tells this holder's lease from any other, whatever its host and pid
        self.job, self.attempt = job_id(), restart_attempt()
        self.held = False
        self.lost = False
        self.taken_by: dict = {}
        self._since = time.time()
        self._stop = threading.Event()
        self._heartbeat: Optional[threading.Thread] = None
        self._made: list = []

    def __enter__(self) -> "OutLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # --- taking the lease ---------------------------------------------------------------------
    def acquire(self):
        # The directories made for the lock alone are removed with it where nothing else was written there: a
        # run refused just after (a bad key) leaves no empty out behind.
        self._made = [d for d in (self.path.parent, *self.path.parent.parents) if not d.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return self._acquire()
        except BaseException:
            self._remove_made()
            raise

    def _remove_made(self) -> None:
        for directory in self._made:  # deepest first
            try:
                directory.rmdir()
            except OSError:  # holds something now (or another process's): kept
                break
        self._made = []

    def _acquire(self):
        for tries in range(TRIES):
            if self._create():
                return self._start()
            seen = self._read()
            if seen is None:  # released since: try to create it again
                continue
            holder, stat = seen
            why = self._takeover_reason(holder, stat)
            if why is None:
                raise ConfigError(self._refusal(holder, stat))
            if self._claim(stat):
                print(f"[lock] taking over {self.path}: {why}", flush=True)
                return self._start()
            time.sleep(0.02 * (tries + 1))  # another process claimed it first: judge what it wrote
        raise ConfigError(f"could not take {self.path}: other processes were taking it at the same time. Use one "
                          f"{self.app} per {self.key}; rerun once the others have started (one of them holds it then).")

    def _lease(self) -> dict:
        now = time.time()
        return {"host": socket.gethostname(), "pid": os.getpid(), "app": self.app, "job": self.job,
                "attempt": self.attempt, "token": self.token, "lease_s": self.lease_s, "since": _clock(self._since),
                "renewed": now, "renewed_at": _clock(now)}

    def _create(self) -> bool:
        """Write our lease where no lock exists; False where one does."""
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                break
            except FileExistsError:
                return False
            except FileNotFoundError:  # its directory, made for another lock, removed with it just now
                self.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            raise ConfigError(f"could not create {self.path}: its directory keeps disappearing; check what removes it.")
        with os.fdopen(fd, "w") as fh:
            json.dump(self._lease(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        return True

    def _read(self) -> Optional[Tuple[dict, os.stat_result]]:
        """(the lease, its file's stat), or None where there is no lock. A lock is unreadable for an instant
        while another process creates it (its lease written just after): read again before judging it."""
        for _ in range(20):
            try:
                with open(self.path) as fh:
                    stat = os.fstat(fh.fileno())
                    text = fh.read()
            except FileNotFoundError:
                return None
            try:
                holder = json.loads(text)
                if isinstance(holder, dict):
                    return holder, stat
            except json.JSONDecodeError:
                pass
            time.sleep(0.05)
        return {}, stat  # left unwritten by a process that died creating it: judged by the file's age

    def _renewed(self, holder: dict, stat: os.stat_result) -> float:
        renewed = holder.get("renewed")
        # A lock written before leases (or never finished) has no renewal time: its file's is the best there is.
        return float(renewed) if isinstance(renewed, (int, float)) else stat.st_mtime

    def _holder_lease_s(self, holder: dict) -> float:
        # The holder's own promise: it renews every lease_s / 4 of its own lease_s.
        given = holder.get("lease_s")
        return float(given) if isinstance(given, (int, float)) and given > 0 else self.lease_s

    def _takeover_reason(self, holder: dict, stat: os.stat_result) -> Optional[str]:
        """Why the holder is certainly gone, or None if it may still run."""
        who = _who(holder)
        age, lease_s = time.time() - self._renewed(holder, stat), self._holder_lease_s(holder)
        if age > lease_s:
            return (f"the lease of {who} was last renewed {age:.0f} s ago, past its lease of {lease_s:g} s: "
                    "its holder is lost")
        same_job = self.job is not None and holder.get("job") == self.job
        if same_job and isinstance(holder.get("attempt"), int) and holder["attempt"] < self.attempt:
            return (f"{who} belongs to restart attempt {holder['attempt']} of this job, which torchrun stopped "
                    f"before starting this attempt ({self.attempt})")
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) and not pid_alive(holder["pid"]):
            return f"{who} no longer exists on this host"
        return None

    def _refusal(self, holder: dict, stat: os.stat_result) -> str:
        renewed, lease_s = self._renewed(holder, stat), self._holder_lease_s(holder)
        expires = renewed + lease_s
        remedy = self.remedy.format(pid=holder.get("pid"), host=holder.get("host"), key=self.key)
        return (f"{self.key}={self.directory} is in use by {_who(holder)}{_started(holder)}: its lease was last "
                f"renewed {max(0.0, time.time() - renewed):.0f} s ago, at {_clock(renewed)}, and expires at "
                f"{_clock(expires)} unless renewed again; {self.harm}. {remedy}; if that process is gone, rerun after "
                f"{_clock(expires)} (an unrenewed lease is taken over then), or delete {self.path}.")

    def _claim(self, stale: os.stat_result) -> bool:
        """Put our lease in place of the stale lock `stale`, if no other process claims it first.

        Two processes can judge the same lease stale; unlinking it and creating our own would let each unlink the
        other's new lease. Instead a hard link named after that very file (its inode and modification time) is
        made: a name can be linked only once, so only one process goes on to replace it (os.replace, atomic), and
        one that finds the lock changed since it judged it (renewed, or already replaced) judges it again. Chosen
        over an flock on a sidecar file: flock is advisory and unreliable on the network file systems that run
        directories live on, where link() and rename() are atomic."""
        claim = self.path.with_name(f"{self.path.name}.claim-{stale.st_ino}-{stale.st_mtime_ns}")
        try:
            os.link(self.path, claim)
        except (FileExistsError, FileNotFoundError):
            return False
        except OSError:  # a file system without hard links
            return self._claim_by_rename(stale)
        try:
            if not _same_file(os.stat(claim), stale):
                return False
            self._write()
            return True
        finally:
            claim.unlink(missing_ok=True)

    def _claim_by_rename(self, stale: os.stat_result) -> bool:
        """Where hard links fail: move the lock aside (of two processes renaming the one file, one finds it gone),
        keep it moved only if it is the file judged stale, then create ours where no other did meanwhile."""
        aside = self.path.with_name(f"{self.path.name}.stale-{self.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        if not _same_file(os.stat(aside), stale):
            os.rename(aside, self.path)  # a live lease moved by mistake goes back at once
            return False
        aside.unlink()
        return self._create()

    # --- holding it ---------------------------------------------------------------------------
    def _start(self):
        self.held = True
        self._heartbeat = threading.Thread(target=self._beat, name="out-lock-heartbeat", daemon=True)
        self._heartbeat.start()
        return self

    def _write(self) -> None:
        """Our lease in place of whatever the lock holds, atomically: a reader sees the old lease or the new."""
        tmp = self.path.with_name(f"{self.path.name}.{self.token}.tmp")
        with open(tmp, "w") as fh:
            json.dump(self._lease(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        try:  # the rename itself survives a crash of this host only once the directory is synced
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass  # some file systems refuse to sync a directory; the lease is still in place

    def _beat(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            try:
                if not self._still_ours():
                    return
                self._write()
            except OSError as err:  # a file system hiccup: the next beat tries again, well within the lease
                print(f"[lock] could not renew {self.path}: {err}; trying again in {self.lease_s / 4:g} s",
                      file=sys.stderr, flush=True)

    def _still_ours(self) -> bool:
        """Whether the lock still holds our lease; marks it lost (and says so) where another's replaced it."""
        if self.lost:
            return False
        seen = self._read()
        if seen is None:
            if self._create():  # removed by hand while we ran, and no other process has made one since
                print(f"[lock] {self.path} was removed while this {self.app} held it; written again", file=sys.stderr,
                      flush=True)
                return True
            seen = self._read() or ({}, None)
        holder = seen[0]
        if holder.get("token") == self.token:
            return True
        self.lost, self.taken_by = True, holder
        print(f"[lock] LOST: {self.path} now names {_who(holder)}: this {self.app} stalled past its lease of "
              f"{self.lease_s:g} s and another process took over its {self.key}; {self.lost_consequence()}",
              file=sys.stderr, flush=True)
        return False

    def lost_consequence(self) -> str:
        return "stop this one: the other now writes there."

    def check_held(self) -> None:
        """Raise if another process took the directory over: called before writing to it."""
        if not self.held:
            return
        if self.lost or not self._still_ours():
            raise ConfigError(self.taken_over_message())

    def taken_over_message(self) -> str:
        return (f"{self.key}={self.directory} was taken over by {_who(self.taken_by)} while this {self.app} stalled "
                f"past its lease ({self.lease_s:g} s): this {self.app} stops, so as not to overwrite that one's files.")

    def release(self) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        seen = self._read()
        if seen is not None and seen[0].get("token") == self.token:  # never another process's lock
            self.path.unlink(missing_ok=True)
            self._remove_made()
        self.held = False


@contextmanager
def hold_out_lock(directory, app: str, lease_s: float = DEFAULT_LEASE_S, lock_path=None,
                  remedy: Optional[str] = None) -> Iterator[Optional[OutLock]]:
    """The lease on `directory` for the whole `with` block, taken by global rank 0 only (None on other ranks);
    a refusal (ConfigError) comes before the block runs, so nothing is written."""
    if global_rank() != 0:
        yield None
        return
    lock = OutLock(directory, lease_s, app=app, lock_path=lock_path, remedy=remedy).acquire()
    try:
        yield lock
    finally:
        lock.release()


def _who(holder: dict) -> str:
    job = f" (job {holder.get('job')}, restart attempt {holder.get('attempt')})" if holder.get("job") is not None else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{job}"


def _started(holder: dict) -> str:
    """", a regen started at <time>" as far as the lease says."""
    app, since = holder.get("app"), holder.get("since")
    if not (app or since):
        return ""
    article = ("an " if app[0] in "aeiou" else "a ") if app else ""
    return f", {article + app if app else 'one'}{' started at ' + since if since else ''}"


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    # Each renewal is a new file (os.replace), so inode and modification time name one version of the lease.
    return (a.st_ino, a.st_mtime_ns) == (b.st_ino, b.st_mtime_ns)

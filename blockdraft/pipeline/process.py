"""Each stage as a command in its own process group: the pipeline's stop reaches every process of it
(torchrun's workers, a capture's loader), gives it time to save and stop its servers, and a second
stop kills the group.

A stage dies with the pipeline, however the pipeline ends (SIGKILL and the OOM killer included): Linux sends the
stage SIGTERM when the pipeline goes (its parent-death signal), and a guard process of the stage's stops the rest
of its group the way the pipeline's own stop does (SIGTERM, the grace, then SIGKILL). The guard learns of the
pipeline's death from a pipe whose one writer is the pipeline: the kernel closes it whatever killed the pipeline.
vLLM servers, in groups of their own, have their own parent-death signal from the stage that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional

from blockdraft.vllm_runtime.server import _parent_death_signal, group_members

REPO = Path(__file__).resolve().parents[2]


def say(message: str) -> None:
    print(f"[pipeline] {message}", flush=True)


def stage_environment() -> dict:
    """The pipeline's environment as its stages get it. HF_HUB_OFFLINE passes through: importing blockdraft set
    it to 1 unless the user set it, and a user's HF_HUB_OFFLINE=0 (a hub dataset to download) reaches the stage
    that reads the dataset."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Idle OpenMP threads sleep instead of spinning: with two cores and anything else running,
    # spinning threads made each target forward 3-8x slower (measured: 0.6 s vs 2-5 s per row).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def run_command(argv: List[str], log: Optional[Path] = None) -> int:
    """Runs a stage's command in its own process group; `log`: where its output goes instead of the terminal."""
    say("$ " + " ".join(argv) + (f" > {log}" if log else ""))
    env = stage_environment()
    # Its own process group: a stop is sent to all of it, never to the pipeline itself a second time.
    out = open(log, "w") if log else None
    death_signal = _parent_death_signal()  # None off Linux: the guard then stops the stage itself too

    def own_group_dying_with_us() -> None:  # in the child, before the stage's command starts
        os.setpgrp()
        if death_signal is not None:
            death_signal()

    try:
        stage = subprocess.Popen(argv, cwd=REPO, env=env, preexec_fn=own_group_dying_with_us, stdout=out,
                                 stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()  # the child holds its own copy
    guard = None
    try:
        guard = StageGuard(stage.pid, leader_signalled=death_signal is not None)
        return stage.wait()
    except KeyboardInterrupt:
        stop(stage)
        raise
    finally:
        if guard is not None:
            guard.dismiss()


# A stage stopped by Ctrl-C stops its own vLLM servers and saves what it can first (seconds): it is
# given that long before its group is killed. subprocess.run would kill it after 0.25 s, leaving its servers.
STOP_GRACE_S = 60.0
TERMINATED = {"by_signal": False}  # set by on_sigterm: the pipeline was sent SIGTERM, not the terminal's Ctrl-C


def on_sigterm(_signum, _frame) -> None:
    """The SIGTERM handler of the pipeline's commands: as KeyboardInterrupt, through the running stage's
    stop (which passes the signal on) and the records."""
    TERMINATED["by_signal"] = True
    raise KeyboardInterrupt


def signal_group(stage: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(stage.pid, sig)
    except ProcessLookupError:  # the group has already gone
        pass


def stop(stage: subprocess.Popen) -> None:
    """The stop the pipeline got (Ctrl-C or SIGTERM) goes to the stage's whole group; a second Ctrl-C
    while it cleans up, or STOP_GRACE_S without an end, kills the group."""
    signal_group(stage, signal.SIGTERM if TERMINATED["by_signal"] else signal.SIGINT)
    try:
        stage.wait(timeout=STOP_GRACE_S)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        signal_group(stage, signal.SIGKILL)
        stage.wait()


# The guard: one per running stage, in a session of its own (a Ctrl-C to the pipeline's terminal is not its
# business). It blocks reading the pipe; a byte is the pipeline's "the stage is over" (it leaves at once), an end of
# file its death: the rest of the stage's group gets SIGTERM (and SIGCONT, should it be stopped), its leader has
# its parent-death SIGTERM already (one SIGTERM each: a second one could cut short torchrun's own stop of its
# workers), and whatever of the group is left after the grace is killed.
def guard_stage(group: int, fd: int, grace_s: float, leader_signalled: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        said = os.read(fd, 1)
    except OSError:
        said = b""
    if said:
        return
    for pid in group_members(group):
        if pid != group or not leader_signalled:
            _signal(pid, signal.SIGTERM)
    _signal_group(group, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_members(group):
        _signal_group(group, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


class StageGuard:
    """Stops the stage's group should the pipeline die while the stage runs (`guard_stage`)."""

    def __init__(self, group: int, leader_signalled: bool):
        read, self._write = os.pipe()  # neither end inherited by the stage, started before; the guard gets `read`
        code = ("import sys; from blockdraft.pipeline.process import guard_stage; a = sys.argv; "
                "guard_stage(int(a[1]), int(a[2]), float(a[3]), a[4] == '1')")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code, str(group), str(read), str(STOP_GRACE_S), str(int(leader_signalled))],
                cwd=REPO, pass_fds=(read,), stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(read)

    def dismiss(self) -> None:
        """The stage is over (or stopped by the pipeline itself): the guard leaves without a signal."""
        try:
            os.write(self._write, b"x")
        except OSError:  # the guard has gone already
            pass
        os.close(self._write)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class StageFailed(Exception):
    def __init__(self, stage: str, code: int, fix: str):
        super().__init__(f"the {stage} stage failed (exit {code}); {fix}")
        self.code = code


def command_stage(name: str, argv: List[str], fix: str) -> Callable[[], bool]:
    def run() -> bool:
        code = run_command(argv)
        if code != 0:
            raise StageFailed(name, code, fix)
        return True

    return run


def readable_result(path: Path) -> Optional[dict]:
    """A stage's result file (a verdict, a report) as a dict; None when it is missing or unreadable (torn by a
    full disk, or cut short): such a stage is not done, and its rerun writes the file again."""
    import json

    try:
        value = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None

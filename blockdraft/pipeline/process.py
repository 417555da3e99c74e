"""Each stage as a command in its own process group: the pipeline's stop reaches every process of it
(torchrun's workers, a capture's loader), gives it time to save and stop its servers, and a second
stop kills the group."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Callable, List, Optional

REPO = Path(__file__).resolve().parents[2]


def say(message: str) -> None:
    print(f"[pipeline] {message}", flush=True)


def run_command(argv: List[str], log: Optional[Path] = None) -> int:
    """Runs a stage's command in its own process group; `log`: where its output goes instead of the terminal."""
    say("$ " + " ".join(argv) + (f" > {log}" if log else ""))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    # Idle OpenMP threads sleep instead of spinning: with two cores and anything else running,
    # spinning threads made each target forward 3-8x slower (measured: 0.6 s vs 2-5 s per row).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Its own process group: a stop is sent to all of it, never to the pipeline itself a second time.
    out = open(log, "w") if log else None
    try:
        stage = subprocess.Popen(argv, cwd=REPO, env=env, preexec_fn=os.setpgrp, stdout=out,
                                 stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()  # the child holds its own copy
    try:
        return stage.wait()
    except KeyboardInterrupt:
        stop(stage)
        raise


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

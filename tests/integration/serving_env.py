"""`serving_run(argv, ...)`: `subprocess.run([.venv-serve/bin/python, *argv], ...)` for the checks that run vLLM's
own code on our exports, through one worker that has imported vLLM once (tests/integration/serving_worker.py).

Each check used to start its own interpreter and pay vLLM's import, about 6 s here and more on slower CPUs;
the worker forks a child per check, already imported, so a check costs what it computes. A child starts
from the worker's state after the import, never from another check's, so each check runs as in a fresh
process. vLLM servers are still real processes of their own (VllmServer); this is for the checks only.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[2]
SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
WORKER = Path(__file__).with_name("serving_worker.py")
STARTUP_TIMEOUT_S = 300.0

class _Worker:
    """The detached worker: its pipes, its pid (it is no child of ours: see serving_worker.main) and its log."""

    def __init__(self, stdin, stdout, pid: int, log_path: str):
        self.stdin, self.stdout, self.pid, self.log_path = stdin, stdout, pid, log_path

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def stop(self) -> None:
        try:
            os.killpg(os.getpgid(self.pid), signal.SIGKILL)  # the worker and a check still running in its child
        except ProcessLookupError:
            pass


_worker: Optional[_Worker] = None


def _start() -> _Worker:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    # Its own output to a file: a pipe nobody reads would fill with vLLM's import warnings and block it.
    log = open(Path(tempfile.gettempdir()) / f"serving_worker.{os.getpid()}.log", "w")
    starter = subprocess.Popen([str(SERVE_PYTHON), str(WORKER), "--detach"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=log, text=True, env=env, cwd=REPO, start_new_session=True)
    starter.wait()  # it forks the worker and exits; the worker keeps the pipes
    ready = _read_line(starter.stdout, STARTUP_TIMEOUT_S)
    if ready is None or not json.loads(ready).get("ready"):
        raise RuntimeError(f"the serving-env worker did not start: {Path(log.name).read_text()[-3000:]}")
    worker = _Worker(starter.stdin, starter.stdout, json.loads(ready)["pid"], log.name)
    atexit.register(worker.stop)
    return worker


def _read_line(stream, timeout_s: float) -> Optional[str]:
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    try:
        if not selector.select(timeout_s):
            return None
        line = stream.readline()
        return line or None
    finally:
        selector.close()


def serving_run(argv: List[str], cwd, env: Optional[dict] = None, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """Run `.venv-serve/bin/python *argv` in `cwd` with `env` (default: this process's) through the worker;
    returns what subprocess.run(..., capture_output=True, text=True) would. Raises TimeoutExpired past
    `timeout` (the worker and its check are killed; the next call starts a new one)."""
    global _worker
    if _worker is None or not _worker.alive():
        _worker = _start()
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        request = {"argv": [str(a) for a in argv], "cwd": str(cwd), "env": dict(os.environ if env is None else env),
                   "stdout": str(out), "stderr": str(err)}
        _worker.stdin.write(json.dumps(request) + "\n")
        _worker.stdin.flush()
        reply = _read_line(_worker.stdout, timeout)
        if reply is None:
            died = not _worker.alive()
            _worker.stop()
            if died:
                raise RuntimeError(f"the serving-env worker died: {Path(_worker.log_path).read_text()[-3000:]}")
            raise subprocess.TimeoutExpired([str(SERVE_PYTHON), *request["argv"]], timeout)
        code = json.loads(reply)["returncode"]
        return subprocess.CompletedProcess([str(SERVE_PYTHON), *request["argv"]], code,
                                           out.read_text(errors="replace") if out.exists() else "",
                                           err.read_text(errors="replace") if err.exists() else "")

"""The fault suite's shared parts: launching and killing training runs, and the result log.

Every test injects one fault, checks what survived, and records a row (fault, what
survived, what was lost, recovery seconds) to the JSON-lines file named by
BLOCKDRAFT_FAULT_LOG; `scripts/fault_report.py` turns those rows into docs/reliability.md.
BLOCKDRAFT_FAULT_REPEAT=N runs every fault N times (`make test-faults` uses 3); the
repeats beyond the first are marked slow, so `make test` injects each fast fault once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from blockdraft.integrity import verify_checksums
from blockdraft.train.checkpoint import complete_checkpoints
from blockdraft.train.logger import read_metrics
from tests.integration.conftest import tiny_overrides

REPO = Path(__file__).resolve().parents[2]
LOG_ENV, REPEAT_ENV = "BLOCKDRAFT_FAULT_LOG", "BLOCKDRAFT_FAULT_REPEAT"
# Resolved now: the tests change directory, the log must not move with them.
LOG = Path(os.environ[LOG_ENV]).absolute() if os.environ.get(LOG_ENV) else None
REPEAT = int(os.environ.get(REPEAT_ENV) or 1)
SESSION_START = time.time()

# One short run shape for every kill: checkpoints at 10, 20, 30, 40; validation at 20 and 40.
MAX_STEPS = 40
LOG_EVERY = 5
TRAIN_ARGS = (f"train.max_steps={MAX_STEPS}", "train.save_every=10", f"train.log_every={LOG_EVERY}",
              "train.keep_last=10", "train.val_every=20")
WEIGHT_TOL = dict(rtol=1e-4, atol=1e-6)  # resumed vs uninterrupted: the same math, summed in the same order
WAIT_S = 300  # a stalled child fails the test instead of hanging the suite


def pytest_generate_tests(metafunc):
    if "rep" in metafunc.fixturenames:
        metafunc.parametrize("rep", [pytest.param(i, marks=[pytest.mark.slow] if i else [], id=f"rep{i}") for i in range(REPEAT)])


def pytest_sessionfinish(session, exitstatus):
    if LOG is not None:
        _append({"summary": True, "collected": session.testscollected, "failed": session.testsfailed,
                 "exitstatus": int(exitstatus), "seconds": round(time.time() - SESSION_START, 1),
                 "repeat": REPEAT, "args": sys.argv[1:]})


def _append(row: dict) -> None:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(LOG, "a") as fh:
        fh.write(json.dumps(row) + "\n")


@pytest.fixture
def record(request):
    """record(fault, survived, lost, recovery_s, how): one row per injection; lost [] = nothing."""

    def write(fault: str, survived: str, lost: list, recovery_s: float, how: str) -> None:
        if LOG is not None:
            _append({"fault": fault, "injections": 1, "survived": survived, "lost": list(lost),
                     "recovery_s": round(recovery_s, 2), "how": how, "test": request.node.nodeid})

    return write


# --- training runs in a subprocess ---------------------------------------------------------
class Run:
    """A `python -m blockdraft.train` child in its own session, its output in a file."""

    def __init__(self, run_dir: Path, *args: str, fault: str | None = None, log_name: str = "train"):
        self.run_dir = Path(run_dir)
        self.log = self.run_dir.parent / f"{self.run_dir.name}.{log_name}.log"
        self.mark = self.run_dir.parent / f"{self.run_dir.name}.{log_name}.mark"
        self.mark.unlink(missing_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "BLOCKDRAFT_FAULT_MARK": str(self.mark)}
        env.pop("BLOCKDRAFT_FAULT", None)
        if fault:
            env["BLOCKDRAFT_FAULT"] = fault
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "blockdraft.train", *tiny_overrides(self.run_dir, *args)],
                                         cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, predicate, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(f"the run exited ({self.proc.returncode}) before {what}:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {what} within {WAIT_S} s:\n{self.output()[-3000:]}")
            time.sleep(0.02)

    def wait_mark(self) -> None:
        """Until the injected point is reached (the child is then paused there)."""
        self.wait_for(lambda: self.mark.exists() and self.mark.read_text().strip(), "the fault point")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the whole session: nothing of it may finish its write
        self.proc.wait()

    def finish(self, timeout: float = WAIT_S) -> int:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the run did not finish within {timeout} s:\n{self.output()[-3000:]}")
        self.seconds = time.monotonic() - self.started
        return self.proc.returncode


def run_to_end(run_dir: Path, *args: str) -> Run:
    run = Run(run_dir, *args, log_name="resume" if "resume=auto" in args else "train")
    code = run.finish()
    assert code == 0, f"exit {code}:\n{run.output()[-3000:]}"
    return run


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Path:
    """The uninterrupted run every killed-and-resumed run must reproduce."""
    return run_to_end(tmp_path_factory.mktemp("reference") / "run", *TRAIN_ARGS).run_dir


# --- what a run directory holds -----------------------------------------------------------
def train_losses(run_dir: Path) -> dict:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "split" not in r}


def raw_metric_lines(run_dir: Path) -> list:
    path = run_dir / "metrics.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def inspect_killed(run_dir: Path) -> tuple[list, list]:
    """(what is there, what is wrong) right after a kill, before anything recovers it."""
    found, problems = [], []
    for ckpt in complete_checkpoints(run_dir):
        try:
            verify_checksums(ckpt)
            found.append(ckpt.name)
        except Exception as err:  # a complete-looking checkpoint that does not verify would be picked
            problems.append(f"{ckpt.name} looks complete but does not verify: {err}")
    partial = sorted(p.name for pattern in ("*.tmp", "*.old") for p in (run_dir / "checkpoints").glob(pattern)) \
        if (run_dir / "checkpoints").is_dir() else []
    lines = raw_metric_lines(run_dir)
    bad = [i for i, line in enumerate(lines) if not _parses(line)]
    if bad and bad != [len(lines) - 1]:
        problems.append(f"metrics.jsonl has unreadable lines other than the last: {bad}")
    survived = [f"checkpoints {', '.join(found) or 'none'}"]
    if partial:
        survived.append(f"unfinished or set aside: {', '.join(partial)}")
    whole = len(lines) - len(bad)
    survived.append(f"{whole} metrics line{'' if whole == 1 else 's'}" + (" (+1 torn, skipped and reported)" if bad else ""))
    return survived, problems


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def compare_with_reference(run_dir: Path, reference: Path, resumed_from: int) -> tuple[str, list]:
    """(how close, what differs): the final weights and every logged training loss.

    A line logged just after the resume point averages fewer steps than the uninterrupted
    run's (the steps before the resume were logged by the killed run), so only its presence
    is compared; a line at the resume step itself is the stopped run's last partial window."""
    problems = []
    final = run_dir / "checkpoints" / f"step_{MAX_STEPS}"
    if not (final / "model.safetensors").exists():
        return "no final checkpoint", [f"{final} is missing after the resume"]
    got, want = load_file(str(final / "model.safetensors")), load_file(str(reference / "checkpoints" / f"step_{MAX_STEPS}" / "model.safetensors"))
    diff = max((got[k] - want[k]).abs().max().item() for k in want) if set(got) == set(want) else float("inf")
    scale = max(w.abs().max().item() for w in want.values())
    if diff > WEIGHT_TOL["atol"] + WEIGHT_TOL["rtol"] * scale:
        problems.append(f"final weights differ from the uninterrupted run by {diff:.3g}")
    losses, ref_losses = train_losses(run_dir), train_losses(reference)
    missing = sorted(set(ref_losses) - set(losses))
    extra = sorted(set(losses) - set(ref_losses) - {resumed_from})
    if missing or extra:
        problems.append(f"logged steps differ from the uninterrupted run's: missing {missing}, extra {extra}")
    straddling = {s for s in ref_losses if s - LOG_EVERY < resumed_from < s}
    differing = [s for s in ref_losses if s in losses and s not in straddling
                 and abs(losses[s] - ref_losses[s]) > 1e-4 * max(1.0, abs(ref_losses[s]))]
    if differing:
        problems.append(f"logged losses differ from the uninterrupted run at steps {differing}")
    leftovers = sorted(p.name for pattern in ("*.tmp", "*.old") for p in (run_dir / "checkpoints").glob(pattern))
    if leftovers:
        problems.append(f"half-written checkpoints left after the resume: {leftovers}")
    return f"final weights = uninterrupted run (max |diff| {diff:.1e}); {len(losses)} logged steps match", problems

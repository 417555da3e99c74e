"""A run of several ranks never hangs: every collective is entered by every rank as often, a rank waits on
another's long chore as long as that rank is alive, and an error on one rank ends every rank with its message.

Three gloo ranks (an uneven split) with process-group timeouts of seconds, so that a hang fails fast."""

import contextlib
import io
import os
import signal
import threading
import time

import pytest

from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO, tiny_overrides
from tests.integration.test_train_tiny import _launch

# 16 validation rows one a batch over 3 ranks: 6, 5 and 5 batches. Timeouts of seconds: a hang fails fast.
FAST_FAIL = ["distributed.timeout_s=3", "distributed.startup_timeout_s=20"]
SHORT = ["train.max_steps=2", "train.micro_batch_size=1", "train.log_every=1", "train.save_every=0"]
QUIET = {"OMP_WAIT_POLICY": "PASSIVE"}


def _three_ranks(run_dir, *args, env=None):
    proc = _launch([*SHORT, *FAST_FAIL, *args], run_dir, nproc=3, extra_env={**QUIET, **(env or {})})
    return _finish(proc)


def _finish(proc, timeout=180):
    """(exit status, output) of a launch; a launch that hangs fails the test, every process of it killed."""
    killer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))  # torchrun and every rank
    killer.start()
    try:
        out = proc.stdout.read().decode(errors="replace")
        proc.wait()
    finally:
        hung = not killer.is_alive()
        killer.cancel()
    if hung:
        pytest.fail(f"the 3-rank run hung for {timeout} s:\n{out[-3000:]}")
    return proc.returncode, out


def _one_process(run_dir, *args):
    """`blockdraft train` on one rank in this process: (exit status, output)."""
    from blockdraft import cli

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        mp.chdir(REPO)
        mp.delenv("BLOCKDRAFT_FAULT", raising=False)
        code = cli.main(["train", *tiny_overrides(run_dir, *args)])
    return code, out.getvalue()


def _val(run_dir):
    rows = [r for r in read_metrics(run_dir) if r.get("split") == "val"]
    assert len(rows) == 1, rows
    return rows[0]


def _same_metrics(got: dict, want: dict):
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-5), key
        elif key != "step":
            assert got[key] == pytest.approx(value, abs=1e-4), key


@pytest.fixture(scope="module")
def two_val_rows(tmp_path_factory):
    """Fewer validation rows than ranks: the first 2 of the recipe's held-out rows."""
    path = tmp_path_factory.mktemp("val") / "val2.jsonl"
    lines = (REPO / ".cache" / "tiny_cpu" / "val.jsonl").read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n")
    return path


def _same_validation_as_one_process(three, tmp_path, *val):
    # One process accumulating the same global batch (3 rows a step) meets the same rows and anchors.
    code, alone = _one_process(tmp_path / "one", *SHORT, "train.grad_accum=3", *val)
    assert code == 0, alone[-3000:]
    _same_metrics(_val(three), _val(tmp_path / "one"))


def test_uneven_validation_over_a_sharded_target_and_a_rank_0_chore_longer_than_the_timeout(tmp_path):
    """16 validation rows on 3 ranks under distributed.target_sharding=fsdp (each batch's forward all-gathers every
    layer, on every rank alike), and rank 0 writing its first checkpoint for 5 s while the others wait behind it, with
    collectives timing out after 3 s: the run finishes, with one process's validation metrics."""
    code, out = _three_ranks(tmp_path / "three", "distributed.target_sharding=fsdp", "train.save_every=1",
                             env={"BLOCKDRAFT_FAULT": "checkpoint.after_weights:sleep=5"})
    assert code == 0, out[-3000:]
    assert out.count("[fault] checkpoint.after_weights: sleep") == 1 and out.count("[train] done") == 3, out[-3000:]
    assert [r["step"] for r in read_metrics(tmp_path / "three") if "split" not in r] == [1, 2]
    _same_validation_as_one_process(tmp_path / "three", tmp_path)


def test_fewer_validation_rows_than_ranks_under_a_sharded_draft(two_val_rows, tmp_path):
    """2 validation rows on 3 ranks under train.draft_sharding=fsdp: the third rank runs only a stand-in batch."""
    code, out = _three_ranks(tmp_path / "three", "train.draft_sharding=fsdp", f"data.val={two_val_rows}")
    assert code == 0, out[-3000:]
    _same_validation_as_one_process(tmp_path / "three", tmp_path, f"data.val={two_val_rows}")


def test_an_error_on_rank_0_alone_ends_every_rank_with_its_message(tmp_path):
    """rank 0 alone refuses a run_dir that holds another run; ranks 1 and 2 are on their way to their next
    collective. With the collective timeout at 10 minutes, they stop within seconds, saying why."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    proc = _launch([*SHORT, "distributed.timeout_s=600", "distributed.startup_timeout_s=600"], run_dir, nproc=3,
                   extra_env=QUIET)
    said_at = []
    killer = threading.Timer(180, lambda: os.killpg(proc.pid, signal.SIGKILL))
    killer.start()
    lines = []
    for raw in proc.stdout:
        lines.append(raw.decode(errors="replace"))
        if not said_at and "already holds a run" in lines[-1]:
            said_at.append(time.monotonic())
    proc.wait()
    ended = time.monotonic()
    killer.cancel()
    out = "".join(lines)
    assert proc.returncode != 0, out[-3000:]
    assert said_at and ended - said_at[0] < 30, out[-3000:]
    assert "[train] done" not in out
    # Every rank says the reason: rank 0 its own, the others rank 0's.
    assert out.count("rank 0 failed: ConfigError: run_dir") >= 2, out[-3000:]
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'  # nothing of the other run touched


def test_an_error_on_one_rank_inside_the_loop_ends_the_ranks_blocked_in_a_collective(tmp_path):
    """Rank 1 raises after its second backward; ranks 0 and 2 are already in the step's next all-reduce, where
    no exception can reach them. With the collective timeout at 10 minutes they end within seconds, saying why."""
    started = time.monotonic()
    proc = _launch([*SHORT, "train.max_steps=4", "distributed.timeout_s=600", "distributed.startup_timeout_s=600"],
                   tmp_path / "run", nproc=3,
                   extra_env={**QUIET, "BLOCKDRAFT_FAULT": "train.after_backward@2~rank=1:raise"})
    _, out = _finish(proc)
    assert proc.returncode != 0, out[-3000:]
    assert time.monotonic() - started < 90, out[-3000:]  # start-up included; a timeout would take 600 s
    for rank in (0, 2):
        assert f"[rank {rank}] stopping: rank 1 failed: FaultInjected" in out, out[-3000:]

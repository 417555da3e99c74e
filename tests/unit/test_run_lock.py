"""The run directory's lease: refused while its holder renews it, taken over once the holder is certainly gone
(expired on any host, an earlier restart attempt of this job, a dead pid here), and raced for by one winner."""

import json
import multiprocessing
import os
import socket
import time

import pytest

from blockdraft.errors import ConfigError
from blockdraft.train import run_lock
from blockdraft.train.run_lock import RunLock

DEAD_PID = 2**22 + 12345  # above Linux's pid_max default: no such process


@pytest.fixture(autouse=True)
def no_job(monkeypatch):
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)


def write_lease(run_dir, age_s=0.0, host="node-7", pid=4242, job="job-a", attempt=0, lease_s=120.0):
    """A lease as another run's rank 0 writes it, last renewed `age_s` ago."""
    run_dir.mkdir(parents=True, exist_ok=True)
    renewed = time.time() - age_s
    lease = {"host": host, "pid": pid, "job": job, "attempt": attempt, "token": "theirs", "lease_s": lease_s,
             "since": "earlier", "renewed": renewed, "renewed_at": "then"}
    (run_dir / ".lock").write_text(json.dumps(lease))
    return lease


def holder(run_dir) -> dict:
    return json.loads((run_dir / ".lock").read_text())


def test_a_live_lease_of_another_host_is_refused_naming_its_holder_and_expiry(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-b")
    lease = write_lease(tmp_path, age_s=1.0)
    with pytest.raises(ConfigError) as err:
        RunLock(tmp_path, lease_s=120.0).acquire()
    said = str(err.value)
    assert "in use by pid 4242 on node-7 (job job-a, restart attempt 0)" in said
    assert "last renewed 1 s ago" in said
    assert f"expires at {run_lock._clock(lease['renewed'] + 120)}" in said
    assert "Use another run_dir" in said and f"delete {tmp_path / '.lock'}" in said
    assert holder(tmp_path) == lease  # untouched


def test_an_expired_lease_is_taken_over_from_any_host(tmp_path, capsys):
    write_lease(tmp_path, age_s=150.0)
    lock = RunLock(tmp_path, lease_s=120.0).acquire()
    try:
        line = capsys.readouterr().out
        assert "taking over" in line and "pid 4242 on node-7 (job job-a, restart attempt 0)" in line
        assert "last renewed 150 s ago, past its lease of 120 s" in line
        mine = holder(tmp_path)
        assert (mine["host"], mine["pid"], mine["token"]) == (socket.gethostname(), os.getpid(), lock.token)
    finally:
        lock.release()
    assert not (tmp_path / ".lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no claim or temporary file left


def test_an_expired_lease_is_judged_by_its_holders_lease_s(tmp_path):
    """A holder that renews every 150 s of its 600 s lease is not lost after 200 s, whatever this run's lease_s."""
    write_lease(tmp_path, age_s=200.0, lease_s=600.0)
    with pytest.raises(ConfigError, match="in use by pid 4242"):
        RunLock(tmp_path, lease_s=120.0).acquire()


def test_this_jobs_lease_from_an_earlier_restart_attempt_is_taken_over(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    write_lease(tmp_path, job="job-a", attempt=0)  # renewed just now, on another host
    lock = RunLock(tmp_path).acquire()
    lock.release()
    assert "belongs to restart attempt 0 of this job" in capsys.readouterr().out
    # The same attempt, or a later one, may still run: refused.
    for attempt in (1, 2):
        write_lease(tmp_path, job="job-a", attempt=attempt)
        with pytest.raises(ConfigError, match=f"restart attempt {attempt}\\)"):
            RunLock(tmp_path).acquire()


def test_torchruns_default_id_names_no_job(monkeypatch):
    """Without --rdzv-id every torchrun job's id is "none": it must not make two jobs one."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert run_lock.job_id() is None
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert run_lock.job_id() == "77"


def test_a_dead_pid_of_this_host_is_taken_over_at_once(tmp_path, capsys):
    write_lease(tmp_path, host=socket.gethostname(), pid=DEAD_PID, job=None)
    RunLock(tmp_path).acquire().release()
    assert f"pid {DEAD_PID} on {socket.gethostname()} no longer exists on this host" in capsys.readouterr().out


def test_the_heartbeat_renews_the_lease_so_it_never_expires(tmp_path):
    lock = RunLock(tmp_path, lease_s=0.4).acquire()
    try:
        first = holder(tmp_path)["renewed"]
        time.sleep(0.6)  # past lease_s: only renewals keep it live
        assert holder(tmp_path)["renewed"] > first + 0.2
        with pytest.raises(ConfigError, match=f"in use by pid {os.getpid()}"):
            RunLock(tmp_path, lease_s=0.4).acquire()
        lock.check_held()  # still ours
    finally:
        lock.release()
    assert not (tmp_path / ".lock").exists()


def test_a_lock_taken_over_while_this_run_stalled_is_lost(tmp_path, capfd):
    lock = RunLock(tmp_path, lease_s=0.4).acquire()
    write_lease(tmp_path)  # another run took it over (this one stalled past its lease)
    deadline = time.time() + 2
    while not lock.lost and time.time() < deadline:
        time.sleep(0.02)
    assert lock.lost, "the heartbeat did not notice the takeover"
    assert "LOST" in capfd.readouterr().err
    with pytest.raises(ConfigError, match="was taken over by pid 4242 on node-7.*stops without saving"):
        lock.check_held()
    lock.release()
    assert holder(tmp_path)["token"] == "theirs"  # its lease stays
    # Between heartbeats too: check_held reads the lock itself.
    (tmp_path / ".lock").unlink()
    slow = RunLock(tmp_path, lease_s=120.0).acquire()
    write_lease(tmp_path)
    with pytest.raises(ConfigError, match="was taken over"):
        slow.check_held()
    slow.release()


def _contend(run_dir, start, done, results, hard_links):
    if not hard_links:  # a file system that refuses hard links: the takeover moves the lock aside instead
        def refuse(*_):
            raise PermissionError(1, "Operation not permitted")
        run_lock.os.link = refuse
    start.wait()
    try:
        lock = RunLock(run_dir).acquire()
    except ConfigError as err:
        results.put(("refused", os.getpid(), str(err)))
        return
    results.put(("won", os.getpid(), ""))
    done.wait(10)  # held while the other run decides
    lock.release()


@pytest.mark.parametrize("hard_links", [True, False], ids=["link", "rename"])
def test_two_runs_racing_for_an_expired_lease_one_wins(tmp_path, hard_links):
    ctx = multiprocessing.get_context("fork")
    for round_ in range(4):
        run_dir = tmp_path / f"r{round_}"
        write_lease(run_dir, age_s=500.0)
        start, done, results = ctx.Barrier(2), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_contend, args=(run_dir, start, done, results, hard_links)) for _ in range(2)]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=10) for _ in procs)
        winners = [g for g in got if g[0] == "won"]
        assert len(winners) == 1, got
        (_, loser, said), (_, winner, _) = got
        assert f"in use by pid {winner}" in said or "taking it at the same time" in said, said
        assert holder(run_dir)["pid"] == winner
        done.set()
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
        assert not (run_dir / ".lock").exists()
        assert sorted(p.name for p in run_dir.iterdir()) == []

"""Every app's lock on its out (blockdraft/out_lock.py): a second process refused naming the holder, a stale lock
taken over by exactly one of the processes racing for it, only global rank 0 taking it, nothing left behind."""

import json
import multiprocessing
import os
import socket
import threading
import time

import pytest

from blockdraft import out_lock
from blockdraft.errors import ConfigError
from blockdraft.out_lock import OutLock, beside, hold_out_lock

DEAD_PID = 2**22 + 12345  # above Linux's pid_max default: no such process


@pytest.fixture(autouse=True)
def no_job(monkeypatch):
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "RANK"):
        monkeypatch.delenv(name, raising=False)


def stale_lease(path, how: str) -> None:
    """A lock its holder left: `dead` a pid of this host that no longer exists, `expired` unrenewed past its lease."""
    path.parent.mkdir(parents=True, exist_ok=True)
    host, pid, age = (socket.gethostname(), DEAD_PID, 1.0) if how == "dead" else ("node-7", 4242, 500.0)
    path.write_text(json.dumps({"host": host, "pid": pid, "app": "regen", "job": None, "attempt": 0, "token": "theirs",
                                "lease_s": 120.0, "since": "then", "renewed": time.time() - age}))


def test_a_second_process_is_refused_naming_the_holder_and_what_to_do(tmp_path):
    out = tmp_path / "regen"
    remedy = "Wait for that regen to end, or stop it (kill {pid} on {host}); use another out="
    with OutLock(out, app="regen", remedy=remedy):
        lease = json.loads((out / ".lock").read_text())
        assert (lease["host"], lease["pid"], lease["app"]) == (socket.gethostname(), os.getpid(), "regen")
        with pytest.raises(ConfigError) as err:
            OutLock(out, app="regen", remedy=remedy).acquire()
    said = str(err.value)
    assert f"out={out} is in use by pid {os.getpid()} on {socket.gethostname()}, a regen started at {lease['since']}" in said
    assert f"kill {os.getpid()} on {socket.gethostname()}" in said and f"delete {out / '.lock'}" in said
    assert not out.exists()  # made for the lock alone: removed with it


def test_the_refused_process_leaves_the_holders_directory_as_it_was(tmp_path):
    out = tmp_path / "store"
    out.mkdir()
    (out / "index.json").write_text("{}")
    with OutLock(out, lock_path=beside(out), app="capture"):
        with pytest.raises(ConfigError, match="a capture started at"):
            OutLock(out, lock_path=beside(out), app="capture").acquire()
        assert sorted(p.name for p in out.iterdir()) == ["index.json"]  # beside: nothing of the lock inside
        assert beside(out) == tmp_path / "store.lock" and beside(out).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def _contend(path, start, done, results):
    start.wait()
    try:
        lock = OutLock(path.parent, lock_path=path, app="export").acquire()
    except ConfigError as err:
        results.put(("refused", os.getpid(), str(err)))
        return
    results.put(("won", os.getpid(), ""))
    done.wait(10)  # held while the others decide
    lock.release()


@pytest.mark.parametrize("how", ["dead", "expired"])
def test_processes_racing_for_a_stale_lock_exactly_one_takes_it(tmp_path, how):
    """Four processes judge the same stale lock at the same moment: one replaces it, each other one sees the
    winner's live lease and is refused naming it; none unlinks another's lease."""
    ctx = multiprocessing.get_context("fork")
    for round_ in range(3):
        path = tmp_path / f"r{round_}" / "export.lock"
        stale_lease(path, how)
        start, done, results = ctx.Barrier(4), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_contend, args=(path, start, done, results)) for _ in range(4)]
        for p in procs:
            p.start()
        got = [results.get(timeout=20) for _ in procs]
        winners = [pid for what, pid, _ in got if what == "won"]
        assert len(winners) == 1, got
        for what, _, said in got:
            if what == "refused":
                assert f"in use by pid {winners[0]}" in said or "taking it at the same time" in said, said
        assert json.loads(path.read_text())["pid"] == winners[0]
        done.set()
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
        assert sorted(p.name for p in path.parent.iterdir()) == []  # no claim, aside or temporary file left


def test_threads_racing_for_a_stale_lock_exactly_one_takes_it(tmp_path):
    """The same within one process (its threads are told apart by their tokens)."""
    path = tmp_path / ".lock"
    for _ in range(5):
        stale_lease(path, "dead")
        start, won, refused = threading.Barrier(6), [], []

        def contend():
            start.wait()
            try:
                won.append(OutLock(tmp_path).acquire())
            except ConfigError as err:
                refused.append(str(err))

        threads = [threading.Thread(target=contend) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert len(won) == 1 and len(refused) == 5, (won, refused)
        assert json.loads(path.read_text())["token"] == won[0].token
        won[0].release()
        assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_only_global_rank_zero_takes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with hold_out_lock(tmp_path / "store", "capture", lock_path=beside(tmp_path / "store")) as lock:
        assert lock is None and not beside(tmp_path / "store").exists()
    monkeypatch.setenv("RANK", "0")
    with hold_out_lock(tmp_path / "store", "capture", lock_path=beside(tmp_path / "store")) as lock:
        assert lock.held and beside(tmp_path / "store").is_file()
    assert not beside(tmp_path / "store").exists()


def test_a_refusal_inside_the_block_releases_the_lock(tmp_path):
    with pytest.raises(ConfigError, match="bad key"):
        with hold_out_lock(tmp_path / "out", "regen"):
            raise ConfigError("bad key")
    assert not (tmp_path / "out").exists()
    # and the next run takes it at once
    with hold_out_lock(tmp_path / "out", "regen") as lock:
        assert lock.held


def test_a_stale_lock_of_a_dead_holder_is_taken_over_saying_so(tmp_path, capsys):
    stale_lease(tmp_path / ".lock", "dead")
    OutLock(tmp_path, app="pipeline").acquire().release()
    assert f"pid {DEAD_PID} on {socket.gethostname()} no longer exists on this host" in capsys.readouterr().out
    assert out_lock.LOCK_NAME == ".lock"

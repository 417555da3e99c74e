"""The pipeline's stage runner with stand-in stages (each writes a file): what is cached, continued, moved
aside or run again, and how a node of rank > 0 follows node 0's records."""

import json
import threading
import time

import pytest

from blockdraft.pipeline.records import StageRecords, stage_key
from blockdraft.pipeline.runner import NodeZeroFailed, Stage, run_stages


class Stand:
    """A stage that writes <root>/<name>/made.txt, counting its runs."""

    def __init__(self, root, name, extent=None, joined=False, resume_inputs=None, **inputs):
        self.root, self.name, self.runs = root, name, 0
        self.artifact = root / name
        self.stage = Stage(name, inputs or {"n": name}, self.run, lambda: (self.artifact / "made.txt").is_file(),
                           self.artifact, moves=self.artifact, extent=extent, joined=joined, resume_inputs=resume_inputs)

    def run(self):
        self.runs += 1
        self.artifact.mkdir(parents=True, exist_ok=True)
        (self.artifact / "made.txt").write_text(f"run {self.runs}")
        return True


def superseded(root):
    return sorted(p.name.rsplit("-", 2)[0] for p in (root / "superseded").iterdir()) if (root / "superseded").exists() else []


def go(root, stands, force=(), **kw):
    return run_stages([s.stage for s in stands], StageRecords(root / "stages.json"), list(force), root, **kw)


def test_unchanged_inputs_are_cached_and_nothing_moves(tmp_path, capsys):
    a, b = Stand(tmp_path, "a"), Stand(tmp_path, "b")
    go(tmp_path, [a, b])
    assert go(tmp_path, [a, b]) == {} and (a.runs, b.runs) == (1, 1)
    assert capsys.readouterr().out.count(": cached (") == 2 and superseded(tmp_path) == []


def test_changed_settings_move_the_old_artifact_aside_with_its_record(tmp_path, capsys):
    go(tmp_path, [Stand(tmp_path, "a"), Stand(tmp_path, "b")])
    changed = Stand(tmp_path, "a", lr=1)
    later = Stand(tmp_path, "b")
    go(tmp_path, [changed, later])
    out = capsys.readouterr().out
    assert (changed.runs, later.runs) == (1, 1)  # both run again: b read the a that is now superseded
    assert superseded(tmp_path) == ["a", "b"]
    kept = next((tmp_path / "superseded").glob("a-*"))
    assert (kept / "a" / "made.txt").read_text() == "run 1"  # the earlier artifact, whole
    record = json.loads((kept / "record.json").read_text())
    assert record["why"] == "its settings changed" and record["record"]["done"] is True
    assert "a: its settings changed; the earlier a/" in out and f"rm -r {kept}" in out
    assert "b: a stage before it made its output again" in out


def test_force_runs_the_stage_again_and_keeps_the_old_one_aside(tmp_path):
    go(tmp_path, [Stand(tmp_path, "a"), Stand(tmp_path, "b")])
    a, b = Stand(tmp_path, "a"), Stand(tmp_path, "b")
    go(tmp_path, [a, b], force=["b"])
    assert (a.runs, b.runs) == (0, 1) and superseded(tmp_path) == ["b"]


def test_a_larger_extent_continues_in_place_and_a_smaller_one_is_past_it(tmp_path, capsys):
    go(tmp_path, [Stand(tmp_path, "train", extent=30), Stand(tmp_path, "export")])
    longer, export = Stand(tmp_path, "train", extent=40), Stand(tmp_path, "export")
    go(tmp_path, [longer, export])
    out = capsys.readouterr().out
    assert longer.runs == 1 and "max_steps=40 asked where it was trained to max_steps=30: continuing it" in out
    assert superseded(tmp_path) == ["export"]  # the export of the 30-step run, kept; the run itself continued in place
    shorter, export = Stand(tmp_path, "train", extent=20), Stand(tmp_path, "export")
    assert go(tmp_path, [shorter, export]) == {}
    assert "went to step 40, past train.max_steps=20" in capsys.readouterr().out


def test_a_time_budget_is_an_extent_too_and_no_limit_reaches_any(tmp_path, capsys):
    timed = lambda minutes, steps=100: Stand(tmp_path, "train", extent={"max_steps": steps, "max_minutes": minutes})
    go(tmp_path, [timed(10)])
    more = timed(20)
    go(tmp_path, [more])  # a run stopped by its 10 minutes may not have reached 100 steps: continued
    assert more.runs == 1 and "max_minutes=20 asked where it was trained to max_steps=100, max_minutes=10" in capsys.readouterr().out
    for same_or_less in (timed(20), timed(5)):
        go(tmp_path, [same_or_less])
        assert same_or_less.runs == 0
    unlimited = timed(None)
    go(tmp_path, [unlimited])  # no time limit asks for every step
    assert unlimited.runs == 1
    for any_budget in (timed(None), timed(30)):  # and a run without one reaches any budget
        go(tmp_path, [any_budget])
        assert any_budget.runs == 0
    old_record = Stand(tmp_path, "train", extent=100)  # a record from before max_minutes: a bare step count
    assert old_record.stage.reached_by({"extent": {"max_steps": 100, "max_minutes": None}})
    assert timed(None).stage.reached_by({"extent": 100}) and not timed(None, 200).stage.reached_by({"extent": 100})


def test_a_stopped_run_continues_under_a_resumable_change_and_a_finished_one_is_a_new_run(tmp_path, capsys):
    records = StageRecords(tmp_path / "stages.json")
    first = Stand(tmp_path, "train", resume_inputs={"n": "same"}, lr=1)
    run_stages([first.stage], records, [], tmp_path)
    # It made a checkpoint, then stopped (on non-finite steps, say): its record is not done.
    records.mark("train", records.get("train")["key"], done=False, resume_key=records.get("train")["resume_key"])
    lower = Stand(tmp_path, "train", resume_inputs={"n": "same"}, lr=0.5)
    run_stages([lower.stage], StageRecords(tmp_path / "stages.json"), [], tmp_path)
    assert lower.runs == 1 and superseded(tmp_path) == [] and "continues from its last checkpoint" in capsys.readouterr().out
    again = Stand(tmp_path, "train", resume_inputs={"n": "same"}, lr=0.1)  # the run above finished
    run_stages([again.stage], StageRecords(tmp_path / "stages.json"), [], tmp_path)
    assert again.runs == 1 and superseded(tmp_path) == ["train"]


def test_a_record_under_an_earlier_version_of_a_key_is_cached_and_so_is_every_later_stage(tmp_path, capsys):
    go(tmp_path, [Stand(tmp_path, "train", world_size=2), Stand(tmp_path, "export")])
    train, export = Stand(tmp_path, "train", global_batch=8), Stand(tmp_path, "export")
    train.stage.former_inputs = {"world_size": 2}  # what the same training's key held before
    assert go(tmp_path, [train, export]) == {} and (train.runs, export.runs) == (0, 0) and superseded(tmp_path) == []
    longer = Stand(tmp_path, "train", extent=20, global_batch=8)
    longer.stage.former_inputs = {"world_size": 2}
    go(tmp_path, [longer])  # continued: its record now holds the key as it is
    assert longer.runs == 1 and superseded(tmp_path) == []
    assert StageRecords(tmp_path / "stages.json").get("train")["inputs_key"] == stage_key({"global_batch": 8})
    assert capsys.readouterr().out.count(": cached (") == 2


def test_a_stage_continues_its_record_in_the_form_that_matches_it_and_runs_anew_in_the_other(tmp_path, capsys):
    go(tmp_path, [Stand(tmp_path, "train", rows=8)])
    new = Stand(tmp_path, "train", rows=4)
    kept = Stand(tmp_path, "train", rows=8)
    kept.stage.otherwise = new.stage
    assert go(tmp_path, [kept]) == {} and (kept.runs, new.runs) == (0, 0)
    kept = Stand(tmp_path, "train", rows=8, lr=1)  # another recipe: the kept form matches no record
    kept.stage.otherwise = new.stage
    kept.stage.changed = new.stage.changed = lambda then: "the global batch"
    go(tmp_path, [kept])
    assert (kept.runs, new.runs) == (0, 1) and superseded(tmp_path) == ["train"]
    assert "train: its settings changed (the global batch); the earlier train/" in capsys.readouterr().out


def test_a_failed_stage_is_recorded_with_its_reason(tmp_path):
    from blockdraft.pipeline.process import StageFailed

    def fail():
        raise StageFailed("regen", 2, "see above")

    stage = Stage("regen", {"n": 1}, fail, lambda: False, tmp_path / "regen", moves=tmp_path / "regen")
    with pytest.raises(StageFailed):
        run_stages([stage], StageRecords(tmp_path / "stages.json"), [], tmp_path)
    record = StageRecords(tmp_path / "stages.json").get("regen")
    assert record["done"] is False and "the regen stage failed (exit 2)" in record["failed"]


def node0_later(tmp_path, stands, delay=0.3, **kw):
    """Node 0 running the stages in a thread, after `delay`."""
    timer = threading.Timer(delay, lambda: go(tmp_path, stands, **kw))
    timer.start()
    return timer


def test_a_follower_waits_for_node_zero_joins_its_capture_and_training_and_never_writes(tmp_path):
    def stages():
        return [Stand(tmp_path, "regen"), Stand(tmp_path, "capture", joined=True), Stand(tmp_path, "train", joined=True)]

    n0, follower = stages(), stages()
    for stand in n0[1:]:  # node 0 captures and trains for a while: the follower joins each as it starts
        stand.stage.run = lambda stand=stand: time.sleep(0.5) or stand.run()
    for stand in follower[1:]:
        stand.stage.run = lambda stand=stand: stand.__setattr__("runs", 1) or True
    timer = node0_later(tmp_path, n0)
    spent = run_stages([s.stage for s in follower], StageRecords(tmp_path / "stages.json", writer=False), [], tmp_path,
                       follower=True, poll_s=0.02)
    timer.join()
    assert [s.runs for s in follower] == [0, 1, 1] and set(spent) == {"capture", "train"}
    # A rerun with node 0's stages done: the follower is cached, runs nothing.
    assert run_stages([s.stage for s in stages()], StageRecords(tmp_path / "stages.json", writer=False), [], tmp_path,
                      follower=True, poll_s=0.02) == {}
    with pytest.raises(RuntimeError, match="only node 0 writes"):
        StageRecords(tmp_path / "stages.json", writer=False).mark("regen", "k", done=True)


def test_a_follower_stops_on_node_zeros_failure_but_not_on_an_earlier_attempts(tmp_path):
    records = StageRecords(tmp_path / "stages.json")
    records.mark("regen", "old", done=False)
    records.fail("regen", "the regen stage failed (exit 1); an earlier attempt")
    time.sleep(0.01)
    timer = threading.Timer(0.3, lambda: StageRecords(tmp_path / "stages.json").fail("regen", "out of disk"))
    timer.start()
    began = time.monotonic()
    with pytest.raises(NodeZeroFailed, match="node 0's regen stage failed .*: out of disk"):
        run_stages([Stand(tmp_path, "regen").stage], StageRecords(tmp_path / "stages.json", writer=False), [], tmp_path,
                   follower=True, poll_s=0.02)
    timer.join()
    assert time.monotonic() - began >= 0.25  # the earlier attempt's failure did not stop it


def test_a_follower_waits_no_longer_than_its_timeout(tmp_path):
    with pytest.raises(NodeZeroFailed, match="within node_wait_minutes"):
        run_stages([Stand(tmp_path, "regen").stage], StageRecords(tmp_path / "stages.json", writer=False), [], tmp_path,
                   follower=True, poll_s=0.02, wait_s=0.2)

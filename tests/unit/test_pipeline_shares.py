"""The pipeline's summary says what the run's time went to: training, and measuring (probe + serve)."""

from pathlib import Path

from blockdraft.pipeline.records import StageRecords
from blockdraft.pipeline.runner import Stage, shares_line


def stage(name, skip=None):
    return Stage(name, {}, lambda: True, lambda: True, Path(name), skip_reason=skip)


def test_the_shares_count_every_stage_run_and_the_probe(tmp_path):
    records = StageRecords(tmp_path / "stages.json")
    for name, seconds in (("regen", 300.0), ("train", 600.0), ("serve", 240.0), ("export", 0.0)):
        records.mark(name, "k", done=True, seconds=seconds)
    records.choose("round_cost", {"round_cost": 1.1, "seconds": 60.0, "reused": False})
    stages = [stage("gate", skip="gate=false"), stage("regen"), stage("train"), stage("export"), stage("serve")]
    assert shares_line(stages, records) == (
        "stages and probe 1200 s: training 50%, measuring (probe 60 s + serve 240 s) 25%")


def test_a_probe_read_from_the_machines_record_costs_nothing_and_says_so(tmp_path):
    records = StageRecords(tmp_path / "stages.json")
    records.mark("train", "k", done=True, seconds=100.0)
    records.choose("round_cost", {"round_cost": 1.1, "seconds": 0.0, "reused": True})
    line = shares_line([stage("train")], records)
    assert line.startswith("stages and probe 100 s: training 100%, measuring (probe 0 s + serve 0 s) 0%")
    assert "read from this machine's record" in line

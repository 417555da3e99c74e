"""The demo's stage bookkeeping: what makes a stage cached, and what makes it run again."""

import pytest

from blockdraft import demo
from blockdraft.demo import DemoSettings, StageRecords, parse_args, stage_inputs, stage_key


def keys(settings):
    return {stage: stage_key(inputs) for stage, inputs in stage_inputs(settings).items()}


def test_a_stage_is_finished_only_with_the_same_key_and_marked_done(tmp_path):
    records = StageRecords(tmp_path / "stages.json")
    records.mark("regen", "k1", done=False)
    assert not records.finished("regen", "k1")
    records.mark("regen", "k1", done=True, seconds=3.0)
    again = StageRecords(tmp_path / "stages.json")  # read back from disk
    assert again.finished("regen", "k1") and not again.finished("regen", "k2")
    assert again.started_with("regen") == "k1" and again.started_with("train") is None


def test_changing_a_stage_setting_changes_its_key_and_every_later_key():
    base, more = keys(DemoSettings()), keys(DemoSettings(num_train=10))
    assert base["target"] == more["target"]
    assert all(base[s] != more[s] for s in ("regen", "capture", "train", "export", "serve"))
    served = keys(DemoSettings(serve_prompts=3))
    assert [base[s] == served[s] for s in demo.STAGES] == [True, True, True, True, True, False]
    assert keys(DemoSettings(serve_rounds=3))["serve"] != base["serve"]


def test_training_overrides_reach_the_command_and_the_key():
    settings = DemoSettings(steps=7, train_overrides=["optim.lr=1e-3"])
    argv = demo.train_argv(settings)
    assert "train.max_steps=7" in argv and "optim.lr=1e-3" in argv and "data.val=null" in argv
    assert keys(settings)["train"] != keys(DemoSettings())["train"]
    # The capture composes the same recipe and overrides, so the store is what training reads.
    capture = demo.capture_argv(settings)
    assert "optim.lr=1e-3" in capture and capture[-1] == f"out={settings.paths()['store']}"
    assert f"data.features={settings.paths()['store']}" in argv
    assert keys(settings)["capture"] != keys(DemoSettings())["capture"]
    assert keys(DemoSettings(steps=9))["capture"] == keys(DemoSettings())["capture"]  # steps: train again, not capture


def test_paths_are_made_absolute_so_commands_and_in_process_stages_agree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = parse_args(["--work-dir", "w", "--num-train", "5", "--force", "serve"])
    assert settings.work_dir == str(tmp_path / "w") and settings.num_train == 5 and settings.force == ["serve"]


def test_bad_sizes_are_refused_before_anything_else_is_looked_at():
    with pytest.raises(demo.ConfigError, match="--num-train=0"):
        demo.preflight(DemoSettings(num_train=0))

"""The demo is the pipeline with a preset: an override replaces the preset's value, and the demo's
own first stage (the target) comes before the pipeline's."""

from blockdraft import demo


def test_an_override_replaces_the_preset_and_the_rest_of_the_preset_stays():
    s = demo.settings(["regen.num_train=24", "train.max_steps=16", "out=/tmp/d"])
    assert s.out == "/tmp/d" and s.experiment == "smollm2_dflash_cpu" and s.store == "true"
    assert "num_train=24" in s.regen and "num_train=1500" not in s.regen and "workers=96" in s.regen
    assert "data.val=null" in s.recipe and s.recipe[-1] == "train.max_steps=16"
    assert s.target.endswith(demo.TARGET_DIR)


def test_the_demo_target_stage_comes_first_and_is_recorded_by_directory(tmp_path):
    stage = demo.target_stage(str(tmp_path / "t"))
    assert stage.name == "target" and stage.inputs == {"dir": str(tmp_path / "t")} and not stage.present()


def test_help_names_the_preset(capsys):
    assert demo.main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert "experiment=smollm2_dflash_cpu" in shown and "blockdraft pipeline" in shown

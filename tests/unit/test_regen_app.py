"""The regeneration app: its config, the split of prompts, resume bookkeeping, and a tiny run."""

import json

import pytest
from omegaconf import OmegaConf

from blockdraft.config import compose
from blockdraft.regen import answerers as regen_answerers
from blockdraft.regen.prompt_plan import PromptSplit, check_disjoint, plan_splits, reserve_heldout, take_prompts
from blockdraft.regen.app import alias_target_argument, check_resumable, run_regen
from blockdraft.regen.config import RegenConfig
from blockdraft.errors import ConfigError


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from blockdraft.models.tiny_target import save_tiny_target

    return str(save_tiny_target(tmp_path_factory.mktemp("target") / "tiny"))


def test_the_app_config_composes_and_keeps_its_defaults():
    cfg = OmegaConf.to_object(compose("regen", ["target_dir=/t", "out=/o", "num_train=5"]))
    assert isinstance(cfg, RegenConfig)
    assert (cfg.num_train, cfg.temperature, cfg.max_turns, cfg.backend) == (5, 0.0, 1, "auto")


def test_servers_and_endpoints_are_written_on_the_command_line_as_lists():
    cfg = OmegaConf.to_object(compose("regen", ["target_dir=/t", "out=/o", "servers=0", "endpoint_model=Qwen/Qwen3-8B",
                                                "endpoints=[http://node2:8000/v1,https://h.example]",
                                                "extra_vllm_args=[--data-parallel-size,'2']"]))
    assert cfg.endpoints == ["http://node2:8000/v1", "https://h.example"] and cfg.servers == 0
    assert cfg.extra_vllm_args == ["--data-parallel-size", "2"] and cfg.endpoint_model == "Qwen/Qwen3-8B"


def test_target_on_the_command_line_means_target_dir():
    assert alias_target_argument(["x", "target=/a", "out=/b"]) == ["x", "target_dir=/a", "out=/b"]


@pytest.mark.parametrize("override,message", [
    ({"prompts": "nope.jsonl"}, "prompts='nope.jsonl' does not exist"),
    ({"backend": "tgi"}, "backend='tgi'"),
    ({"max_tokens": 0}, "max_tokens=0"),
    ({"temperature": -1.0}, "temperature=-1.0"),
    ({"cpu_threads_bind": "both"}, "cpu_threads_bind='both'"),
])
def test_bad_settings_are_refused_naming_the_key(tiny_target, tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        RegenConfig(target_dir=tiny_target, out=str(tmp_path), **override).validate()


def test_a_target_without_config_points_at_prepare_gguf(tmp_path):
    with pytest.raises(ConfigError, match="prepare_gguf"):
        RegenConfig(target_dir=str(tmp_path), out=str(tmp_path)).validate()


def test_prompts_that_do_not_fit_are_skipped_and_counted():
    conversations = [[{"role": "user", "content": "x" * n}] for n in (1, 50, 2, 3, 60, 4)]
    split = take_prompts(conversations, n=3, skip=1, length_of=lambda c: len(c[0]["content"]), max_tokens=9)
    assert [c[0]["content"] for c in split.conversations] == ["xx", "xxx", "xxxx"]
    assert split.skipped_long == [1, 4] and split.end_source_position == 6
    assert split.opening_lengths == [2, 3, 4]


def usable_prompts(count: int, long: int = 0) -> PromptSplit:
    return PromptSplit([[{"role": "user", "content": "q"}]] * count, 0, count + long, skipped_long=list(range(long)))


def test_a_small_prompt_file_reserves_the_held_out_prompts_first(capsys):
    cfg = RegenConfig(target_dir="t", out="o", prompts="rows.jsonl", num_train=1000, num_heldout=64)
    assert reserve_heldout(cfg, usable_prompts(293, long=7)) == 229
    assert "the 64 held-out ones are reserved first and training takes the other 229" in capsys.readouterr().err
    assert reserve_heldout(cfg, usable_prompts(1064)) == 1000


def test_a_prompt_file_too_small_for_both_splits_is_refused_before_any_generation():
    cfg = RegenConfig(target_dir="t", out="o", prompts="rows.jsonl", num_train=10, num_heldout=64)
    with pytest.raises(ConfigError, match=r"holds 64 usable prompts .*7 more are longer.*lower num_heldout .* below 64"):
        reserve_heldout(cfg, usable_prompts(64, long=7))


def test_the_plan_of_a_small_file_keeps_both_splits(tiny_target, tmp_path):
    from transformers import AutoTokenizer

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}?"}]}) + "\n" for i in range(10)))
    cfg = RegenConfig(target_dir=tiny_target, out=str(tmp_path / "o"), prompts=str(rows), num_train=20, num_heldout=4)
    splits = plan_splits(cfg, AutoTokenizer.from_pretrained(tiny_target))
    assert (len(splits["train"].conversations), len(splits["heldout"].conversations)) == (6, 4)
    assert splits["heldout"].first_source_position == splits["train"].end_source_position == 6


def test_overlapping_training_and_held_out_ranges_are_refused():
    cfg = RegenConfig(target_dir="t", out="o", num_train=10, num_heldout=4)
    train = PromptSplit([], first_source_position=0, end_source_position=12)
    with pytest.raises(ConfigError, match="overlap.*heldout_skip to 12"):
        check_disjoint(train, heldout_skip=8, cfg=cfg)
    check_disjoint(train, heldout_skip=12, cfg=cfg)


def test_rows_of_other_settings_are_not_mixed_with_new_ones(tmp_path):
    with pytest.raises(ConfigError, match="max_tokens: was 64, now 128"):
        check_resumable({"settings": {"max_tokens": 64, "temperature": 0.0}}, {"max_tokens": 128, "temperature": 0.0}, tmp_path)
    check_resumable({}, {"max_tokens": 128}, tmp_path)


def tiny_config(target, out, **overrides):
    settings = dict(target_dir=target, out=str(out), prompts="tiny_prompts", num_train=3, num_heldout=2,
                    max_tokens=6, max_prompt_tokens=400, backend="transformers", progress=False)
    return RegenConfig(**{**settings, **overrides})


def test_a_tiny_run_writes_disjoint_splits_resumes_and_skips_what_is_complete(tiny_target, tmp_path, monkeypatch, capsys):
    out = run_regen(tiny_config(tiny_target, tmp_path / "regen"))
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    heldout = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    assert len(train) == 3 and len(heldout) == 2
    assert [r["messages"][-1]["role"] for r in train + heldout] == ["assistant"] * 5
    assert train[0]["generation"]["backend"] == "transformers" and train[0]["generation"]["max_tokens"] == 6
    manifest = json.loads((out / "regen.json").read_text())
    assert manifest["splits"]["train"]["source_positions"] == [0, 3]
    assert manifest["splits"]["heldout"]["source_positions"] == [3, 5]  # right after the training prompts

    answered = []
    real = regen_answerers._in_process

    def counted(cfg, tokenizer):
        answerer = real(cfg, tokenizer)
        answerer.reply = (lambda reply: lambda m: answered.append(m) or reply(m))(answerer.reply)
        return answerer

    monkeypatch.setattr(regen_answerers, "_in_process", counted)
    capsys.readouterr()
    run_regen(tiny_config(tiny_target, tmp_path / "regen"))
    assert capsys.readouterr().out.count("already complete") == 2 and answered == []
    # A train.jsonl torn after it was recorded complete (a power loss, a full disk, an edit) is found on the next
    # run and written again from the answered parts: the same rows, no prompt asked twice.
    whole = (out / "train.jsonl").read_bytes()
    (out / "train.jsonl").write_bytes(whole[: len(whole) // 2])
    run_regen(tiny_config(tiny_target, tmp_path / "regen"))
    said = capsys.readouterr().out
    assert "train: train.jsonl is not the file regen wrote (its sha256 differs)" in said and answered == []
    assert (out / "train.jsonl").read_bytes() == whole
    # A larger training split answers only its new prompts; the held-out range moves after it,
    # so its old rows (now training prompts) are discarded, never mixed in.
    run_regen(tiny_config(tiny_target, tmp_path / "regen", num_train=5))
    assert len(answered) == 2 + 2
    assert "old rows are discarded" in capsys.readouterr().out
    manifest = json.loads((out / "regen.json").read_text())
    assert manifest["splits"]["heldout"]["source_positions"] == [5, 7]


def test_held_out_prompts_that_skipped_long_ones_may_not_reach_into_the_training_range():
    from blockdraft.regen.prompt_plan import check_ranges_apart

    cfg = RegenConfig(target_dir="t", out="o", num_train=10, num_heldout=4, heldout_skip=0, train_skip=4)
    heldout = PromptSplit([[{}]] * 4, first_source_position=0, end_source_position=7, skipped_long=[1, 2, 3])
    train = PromptSplit([[{}]] * 10, first_source_position=4, end_source_position=14)
    with pytest.raises(ConfigError, match=r"positions 0..6 .*set train_skip to 7 or more"):
        check_ranges_apart(train, heldout, cfg)
    check_ranges_apart(PromptSplit([[{}]] * 10, 7, 17), heldout, cfg)

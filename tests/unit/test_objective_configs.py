"""The objectives' settings: JetSpec's recipe whatever the experiment, and each new option's refusal of
bad values at the config check, before anything loads."""

import pytest
from omegaconf import OmegaConf

from blockdraft.capture.config import CaptureAppConfig
from blockdraft.config import compose, register_schema
from blockdraft.config.recipe import TrainAppConfig
from blockdraft.errors import ConfigError
from blockdraft.train.setup import check_config

register_schema("train_schema", TrainAppConfig)
register_schema("capture_schema", CaptureAppConfig)


def _schema(*overrides, experiment="tiny_cpu"):
    return OmegaConf.to_object(compose("train", [f"experiment={experiment}", "run_dir=/tmp/unused", *overrides]))


@pytest.mark.parametrize("experiment", ["tiny_cpu", "smollm2_dflash_cpu", "qwen3_8b_dflash"])
def test_jetspec_trains_its_papers_objective_under_any_experiment(experiment):
    t = _schema("draft=jetspec", experiment=experiment).train
    assert (t.kl_weight, t.ce_weight, t.teacher_top_k, t.position_weighting, t.gamma) == (1.0, 0.0, None, "decay", None)
    # A DFlash draft keeps the experiment's own choices.
    assert _schema(experiment=experiment).train.kl_weight == 0.0


# Config-only shapes of the recipes' targets (their config.json as transformers reads it).
RECIPE_TARGETS = {
    "qwen3_8b_dspark": dict(family="qwen3", num_hidden_layers=36, hidden_size=4096, intermediate_size=12288,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "smollm2_dspark_cpu": dict(family="llama", num_hidden_layers=30, hidden_size=576, intermediate_size=1536,
                               num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152),
}


@pytest.mark.parametrize("experiment", sorted(RECIPE_TARGETS))
def test_the_dspark_recipes_train_dsparks_objective_and_resolve_for_their_targets(experiment, tmp_path):
    import transformers as T

    from blockdraft.models.resolve import resolve_draft_config

    shape = dict(RECIPE_TARGETS[experiment])
    target = {"qwen3": T.Qwen3Config, "llama": T.LlamaConfig}[shape.pop("family")](**shape)
    target.to_json_file(tmp_path / "config.json")
    cfg = _schema(f"target.path={tmp_path}", experiment=experiment)
    t = cfg.train
    assert (t.position_weighting, t.gamma, t.confidence_weight, t.confidence_target) == ("decay", 4.0, 1.0, "greedy")
    check_config(cfg, data_ready=False)  # the 8B recipe leaves data.train to the command line
    draft = resolve_draft_config(cfg.draft, target)  # validates: layer ids, mask token, DSpark's heads
    assert draft.kind == "dspark" and draft.num_speculative_tokens == draft.block_size


def test_the_command_line_still_brings_the_decay_back_to_jetspec():
    assert _schema("draft=jetspec", "train.gamma=4.0").train.gamma == 4.0


@pytest.mark.parametrize("overrides,needles", [
    (["train.loss_normalization=mean"], ["train.loss_normalization='mean'", "weights", "blocks", "tokens"]),
    (["train.max_nonfinite_steps=0"], ["train.max_nonfinite_steps=0"]),
    (["train.kl_weight=1.0", "train.teacher_top_k=-1"], ["train.teacher_top_k=-1", "null"]),
    (["draft.sliding_window=3"], ["draft.sliding_window=3", "draft.block_size=4", "sliding_window >= 4"]),
])
def test_bad_objective_settings_are_refused_at_the_config_check(overrides, needles):
    with pytest.raises(ConfigError) as err:
        check_config(_schema(*overrides))
    for needle in needles:
        assert needle in str(err.value)


def test_a_causal_draft_may_have_a_window_narrower_than_its_block():
    # vLLM gives a causal layer a one-sided window, exactly what training's mask applies.
    check_config(_schema("draft=jetspec", "draft.block_size=4", "draft.sliding_window=2"))
    check_config(_schema("draft.sliding_window=4"))  # as wide as the block: the same rule either way


def test_a_capture_for_the_full_distribution_keeps_a_top_k_and_says_so(capsys):
    from blockdraft.capture.identity import STORE_FULL_TOP_K, store_teacher_top_k

    assert store_teacher_top_k(1.0, None) == STORE_FULL_TOP_K == 32
    assert "keeping its top 32" in capsys.readouterr().out
    assert (store_teacher_top_k(1.0, 8), store_teacher_top_k(0.0, None)) == (8, 0)

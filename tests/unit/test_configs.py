"""Every config in configs/ composes, and a typo fails at composition with the key's name."""

import pytest
from omegaconf import OmegaConf
from hydra.errors import ConfigCompositionException

from blockdraft.config import CONFIG_DIR, compose, register_schema
from blockdraft.config.recipe import TrainAppConfig

register_schema("train_schema", TrainAppConfig)

GROUPS = ["target", "draft", "data", "optim"]


def _options(group):
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_every_experiment_composes(experiment):
    cfg = compose("train", [f"experiment={experiment}", "run_dir=/tmp/x"])
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, TrainAppConfig)
    assert obj.name == experiment


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_group_option_composes(group, option):
    cfg = compose("train", [f"{group}={option}", "run_dir=/tmp/x"])
    OmegaConf.to_object(cfg)


# Importing an app's entry module registers its schema in the ConfigStore.
APP_MODULES = {
    "train": "blockdraft.train.__main__",
    "export": "blockdraft.export.__main__",
    "serve": "blockdraft.serve.__main__",
    "regen": "blockdraft.regen.app",
    "capture": "blockdraft.capture.app",
    "eval": "blockdraft.eval.__main__",
}


def test_every_app_config_composes():
    apps = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    assert set(apps) == set(APP_MODULES), "a new app config needs its entry module listed here"
    for app in apps:
        __import__(APP_MODULES[app])
        compose(app, [])


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_capture_composes_every_training_recipe(experiment):
    """The capture app takes the training overrides as they are: a recipe means the same to both."""
    __import__(APP_MODULES["capture"])
    cfg = compose("capture", [f"experiment={experiment}", "out=/tmp/store"])
    train = compose("train", [f"experiment={experiment}"])
    for group in ("target", "draft", "data"):
        assert cfg[group] == train[group]


def test_misspelled_key_fails_at_composition_with_its_name():
    for typo in ("draft.num_layer=3", "train.num_anchor=3", "optim.learning_rate=1e-3"):
        with pytest.raises(ConfigCompositionException) as err:
            compose("train", [typo])
        assert typo.split("=")[0] in str(err.value)


def test_misspelled_key_in_a_recipe_file_fails_with_its_name(tmp_path):
    import shutil

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    tree = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, tree)
    (tree / "experiment" / "typo.yaml").write_text("# @package _global_\ndraft:\n  num_layerz: 2\n")
    with initialize_config_dir(config_dir=str(tree), version_base=None):
        with pytest.raises(ConfigCompositionException) as err:
            hydra_compose(config_name="train", overrides=["experiment=typo"])
    assert "num_layerz" in str(err.value.__cause__ or err.value)


def test_wrong_type_fails_at_composition_with_its_name():
    with pytest.raises(ConfigCompositionException) as err:
        compose("train", ["draft.block_size=sixteen"])
    assert "draft.block_size" in str(err.value)


def test_qwen3_8b_recipes_match_the_published_drafters():
    for name, kind in (("qwen3_8b_dflash", "dflash"), ("qwen3_8b_dflash2", "dflash2")):
        d = compose("train", [f"experiment={name}", "run_dir=/tmp/x"]).draft
        assert (d.kind, d.num_layers, d.block_size, d.mask_token_id) == (kind, 5, 16, 151669)
        assert list(d.target_layer_ids) == [1, 9, 17, 25, 33]


def test_the_qwen3_8b_dspark_recipe_has_speculators_example_sizes():
    d = compose("train", ["experiment=qwen3_8b_dspark", "run_dir=/tmp/x"]).draft
    assert (d.kind, d.num_layers, d.block_size, d.mask_token_id, d.draft_vocab_size) == ("dspark", 3, 8, 151669, 32000)
    assert (d.markov_rank, d.markov_head_type, d.enable_confidence_head, d.confidence_head_with_markov) == (256, "vanilla", True, True)
    # speculators' default aux ids [2, L // 2, L - 3] for 36 layers, as target layers (aux - 1).
    assert list(d.target_layer_ids) == [1, 17, 32] and d.sample_from_anchor and not d.train_mask_embedding


def test_the_cpu_dspark_recipe_is_the_demo_recipe_but_for_what_dspark_needs():
    def flat(experiment):
        tree = OmegaConf.to_container(compose("train", [f"experiment={experiment}", "run_dir=/tmp/x"]))
        return {f"{group}.{k}": v for group, keys in tree.items() if isinstance(keys, dict) for k, v in keys.items()} | {
            k: v for k, v in tree.items() if not isinstance(v, dict)}

    dflash, dspark = flat("smollm2_dflash_cpu"), flat("smollm2_dspark_cpu")
    changed = {k: (dflash[k], dspark[k]) for k in dflash if dflash[k] != dspark[k]}
    assert changed == {
        "name": ("smollm2_dflash_cpu", "smollm2_dspark_cpu"),
        "draft.kind": ("dflash", "dspark"),
        "draft.train_mask_embedding": (True, False),  # vLLM's DSpark ignores a trained MASK embedding
        "draft.markov_rank": (256, 64),
        "train.position_weighting": ("dpace", "decay"),  # configs/objective/dspark.yaml, after the experiment
    }

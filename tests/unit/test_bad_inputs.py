"""Every input a user can get wrong fails early with a message naming the key, the value and the fix."""

import pytest

from blockdraft.errors import ConfigError
from blockdraft.models.resolve import DraftConfig, resolve_draft_config
from blockdraft.models.suggest import suggest_layer_ids
from blockdraft.models.target import TargetModel
from blockdraft.models.tiny_target import tiny_config

TARGET = tiny_config("qwen3", vocab_size=268, num_layers=6)
FORBIDDEN = [256, 257]  # the tiny tokenizer's eos and pad


def _resolve(**settings):
    base = dict(kind="dflash", num_layers=2, block_size=4, mask_token_id=262, target_layer_ids=[1, 3], conv_group_size=8)
    base.update(settings)
    return resolve_draft_config(DraftConfig(**base), TARGET, FORBIDDEN)


@pytest.mark.parametrize("settings,needles", [
    (dict(target_layer_ids=[]), ["target_layer_ids", "empty"]),
    (dict(target_layer_ids=[3, 1]), ["target_layer_ids", "[3, 1]", "not sorted", "[1, 3]"]),
    (dict(target_layer_ids=[1, 1]), ["target_layer_ids", "duplicates"]),
    (dict(target_layer_ids=[1, 5]), ["target_layer_ids", "[5]", "[0, 4]"]),
    (dict(target_layer_ids=[-1, 2]), ["target_layer_ids", "[-1]"]),
    (dict(mask_token_id=None), ["mask_token_id", "no default"]),
    (dict(mask_token_id=268), ["mask_token_id=268", "outside", "268"]),
    (dict(mask_token_id=256), ["mask_token_id=256", "pad/eos/bos"]),
    (dict(mask_token_id=257), ["mask_token_id=257", "pad/eos/bos"]),
    (dict(block_size=1), ["block_size=1", ">= 2"]),
    (dict(kind="dflash3"), ["draft.kind='dflash3'", "dflash2"]),
    (dict(kind="dflash2", conv_group_size=7), ["conv_group_size=7", "hidden_size=64"]),
    (dict(kind="dflash2", selector_top_k=269), ["selector_top_k=269", "vocab_size=268"]),
])
def test_bad_draft_settings_are_refused(settings, needles):
    with pytest.raises(ConfigError) as err:
        _resolve(**settings)
    for needle in needles:
        assert needle in str(err.value)


def test_bos_is_refused_as_mask_token():
    with pytest.raises(ConfigError, match="pad/eos/bos"):
        resolve_draft_config(DraftConfig(mask_token_id=5, target_layer_ids=[1], block_size=4), TARGET, [5])


def test_default_spread_that_collapses_is_refused():
    # round(1 + i*(L-4)/(n-1)) on a 4-layer target with 2 draft layers gives [1, 1].
    with pytest.raises(ConfigError, match="duplicates"):
        suggest_layer_ids(4, 2)
    small = tiny_config("qwen3", vocab_size=268, num_layers=4)
    with pytest.raises(ConfigError, match="duplicates"):
        resolve_draft_config(DraftConfig(num_layers=2, mask_token_id=262), small, FORBIDDEN)
    assert suggest_layer_ids(36, 5) == [1, 9, 17, 25, 33]


def test_capture_refuses_layer_outside_target(tiny_hf):
    with pytest.raises(ConfigError, match="target_layer_ids"):
        TargetModel(tiny_hf, [1, 6])

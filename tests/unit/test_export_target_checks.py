import json
import shutil

import pytest

from blockdraft.errors import ConfigError
from blockdraft.export.target_checks import check_against_target
from blockdraft.export.writer import export_draft
from blockdraft.models.tiny_target import save_tiny_target
from tests.unit.export_helpers import draft_config, make_run


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    # 6 layers, hidden 64, vocab 268; eos 256, pad 257, no bos.
    return save_tiny_target(tmp_path_factory.mktemp("target") / "tiny-qwen3")


def edited_copy(target, tmp_path, filename, **changes):
    copy = shutil.copytree(target, tmp_path / "edited")
    data = json.loads((copy / filename).read_text())
    data.update(changes)
    (copy / filename).write_text(json.dumps(data))
    return copy


def test_a_matching_draft_passes(target):
    check_against_target(draft_config("dflash2"), target)


def test_vocabulary_mismatch(target):
    cfg = draft_config(target_kwargs={"vocab_size": 272})
    with pytest.raises(ConfigError, match=r"vocab_size: draft 272, target 268 .*export with target="):
        check_against_target(cfg, target)


def test_target_width_mismatch(target):
    cfg = draft_config(target_kwargs={"hidden_size": 32})
    with pytest.raises(ConfigError, match=r"target_hidden_size: draft 32 \(fc.weight takes 2 x 32 = 64 inputs\), target hidden_size 64"):
        check_against_target(cfg, target)


def test_layer_ids_beyond_the_target(target):
    cfg = draft_config(target_kwargs={"num_layers": 10}, target_layer_ids=[1, 6])
    with pytest.raises(ConfigError, match=r"target_layer_ids: \[1, 6\] has \[6\] outside \[0, 4\].*num_hidden_layers 6"):
        check_against_target(cfg, target)


def test_mask_outside_the_embedding_table(target):
    cfg = draft_config()
    cfg.mask_token_id = 300
    with pytest.raises(ConfigError, match=r"mask_token_id: 300 is outside the target's embedding table \[0, 268\)"):
        check_against_target(cfg, target)


@pytest.mark.parametrize("mask, role, where", [(256, "eos", "config.json"), (257, "pad", "config.json")])
def test_mask_on_pad_or_eos_from_the_config(target, mask, role, where):
    cfg = draft_config()
    cfg.mask_token_id = mask
    with pytest.raises(ConfigError, match=rf"mask_token_id: {mask} is the target's {role} token \({role}_token_id in {where}\)"):
        check_against_target(cfg, target)


def test_mask_on_bos_from_generation_config(target, tmp_path):
    edited = edited_copy(target, tmp_path, "generation_config.json", bos_token_id=[5, 262])
    with pytest.raises(ConfigError, match=r"262 is the target's bos token \(bos_token_id in generation_config.json\)"):
        check_against_target(draft_config(), edited)


def test_mask_on_a_tokenizer_special_token(target, tmp_path):
    edited = edited_copy(target, tmp_path, "tokenizer_config.json", bos_token={"content": "<|reserved_2|>"})
    with pytest.raises(ConfigError, match=r"262 is the target's bos token \(bos_token '<\|reserved_2\|>' in tokenizer_config.json\)"):
        check_against_target(draft_config(), edited)


def test_every_mismatch_is_listed_at_once(target, tmp_path):
    cfg = draft_config(target_kwargs={"vocab_size": 272, "hidden_size": 32})
    with pytest.raises(ConfigError) as err:
        check_against_target(cfg, target)
    assert "vocab_size" in str(err.value) and "target_hidden_size" in str(err.value)


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="has no config.json"):
        check_against_target(draft_config(), tmp_path)


def test_export_checks_the_target_before_writing(target, tmp_path):
    make_run(tmp_path / "run", target_kwargs={"vocab_size": 272})
    with pytest.raises(ConfigError, match="vocab_size: draft 272, target 268"):
        export_draft(tmp_path / "run", tmp_path / "out", target_dir=target)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
    assert not (tmp_path / "out.failed").exists()


def test_export_takes_max_positions_from_the_target(target, tmp_path):
    make_run(tmp_path / "run", "dflash2")
    edited = edited_copy(target, tmp_path, "config.json", max_position_embeddings=65536)
    out = export_draft(tmp_path / "run", tmp_path / "out", target_dir=edited)
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 65536

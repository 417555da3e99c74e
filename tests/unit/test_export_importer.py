import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from blockdraft.draft_format.config_reader import draft_config_from_vllm_config
from blockdraft.draft_format.contract import ContractError, check_state_dict, expected_shapes
from blockdraft.draft_format.importer import import_draft
from blockdraft.errors import ConfigError
from blockdraft.export.vllm_config import vllm_config
from blockdraft.export.writer import export_draft
from blockdraft.models.io import save_draft
from tests.unit.export_helpers import make_draft, make_run


def automodel_style_dir(directory, draft, codebook_suffix=False):
    """A DFlash2 draft as another training stack writes it, built from the contract's words:
    wrapped-module names (`model.` prefix), the Qwen3-prefixed architecture, block_size only
    inside dflash_config."""
    cfg = draft.config
    directory.mkdir(parents=True)
    config = {
        "architectures": ["Qwen3DFlash2DraftModel"],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "target_hidden_size": cfg.target_hidden_size,
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": cfg.target_layer_ids,
            "block_size": cfg.block_size,
            "conv_kernel_size": cfg.conv_kernel_size,
            "conv_group_size": cfg.conv_group_size,
            "selector_rank": cfg.selector_rank,
            "selector_top_k": cfg.selector_top_k,
        },
    }
    (directory / "config.json").write_text(json.dumps(config))
    state = {}
    for name, tensor in draft.state_dict().items():
        if codebook_suffix and name.endswith("_codebook"):
            name += ".weight"
        state["model." + name] = tensor.contiguous()
    save_file(state, str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize("codebook_suffix", [False, True])
def test_automodel_style_dflash2_imports_and_reexports_canonically(tmp_path, codebook_suffix):
    draft = make_draft("dflash2")
    source = automodel_style_dir(tmp_path / "automodel", draft, codebook_suffix)
    imported, cfg = import_draft(source)
    assert cfg.kind == "dflash2" and cfg.block_size == 4 and cfg.num_target_layers == 5
    for name, tensor in draft.state_dict().items():
        assert torch.equal(imported.state_dict()[name], tensor), name

    save_draft(tmp_path / "ckpt", imported)
    out = export_draft(tmp_path / "ckpt", tmp_path / "out", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["block_size"] == 4
    assert set(load_file(str(out / "model.safetensors"))) == set(expected_shapes(cfg))


def test_dflash_declared_directory_with_selector_weights_is_refused(tmp_path):
    make_run(tmp_path / "run", "dflash2")
    out = export_draft(tmp_path / "run", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["DFlashDraftModel"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ContractError, match=r"declares a DFlash draft.*candidate_selector\.hidden_projection\.weight.*silently drop"):
        import_draft(out)


def test_dflash2_directory_missing_conv_weights_is_refused(tmp_path):
    make_run(tmp_path / "run", "dflash2")
    out = export_draft(tmp_path / "run", tmp_path / "out")
    state = load_file(str(out / "model.safetensors"))
    dropped = [k for k in state if k.startswith("layers.1.") and "_conv." in k]
    save_file({k: v for k, v in state.items() if k not in dropped}, str(out / "model.safetensors"))
    with pytest.raises(ContractError, match="declares a DFlash2 draft") as err:
        import_draft(out)
    assert all(name in str(err.value) for name in dropped)


def test_unknown_architecture_is_refused_with_the_supported_list(tmp_path):
    make_run(tmp_path / "run")
    out = export_draft(tmp_path / "run", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["EagleDraftModel"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"EagleDraftModel.*Qwen3DFlash2DraftModel"):
        import_draft(out)


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda s: s.pop("norm.weight"), "missing norm.weight"),
        (lambda s: s.update({"lm_head.weight": torch.zeros(268, 64)}), "unexpected lm_head.weight"),
        (lambda s: s.update({"fc.weight": torch.zeros(64, 64)}), r"mis-shaped fc.weight: \[64, 64\], expected \[64, 128\]"),
        (lambda s: s.update({"layers.0.q_proj.weight": s.pop("layers.0.self_attn.q_proj.weight")}), "missing layers.0.self_attn.q_proj.weight"),
    ],
)
def test_missing_unexpected_and_misshaped_tensors_are_named(tmp_path, change, expected):
    make_run(tmp_path / "run")
    out = export_draft(tmp_path / "run", tmp_path / "out")
    state = load_file(str(out / "model.safetensors"))
    change(state)
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(ContractError, match=expected):
        import_draft(out)


def test_contract_is_independent_of_the_modules():
    # A module that grew or lost a parameter is caught: the contract is written from the config.
    draft = make_draft("dflash2")
    state = dict(draft.state_dict())
    check_state_dict(state, draft.config)
    state["candidate_selector.predecessor_codebook.weight"] = state.pop("candidate_selector.predecessor_codebook")
    with pytest.raises(ContractError, match="missing candidate_selector.predecessor_codebook"):
        check_state_dict(state, draft.config)


def test_config_round_trip_and_required_keys():
    cfg = make_draft("dflash2").config
    back = draft_config_from_vllm_config(vllm_config(cfg))
    assert {k: v for k, v in back.to_dict().items() if k != "forbidden_mask_ids"} == {
        k: v for k, v in cfg.to_dict().items() if k != "forbidden_mask_ids"
    }
    config = vllm_config(cfg)
    del config["dflash_config"]["selector_top_k"]
    with pytest.raises(ConfigError, match="dflash_config.selector_top_k"):
        draft_config_from_vllm_config(config)
    config = vllm_config(make_draft("dflash").config)
    del config["block_size"], config["dflash_config"]["block_size"]
    with pytest.raises(ConfigError, match="block_size"):
        draft_config_from_vllm_config(config)


def test_training_checkpoint_is_pointed_at_the_exporter(tmp_path):
    step_dir, _ = make_run(tmp_path / "run")
    with pytest.raises(ConfigError, match="training checkpoint.*python -m blockdraft.export"):
        import_draft(step_dir)


def test_the_qwen3_dspark_alias_imports_as_dspark():
    """Qwen3DSparkDraftModel (SGLang's name; vLLM serves it through vllm_plugin/) reads as our DSpark."""
    cfg = make_draft("dspark").config
    config = vllm_config(cfg)
    config["architectures"] = ["Qwen3DSparkDraftModel"]
    back = draft_config_from_vllm_config(config)
    assert back.kind == "dspark" and back.markov_rank == cfg.markov_rank and back.sample_from_anchor == cfg.sample_from_anchor

"""Refusals before launch: a hand-made draft config.json against a tiny target on disk."""

import json
import sys

import pytest
import torch
from safetensors.torch import save_file

from blockdraft.errors import ConfigError
from blockdraft.kinds.dflash2.serving import anchor_clamp_warning
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.preflight import (
    check_against_target,
    check_cpu_head_sizes,
    check_fc_weight,
    check_vllm_support,
    choose_engine,
    fc_in_features,
    plan_serving,
    read_draft,
    read_target,
    speculative_tokens,
)
from blockdraft.vllm_runtime.probe import VllmInfo

CPU_VLLM = VllmInfo(
    version="0.32.0", device="cpu", has_triton=False, v2_runner_env=None,
    dflash_archs=["DFlash2DraftModel", "DFlashDraftModel", "Qwen3DSparkModel"], arch_known=True, arch_supports_eagle3=True,
    anchor_clamp=False, cpu_head_sizes=[32, 64, 128],
)
GPU_VLLM = VllmInfo(**{**CPU_VLLM.__dict__, "device": "cuda", "has_triton": True, "cpu_head_sizes": []})


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    # 6 layers, hidden 64 (2 heads of 32), vocab 268.
    return save_tiny_target(tmp_path_factory.mktemp("serve") / "target")


def write_draft(directory, arch="DFlashDraftModel", fc_in=128, **overrides):
    config = {
        "architectures": [arch], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "vocab_size": 268, "target_hidden_size": 64,
        "dflash_config": {"mask_token_id": 262, "target_layer_ids": [1, 3], "block_size": 4},
    }
    dflash = overrides.pop("dflash_config", {})
    config.update(overrides)
    config["dflash_config"].update(dflash)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file({"fc.weight": torch.zeros(64, fc_in)}, str(directory / "model.safetensors"))
    return directory


def refused(draft_dir, target_dir, match):
    with pytest.raises(ConfigError, match=match):
        draft = read_draft(draft_dir)
        target = read_target(target_dir)
        check_against_target(draft, target)
        check_fc_weight(draft, target, fc_in_features(draft_dir))


def test_a_matching_draft_passes(tmp_path, target_dir):
    draft, target = read_draft(write_draft(tmp_path / "d")), read_target(target_dir)
    check_against_target(draft, target)
    check_fc_weight(draft, target, fc_in_features(tmp_path / "d"))
    assert (draft.kind, draft.block_size, draft.target_layer_ids) == ("dflash", 4, [1, 3])


def test_a_lilicorr_draft_is_refused_a_count_its_vllm_drafter_would_not_start_with():
    from blockdraft.serve.preflight import check_drafted_tokens

    with pytest.raises(ConfigError, match=r"num_speculative_tokens=4 with a LiLiCorr draft of block_size=4: .* set "
                                          r"num_speculative_tokens=3 or fewer"):
        check_drafted_tokens("lilicorr", 4, 4)
    check_drafted_tokens("lilicorr", 3, 4)
    check_drafted_tokens("dflash", 4, 4)  # above the trained count: a warning elsewhere, not a refusal


def test_a_name_no_dflash_drafter_has_is_refused_with_the_served_names(tmp_path, target_dir):
    # (Qwen3DFlashDraftModel and its DFlash2 sibling are served through vllm_plugin/: test_serve_draft_aliases.py)
    refused(write_draft(tmp_path / "d", arch="Qwen3ForCausalLM"), target_dir, r"DFlashDraftModel.*Re-export")


def test_no_config_json_says_how_to_export(tmp_path, target_dir):
    (tmp_path / "d").mkdir()
    refused(tmp_path / "d", target_dir, "python -m blockdraft.export")


def test_vocab_mismatch_names_both_sizes(tmp_path, target_dir):
    refused(write_draft(tmp_path / "d", vocab_size=300), target_dir, "vocab_size=300 but the target has 268")


def test_fc_width_from_config_must_match_the_target(tmp_path, target_dir):
    refused(write_draft(tmp_path / "d", target_hidden_size=128), target_dir, "target_hidden_size=128.*hidden_size is 64")


def test_fc_weight_must_take_n_layers_of_target_width(tmp_path, target_dir):
    refused(write_draft(tmp_path / "d", fc_in=192), target_dir, r"fc.weight takes 192 inputs.*= 128")


def test_layer_ids_beyond_the_target_are_refused(tmp_path, target_dir):
    refused(write_draft(tmp_path / "d", dflash_config={"target_layer_ids": [1, 5]}), target_dir, r"within \[0, 4\]")


def test_dflash2_needs_its_keys(tmp_path, target_dir):
    refused(write_draft(tmp_path / "d", arch="DFlash2DraftModel"), target_dir, "dflash_config.conv_kernel_size")


def test_num_speculative_tokens_defaults_to_the_trained_tokens_and_says_other_values(tmp_path):
    assert speculative_tokens(None, 15) == (15, [])
    assert speculative_tokens(15, 15) == (15, [])
    k, [warning] = speculative_tokens(20, 15)
    assert k == 20 and "above block_size - 1 = 15" in warning
    k, [note] = speculative_tokens(7, 15)
    assert k == 7 and "below" in note
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        speculative_tokens(None, None)

    # The trained tokens follow the layout: block_size - 1 for DFlash, block_size for DSpark drafting from its anchor.
    dflash = read_draft(write_draft(tmp_path / "d"))
    assert dflash.trained_tokens == dflash.block_size - 1
    for layout, expected in ((None, 0), (True, 0), (False, 1)):  # vLLM's default (key absent) is true
        extra = {} if layout is None else {"sample_from_anchor": layout}
        dspark = read_draft(write_draft(tmp_path / f"s{layout}", arch="Qwen3DSparkModel", **extra))
        assert dspark.kind == "dspark" and dspark.trained_tokens == dspark.block_size - expected


def test_a_target_without_aux_hidden_states_is_named(tmp_path, target_dir):
    draft, target = read_draft(write_draft(tmp_path / "d")), read_target(target_dir)
    target.architecture = "GPT2LMHeadModel"
    no_eagle3 = VllmInfo(**{**CPU_VLLM.__dict__, "arch_supports_eagle3": False})
    with pytest.raises(ConfigError, match="'GPT2LMHeadModel' cannot expose the hidden states"):
        check_vllm_support(no_eagle3, draft, target)
    unknown = VllmInfo(**{**CPU_VLLM.__dict__, "arch_known": False})
    with pytest.raises(ConfigError, match="not in vLLM 0.32.0's registry"):
        check_vllm_support(unknown, draft, target)


@pytest.mark.parametrize("fields,reason", [
    ({"arch_supports_eagle3": False, "arch_error": "ModuleNotFoundError: No module named 'torchvision'"},
     "cannot import its class for 'Qwen3_5ForCausalLM' here (ModuleNotFoundError: No module named 'torchvision')"),
    ({"arch_has_inner_state": True}, "'Qwen3_5ForCausalLM' keeps Mamba / linear-attention state"),
])
def test_a_target_vllm_cannot_serve_goes_to_the_reference_engine_saying_why(tmp_path, target_dir, fields, reason):
    draft, target = read_draft(write_draft(tmp_path / "d")), read_target(target_dir)
    target.architecture = "Qwen3_5ForCausalLM"
    info = VllmInfo(**{**CPU_VLLM.__dict__, **fields})
    engine, [note] = choose_engine(draft, info, target)
    assert engine == "reference" and reason in note and "reference engine" in note
    with pytest.raises(ConfigError, match="vLLM cannot serve this target with a DFlash draft"):
        choose_engine(draft, info, target, requested="vllm")
    # The same interface on a GPU build (Triton present) is vLLM's to serve.
    if "arch_has_inner_state" in fields:
        assert choose_engine(draft, VllmInfo(**{**GPU_VLLM.__dict__, **fields}), target) == ("vllm", [])


def test_the_engine_can_be_forced(tmp_path, target_dir):
    draft, target = read_draft(write_draft(tmp_path / "d")), read_target(target_dir)
    assert choose_engine(draft, CPU_VLLM, target, requested="reference")[0] == "reference"
    assert choose_engine(draft, CPU_VLLM, target, requested="vllm") == ("vllm", [])
    dflash2 = read_draft(write_draft(tmp_path / "d2", arch="DFlash2DraftModel", dflash_config=dict(
        conv_kernel_size=2, conv_group_size=8, selector_rank=4, selector_top_k=2)))
    with pytest.raises(ConfigError, match="engine=vllm: vLLM 0.32.0 on cpu cannot run DFlash2"):
        choose_engine(dflash2, CPU_VLLM, target, requested="vllm")
    dspark = read_draft(write_draft(tmp_path / "ds", arch="Qwen3DSparkModel"))
    engine, [note] = choose_engine(dspark, CPU_VLLM, target)
    assert engine == "reference" and "cannot run DSpark (it has no Triton GPU backend" in note
    with pytest.raises(ConfigError, match="engine=vllm: vLLM 0.32.0 on cpu cannot run DSpark"):
        choose_engine(dspark, CPU_VLLM, target, requested="vllm")
    assert choose_engine(dspark, GPU_VLLM, target) == ("vllm", [])
    older = VllmInfo(**{**GPU_VLLM.__dict__, "dflash_archs": ["DFlashDraftModel"]})
    assert "its registry has no Qwen3DSparkModel" in choose_engine(dspark, older, target)[1][0]
    with pytest.raises(ConfigError, match="engine='gpu' is not one of"):
        ServeConfig(draft_dir=str(tmp_path / "d"), target_dir=str(target_dir), engine="gpu",
                    vllm_python=sys.executable).validate()


def test_dflash2_goes_to_the_reference_engine_on_cpu_and_to_vllm_on_gpu(tmp_path):
    dflash2 = read_draft(write_draft(tmp_path / "d", arch="DFlash2DraftModel", dflash_config=dict(
        conv_kernel_size=2, conv_group_size=8, selector_rank=4, selector_top_k=2)))
    engine, [note] = choose_engine(dflash2, CPU_VLLM)
    assert engine == "reference" and "reference engine" in note
    assert choose_engine(dflash2, GPU_VLLM) == ("vllm", [])
    forced_v1 = VllmInfo(**{**GPU_VLLM.__dict__, "v2_runner_env": "0"})
    assert choose_engine(dflash2, forced_v1)[0] == "reference"
    [warning] = anchor_clamp_warning(CPU_VLLM, dflash2)
    assert "clamp(0, V - 1)" in warning
    assert anchor_clamp_warning(VllmInfo(**{**CPU_VLLM.__dict__, "anchor_clamp": True}), dflash2) == []


def test_cpu_attention_head_size_is_checked(tmp_path, target_dir):
    target = read_target(target_dir)
    check_cpu_head_sizes(CPU_VLLM, read_draft(write_draft(tmp_path / "ok")), target)  # 32 has a kernel
    small = read_draft(write_draft(tmp_path / "d", num_attention_heads=4, num_key_value_heads=2, head_dim=16))
    with pytest.raises(ConfigError, match="draft_dir: head_dim=16 has no kernel"):
        check_cpu_head_sizes(CPU_VLLM, small, target)
    narrow = tmp_path / "target16"
    narrow.mkdir()
    config = json.loads((target_dir / "config.json").read_text())
    (narrow / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4, "head_dim": 16}))
    with pytest.raises(ConfigError, match="target_dir: head_dim=16 has no kernel"):
        check_cpu_head_sizes(CPU_VLLM, read_draft(write_draft(tmp_path / "d2")), read_target(narrow))


def test_plan_refuses_before_asking_vllm(tmp_path, target_dir):
    def probe(*_args):
        raise AssertionError("the serving vLLM must not be asked about a draft already refused")

    cfg = ServeConfig(draft_dir=str(write_draft(tmp_path / "d", vocab_size=300)), target_dir=str(target_dir),
                      vllm_python=sys.executable)
    with pytest.raises(ConfigError, match="vocab_size"):
        plan_serving(cfg, probe=probe)


def test_plan_for_a_dflash_draft_on_a_gpu_vllm(tmp_path, target_dir):
    cfg = ServeConfig(draft_dir=str(write_draft(tmp_path / "d")), target_dir=str(target_dir), vllm_python=sys.executable)
    plan = plan_serving(cfg, probe=lambda *_: GPU_VLLM)
    assert (plan.engine, plan.device, plan.num_speculative_tokens, plan.warnings) == ("vllm", "cuda", 3, [])


def test_missing_serving_env_says_make_setup_serve(tmp_path, target_dir):
    cfg = ServeConfig(draft_dir=str(write_draft(tmp_path / "d")), target_dir=str(target_dir),
                      vllm_python=str(tmp_path / "nope" / "python"))
    with pytest.raises(ConfigError, match="make setup-serve"):
        plan_serving(cfg, probe=lambda *_: GPU_VLLM)


def test_the_reference_engine_needs_no_serving_env(tmp_path, target_dir):
    """A GPU machine with torch alone (no vLLM) checks a draft with engine=reference; vLLM is never asked."""
    def probe(*_args):
        raise AssertionError("no serving interpreter to ask")

    cfg = ServeConfig(draft_dir=str(write_draft(tmp_path / "d")), target_dir=str(target_dir),
                      vllm_python=str(tmp_path / "nope" / "python"), engine="reference")
    plan = plan_serving(cfg, probe=probe)
    assert plan.engine == "reference" and plan.vllm.version.startswith("none (no serving environment")


def test_the_reference_engine_does_not_ask_a_serving_env_it_will_not_use(tmp_path, target_dir):
    """engine=reference beside a serving environment: asking vLLM would cost an import of it (9 s on a 2-core
    CPU) for a check that never starts it."""
    def probe(*_args):
        raise AssertionError("vLLM asked for engine=reference")

    cfg = ServeConfig(draft_dir=str(write_draft(tmp_path / "d")), target_dir=str(target_dir),
                      vllm_python=sys.executable, engine="reference")
    plan = plan_serving(cfg, probe=probe)
    assert plan.engine == "reference" and plan.vllm.version == "none (not asked: engine=reference)"


def test_device_mismatch_is_refused(tmp_path, target_dir):
    cfg = ServeConfig(draft_dir=str(write_draft(tmp_path / "d")), target_dir=str(target_dir),
                      vllm_python=sys.executable, device="cuda")
    with pytest.raises(ConfigError, match="device=cuda but the serving vLLM"):
        plan_serving(cfg, probe=lambda *_: CPU_VLLM)

"""Preflight of drafts saved as Qwen3DFlashDraftModel / Qwen3DFlash2DraftModel / Qwen3DSparkDraftModel: accepted as their
kind, served by vLLM where its registry has the alias (vllm_plugin/), refused before any server
with what to install where it has neither the alias nor the plugin."""

import sys

import pytest

from blockdraft.errors import ConfigError
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.draft_aliases import PLUGIN_DIR
from blockdraft.kinds.registry import architectures
from blockdraft.serve.preflight import check_vllm_support, plan_serving, read_draft, read_target
from blockdraft.vllm_runtime.probe import VllmInfo
from tests.unit.test_serve_preflight import CPU_VLLM, GPU_VLLM, write_draft

SERVE_PYTHON = "/srv/.venv-serve/bin/python"
DFLASH2_KEYS = dict(conv_kernel_size=2, conv_group_size=8, selector_rank=4, selector_top_k=2)
ALIASES = ["Qwen3DFlashDraftModel", "Qwen3DFlash2DraftModel", "Qwen3DSparkDraftModel"]


def vllm(base: VllmInfo, plugin: bool, installed: bool = True, **fields) -> VllmInfo:
    """`base` with the alias plugin loaded (its names in the registry) or not."""
    archs = sorted(base.dflash_archs + (ALIASES if plugin else []))
    return VllmInfo(**{**base.__dict__, "dflash_archs": archs, "alias_plugin_installed": installed,
                       "python": SERVE_PYTHON, **fields})


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_tiny_target(tmp_path_factory.mktemp("aliases") / "target")


def plan(tmp_path, target_dir, info, arch="Qwen3DFlashDraftModel", **dflash):
    draft = write_draft(tmp_path / "d", arch=arch, dflash_config=dflash)
    cfg = ServeConfig(draft_dir=str(draft), target_dir=str(target_dir), vllm_python=sys.executable)
    return plan_serving(cfg, probe=lambda *_: info)


def test_the_aliases_are_read_as_their_kinds(tmp_path):
    dflash = read_draft(write_draft(tmp_path / "a", arch="Qwen3DFlashDraftModel"))
    dflash2 = read_draft(write_draft(tmp_path / "b", arch="Qwen3DFlash2DraftModel", dflash_config=DFLASH2_KEYS))
    assert (dflash.kind, dflash.architecture) == ("dflash", "Qwen3DFlashDraftModel")
    assert (dflash2.kind, dflash2.architecture) == ("dflash2", "Qwen3DFlash2DraftModel")


def test_the_dspark_alias_is_read_as_dspark_and_its_layout(tmp_path):
    anchor_first = read_draft(write_draft(tmp_path / "a", arch="Qwen3DSparkDraftModel", sample_from_anchor=True))
    fill_in = read_draft(write_draft(tmp_path / "b", arch="Qwen3DSparkDraftModel", sample_from_anchor=False))
    assert (anchor_first.kind, anchor_first.architecture, anchor_first.trained_tokens) == ("dspark", "Qwen3DSparkDraftModel", 4)
    assert (fill_in.kind, fill_in.trained_tokens) == ("dspark", 3)
    assert architectures()["Qwen3DSparkDraftModel"] == architectures()["Qwen3DSparkModel"] == "dspark"


def test_a_dspark_alias_goes_where_dspark_goes(tmp_path, target_dir):
    # On a CPU vLLM, to the reference engine (vLLM runs DSpark in its V2 GPU runner only); on a GPU one, to vLLM.
    cpu = plan(tmp_path, target_dir, vllm(CPU_VLLM, plugin=False, installed=False), "Qwen3DSparkDraftModel")
    assert cpu.engine == "reference" and any("cannot run DSpark" in w for w in cpu.warnings)
    gpu = plan(tmp_path, target_dir, vllm(GPU_VLLM, plugin=True), "Qwen3DSparkDraftModel")
    assert gpu.engine == "vllm" and gpu.num_speculative_tokens == 4  # sample_from_anchor absent: vLLM's true


def test_a_dflash_alias_is_served_by_vllm_with_the_plugin(tmp_path, target_dir):
    assert plan(tmp_path, target_dir, vllm(CPU_VLLM, plugin=True)).engine == "vllm"


def test_a_dflash2_alias_goes_where_dflash2_goes(tmp_path, target_dir):
    # On a CPU vLLM, to the reference engine (no server, so no plugin needed); on a GPU one, to vLLM.
    cpu = plan(tmp_path, target_dir, vllm(CPU_VLLM, plugin=False, installed=False), "Qwen3DFlash2DraftModel", **DFLASH2_KEYS)
    assert cpu.engine == "reference" and any("cannot run DFlash2" in w for w in cpu.warnings)
    gpu = plan(tmp_path, target_dir, vllm(GPU_VLLM, plugin=True), "Qwen3DFlash2DraftModel", **DFLASH2_KEYS)
    assert gpu.engine == "vllm"


@pytest.mark.parametrize("base,arch", [(CPU_VLLM, "Qwen3DFlashDraftModel"), (GPU_VLLM, "Qwen3DFlash2DraftModel"),
                                       (GPU_VLLM, "Qwen3DSparkDraftModel")])
def test_without_the_plugin_preflight_says_what_to_install(tmp_path, target_dir, base, arch):
    with pytest.raises(ConfigError) as refusal:
        plan(tmp_path, target_dir, vllm(base, plugin=False, installed=False), arch, **DFLASH2_KEYS)
    message = str(refusal.value)
    assert f"architectures=['{arch}']" in message and "not installed" in message
    assert "`make setup-serve`" in message and f"`{SERVE_PYTHON} -m pip install {PLUGIN_DIR}`" in message


def test_a_plugin_left_out_by_vllm_plugins_is_named(tmp_path, target_dir):
    info = vllm(CPU_VLLM, plugin=False, vllm_plugins_env="lora_filesystem_resolver")
    with pytest.raises(ConfigError, match="VLLM_PLUGINS='lora_filesystem_resolver' leaves it out: add blockdraft_dflash_aliases"):
        plan(tmp_path, target_dir, info)


def test_a_target_without_the_hidden_state_interface_still_fails_first(tmp_path, target_dir):
    draft, target = read_draft(write_draft(tmp_path / "d", arch="Qwen3DFlashDraftModel")), read_target(target_dir)
    target.architecture = "GPT2LMHeadModel"
    info = vllm(CPU_VLLM, plugin=True, arch_supports_eagle3=False)
    with pytest.raises(ConfigError, match="'GPT2LMHeadModel' cannot expose the hidden states"):
        check_vllm_support(info, draft, target)

"""vllm_plugin/ in the real serving vLLM: a DFlash2 draft saved as Qwen3DFlash2DraftModel is taken
for DFlash2 (never plain DFlash), and without the plugin the preflight says what to install.
(A Qwen3DFlashDraftModel draft served losslessly through the plugin: test_eval.py's "barely".)"""

import json
from dataclasses import replace

import pytest

from blockdraft.errors import ConfigError
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.preflight import plan_serving
from blockdraft.vllm_runtime.probe import probe_vllm
from blockdraft.vllm_runtime.server import ServerError, VllmServer, server_settings
from tests.integration.conftest import REPO, export_here
from tests.integration.renamed_draft import renamed_copy
from tests.unit.test_serve_preflight import write_draft

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]


def test_a_dflash2_draft_saved_as_qwen3dflash2draftmodel_is_taken_for_dflash2(tiny_dflash2_run, tmp_path):
    export = export_here(tiny_dflash2_run, tmp_path / "export")
    draft = renamed_copy(export, tmp_path / "alias", "Qwen3DFlash2DraftModel")
    args, env = server_settings("cpu", max_model_len=512, max_num_seqs=2, kv_cache_gib=1)
    log = tmp_path / "vllm.log"
    server = VllmServer(SERVE_PYTHON, str(TARGET), log_path=log, args=args, env=env, startup_timeout_s=300,
                        speculative_config={"method": "dflash", "model": str(draft), "num_speculative_tokens": 3})
    with pytest.raises(ServerError, match="exited with code"):
        server.start()
    text = log.read_text()
    assert "draft architectures ['Qwen3DFlash2DraftModel'] read as ['DFlash2DraftModel']" in text
    # vLLM's own refusal, which it makes only for a draft it selects as DFlash2 by that name: its V1
    # runner (the only one on a CPU) would run it as plain DFlash. A GPU vLLM runs it on V2.
    assert "Model Runner V1 does not support: DFlash candidate-head drafts" in text
    assert json.loads((draft / "config.json").read_text())["architectures"] == ["Qwen3DFlash2DraftModel"]


@pytest.mark.slow  # the refusal's wording: tests/unit/test_serve_draft_aliases.py, without a vLLM start
def test_without_the_plugin_the_preflight_says_what_to_install(tmp_path, monkeypatch):
    # VLLM_PLUGINS is vLLM's allow-list of general plugins: naming another one leaves ours out.
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    draft = write_draft(tmp_path / "draft", arch="Qwen3DFlashDraftModel")
    cfg = ServeConfig(draft_dir=str(draft), target_dir=str(save_tiny_target(tmp_path / "target")),
                      vllm_python=str(SERVE_PYTHON))
    answers = []

    def probe(python, architecture):
        answers.append(probe_vllm(python, architecture))
        return answers[-1]

    with pytest.raises(ConfigError, match="VLLM_PLUGINS='lora_filesystem_resolver' leaves it out: add blockdraft_dflash_aliases"):
        plan_serving(cfg, probe=probe)
    [info] = answers
    assert info.alias_plugin_installed and "DFlashDraftModel" in info.dflash_archs
    assert "Qwen3DFlashDraftModel" not in info.dflash_archs
    # The same registry where the plugin is not installed at all: the refusal says what to install.
    with pytest.raises(ConfigError) as refusal:
        plan_serving(cfg, probe=lambda *_: replace(info, alias_plugin_installed=False))
    message = str(refusal.value)
    assert "`make setup-serve`" in message and f"`{SERVE_PYTHON} -m pip install {REPO / 'vllm_plugin'}`" in message

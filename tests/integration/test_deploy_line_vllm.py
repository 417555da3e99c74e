"""Each kind's deploy line, as the export, the model card and the pipeline print it, read by vLLM 0.32 itself:
`vllm serve`'s own parser and validation, then its SpeculativeConfig built from the parsed engine arguments,
then the model runner it picks with the line's environment and without it. All kinds in one interpreter of
the serving environment (tests/integration/vllm_deploy_check.py): its import is most of the cost.

On a CPU vLLM has no Triton, so a V2-only kind is refused either way: with the line's VLLM_USE_V2_MODEL_RUNNER=1
by V2 ("requires Triton", what a GPU has), without it by V1 (which never runs the kind at all)."""

import io
import json
import os

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from blockdraft.config import compose
from blockdraft.export.__main__ import run as export_app
from blockdraft import kinds
from blockdraft.export.deploy_line import export_deploy_line, vllm_method
from blockdraft.export.writer import export_draft
from blockdraft.models.io import save_draft
from blockdraft.pipeline.deploy import print_deploy
from tests.integration.conftest import REPO
from tests.integration.serving_env import serving_run
from tests.unit.export_helpers import make_run

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.is_file(), reason=f"no serving env at {SERVE_PYTHON}; run `make setup-serve`"),
]

CASES = {
    "dflash": dict(kind="dflash"),
    "jetspec": dict(kind="jetspec"),
    "dflash2": dict(kind="dflash2"),
    "dspark": dict(kind="dspark", markov_rank=8),
    "dspark_fill_in": dict(kind="dspark", markov_rank=8, sample_from_anchor=False),
    # A reduced vocabulary (its own head and d2t) and a trained mask embedding: the files beside the line.
    "dflash_reduced_masked": dict(kind="dflash", draft_vocab_size=40, train_mask_embedding=True),
}


def _export(tmp_path, name, settings):
    step_dir, draft = make_run(tmp_path / name, target_path=str(TARGET), **settings)
    if draft.reduced_vocab:
        head = load_file(str(TARGET / "model.safetensors"))["lm_head.weight"]
        draft.set_draft_vocab(torch.arange(settings["draft_vocab_size"]) * 2, head)
        save_draft(step_dir, draft)
    return export_draft(step_dir, tmp_path / f"{name}_export", dtype="float32", target_dir=TARGET), draft.config


def _printed_lines(export) -> dict:
    """The line where each place prints it: the export app (its `inspect` of the export), the model card, the
    pipeline's summary."""
    inspected = export_app(OmegaConf.to_object(compose("export", [f"inspect={export}"])))
    card = (export / "README.md").read_text()
    summary = io.StringIO()
    print_deploy(export, {"passed": True}, summary)

    def line_in(text):
        return next(line.strip() for line in text.splitlines() if "vllm serve " in line)

    return {"export": line_in(inspected), "model card": line_in(card), "pipeline": line_in(summary.getvalue())}


def test_vllm_parses_each_kinds_deploy_line_into_the_speculative_config_the_draft_needs(tmp_path):
    lines, configs = {}, {}
    for name, settings in CASES.items():
        export, configs[name] = _export(tmp_path, name, settings)
        printed = _printed_lines(export)
        assert len(set(printed.values())) == 1, printed  # one function, printed everywhere
        lines[name] = printed["export"]
        assert lines[name] == export_deploy_line(export).command
    (tmp_path / "cases.json").write_text(json.dumps(lines))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    proc = serving_run(["tests/integration/vllm_deploy_check.py", str(tmp_path / "cases.json")], cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {r["name"]: r for r in (json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines()
                                      if line.startswith("RESULT "))}
    assert set(results) == set(CASES), proc.stdout[-3000:]
    for name, got in results.items():
        cfg = configs[name]
        assert got["target"] == str(TARGET) and got["model"] == str(tmp_path / f"{name}_export"), got
        assert got["method"] == vllm_method(cfg.kind), got
        assert kinds.get(cfg.kind).architecture in got["architectures"], got
        # What one round drafts, counted from the block as the draft's layout trained it.
        assert got["num_speculative_tokens"] == cfg.block_size - (0 if cfg.anchor_predicts else 1), got
        assert got["draft_vocab_size"] == cfg.draft_vocab_size, got
        if not kinds.get(cfg.kind).v2_runner:
            assert got["env"] == {} and got["with_env"].startswith("ok"), got
            continue
        assert got["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "1"}, got
        if got["with_env"] != "ok: V2 model runner":  # no Triton here: V2 says so, and V1 never runs the kind
            assert "Model Runner V2 requires Triton" in got["with_env"], got
            assert "Model Runner V1 does not support" in got["without_env"], got

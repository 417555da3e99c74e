"""A LiLiCorr export against vLLM 0.32's own code: its config reading, its loader's coverage rule, its head.

vLLM runs LiLiCorr only in its V2 GPU model runner, so no engine starts with it on a CPU;
scripts/check_vllm_lilicorr.py builds vLLM's LiLiCorrForCausalLM on the CPU instead, feeds its
load_weights the export (which refuses a missing `lilicorr.` tensor and materializes the head's
inference buffers), and runs its LiLiCorrHead on a lattice chosen here. Training's scores must match.
"""

import os

import pytest
import torch

from blockdraft.export.writer import export_draft
from blockdraft.models.io import save_draft
from tests.integration.conftest import REPO
from tests.integration.serving_env import serving_run
from tests.unit.export_helpers import make_run

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.is_file(), reason=f"no serving env at {SERVE_PYTHON}; run `make setup-serve`"),
]
# vLLM computes in float32 like us, from split and stacked copies of the same weights.
ATOL = 1e-5


def _export(tmp_path):
    """The default layout (DFlash2 convolution on), a lattice of 4 candidates, a head narrower than the
    draft (so token_proj exists), every head parameter moved off its zero or identity init."""
    step_dir, draft = make_run(tmp_path / "run", kind="lilicorr", target_path=str(TARGET), lilicorr_candidate_topk=4,
                               lilicorr_hidden_size=32, lilicorr_factor_dim=16)
    torch.manual_seed(5)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name.startswith("lilicorr."):
                param.normal_(0.0, 0.3)
    save_draft(step_dir, draft)
    return export_draft(step_dir, tmp_path / "export", dtype="float32", target_dir=TARGET), draft


def _lattice(cfg, n: int = 3) -> dict:
    g = torch.Generator().manual_seed(1)
    slots, k, h = cfg.block_size - 1, cfg.lilicorr_candidate_topk, cfg.hidden_size
    log_probs = torch.log_softmax(torch.randn(n, slots, 40, generator=g), -1).topk(k, -1).values
    return {"token_embeddings": torch.randn(n, slots, k, h, generator=g), "candidate_log_probs": log_probs,
            "pass_hidden": torch.randn(n, slots, h, generator=g), "anchor_hidden": torch.randn(n, h, generator=g),
            "anchor_valid": torch.tensor([True, False, True][:n])}


def test_vllm_loads_our_lilicorr_export_and_scores_its_lattice_as_training_does(tmp_path):
    export, draft = _export(tmp_path)
    inputs = _lattice(draft.config)
    torch.save(inputs, tmp_path / "in.pt")
    with torch.no_grad():
        ours = draft.eval().lilicorr(**inputs)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    proc = serving_run(["scripts/check_vllm_lilicorr.py", "--target", str(TARGET), "--draft", str(export),
                        "--inputs", str(tmp_path / "in.pt"), "--out", str(tmp_path / "out.pt")], cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "method=dflash" in proc.stdout and "architectures=['LiLiCorrDraftModel']" in proc.stdout
    assert "LiLiCorr checkpoint coverage mismatch" in proc.stdout  # the rule refused a file less one tensor
    assert "all equal" in proc.stdout
    theirs = torch.load(tmp_path / "out.pt")["scores"]
    assert theirs.shape == ours.shape == (3, draft.config.block_size - 1, 4, 4)
    assert torch.allclose(theirs, ours, atol=ATOL, rtol=0), (theirs - ours).abs().max()

"""The GPU pipeline run (scripts/gpu_pipeline.sh) is ready before any GPU time is spent: its dry run
runs the same two pipelines on this CPU at a tiny width, every stage of each, the second keeping the
first's regen and capture."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_pipeline_s_dry_run_passes_every_stage(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_WAIT_POLICY": "PASSIVE", "GPU_PIPELINE_OUT": str(tmp_path / "run")}
    results = tmp_path / "results.md"
    proc = subprocess.run(["bash", "scripts/gpu_pipeline.sh", "--dry-run", "--results", str(results)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = results.read_text()
    assert text.count("exit code: 0") == 3  # the target, then both pipelines
    assert text.count("result                    PASS") == 2 and text.count("lossless                  yes") == 2
    # As on the GPU machine: no serving environment, and none asked for.
    runs = text.split("## pipeline:")[1:]
    assert len(runs) == 2 and all("vLLM                      none (no serving environment; engine=reference)" in run
                                  for run in runs)
    dflash2 = text.split("## pipeline: smollm2_dflash2_cpu")[1]
    assert "regen    cached" in dflash2 and "capture  cached" in dflash2
    for stage in ("gate", "train", "export", "serve"):
        assert f"{stage:8s} done" in dflash2.split("each stage's seconds")[1], stage

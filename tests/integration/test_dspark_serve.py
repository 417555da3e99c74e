"""A trained tiny DSpark draft end to end: trained with its confidence head, exported for vLLM's
`method: dspark`, decoded by the reference engine as vLLM's speculator decodes it (lossless against
the target), with the head's calibration; and on this CPU the smoke-serve harness says in one line
that vLLM cannot run it and checks it on the reference engine."""

import json
import os
import subprocess
import sys

import pytest

from blockdraft.export.writer import export_draft
from blockdraft.serve.preflight import read_draft
from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO, decode_heldout_losslessly

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
NUM_PROMPTS = 4  # of the recipe's 16 held-out prompts: enough to exercise every slot, cheap to decode


@pytest.fixture(scope="module")
def dspark_export(tiny_dspark_run, tmp_path_factory):
    return export_draft(tiny_dspark_run, tmp_path_factory.mktemp("dspark") / "export", dtype="float32", target_dir=TARGET)


def test_trained_dspark_export_is_lossless_on_the_reference_engine(tiny_dspark_run, dspark_export):
    val = [r for r in read_metrics(tiny_dspark_run) if r.get("split") == "val"][-1]
    assert 0.0 <= val["val/confidence_mean"] <= 1.0 and val["val/confidence_loss"] > 0
    facts = read_draft(dspark_export)
    assert (facts.architecture, facts.kind, facts.vllm_servable) == ("Qwen3DSparkModel", "dspark", True)
    assert facts.trained_tokens == facts.block_size  # the anchor predicts: every slot drafts
    engine, stats = decode_heldout_losslessly(dspark_export, NUM_PROMPTS)
    assert engine.k == facts.block_size
    calibration = stats.calibration()
    per_position = [round(n / stats.num_drafts, 3) for n in stats.accepted_per_position()]
    print(f"dspark: reference engine mean acceptance {stats.mean_acceptance_length:.3f} over {stats.num_drafts} drafts "
          f"(per position {per_position}), training val accept_len {val['val/accept_len']:.3f}; calibration "
          + ", ".join(f"slot {c.position} {c.mean_confidence:.2f} vs {c.acceptance_rate:.2f}" for c in calibration if c.reached))
    assert stats.mean_acceptance_length > 1.5  # the trained draft is accepted, not merely lossless
    assert [c.position for c in calibration] == list(range(1, engine.k + 1)) and calibration[0].reached == stats.num_drafts


@pytest.mark.slow  # a vLLM probe (~20 s); the engine choice itself is unit-tested in test_serve_preflight.py
def test_the_harness_says_vllm_cannot_run_it_here_and_uses_the_reference_engine(dspark_export, tmp_path):
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "blockdraft.serve", f"draft={dspark_export}", f"target={TARGET}",
                           "prompts=tiny", "num_prompts=2", "max_tokens=16", f"out={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "cannot run DSpark" in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["engine"] == "reference" and report["lossless"] and report["confidence_calibration"]

"""A reduced-vocabulary DFlash draft end to end: trained from a store, exported, served by real vLLM."""

import json
import subprocess
import sys

import pytest

from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO, smoke_serve_tiny, train_tiny

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]
# The tiny recipe's replies use 34 distinct tokens: 28 leaves a few labels outside the vocabulary.
DRAFT_VOCAB = 28


@pytest.fixture(scope="module")
def reduced_export(fp32_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("reduced")
    run = train_tiny(root / "run", "train.max_steps=120", f"data.features={fp32_store}", f"draft.draft_vocab_size={DRAFT_VOCAB}")
    export = root / "export"
    subprocess.run([sys.executable, "-m", "blockdraft.export", f"checkpoint={run}", f"out={export}", "dtype=float32"],
                   cwd=REPO, check=True, capture_output=True)
    return run, export


def test_reduced_vocabulary_is_trained_and_exported_as_vllm_reads_it(reduced_export):
    run, export = reduced_export
    rows = [r for r in read_metrics(run) if "split" not in r]
    shares = [r["label_outside_vocab_share"] for r in rows]  # rare labels: some windows hold none
    assert max(shares) > 0 and all(0 <= s < 0.05 for s in shares)
    assert rows[-1]["accept_len"] > rows[0]["accept_len"]
    config = json.loads((export / "config.json").read_text())
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["vocab_size"] == 268


def test_reduced_vocabulary_draft_is_lossless_and_active_in_vllm(reduced_export, tmp_path):
    _, export = reduced_export
    out = tmp_path / "report"
    report = smoke_serve_tiny(export, out)
    assert report["engine"] == "vllm" and report["lossless"] is True and report["draft_active"] is True
    assert report["mean_acceptance_length"] > 1.2
    assert len(report["acceptance_per_position"]) == 3
    # vLLM kept the draft's own head (a shared target head would be [V, H] and fail to load).
    assert "Keeping separate lm_head weights" in (out / "vllm_draft.log").read_text()


def test_reduced_vocabulary_export_loads_in_vllm_with_every_weight(reduced_export):
    from tests.integration.test_vllm_weight_load import check_weights

    proc = check_weights(reduced_export[1])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "0 missing, 0 unexpected, all equal" in proc.stdout

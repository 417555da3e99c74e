"""A draft with a trained mask embedding: vLLM fills its parameter with exactly the trained vector.
(The eval test serves a mask-embedding draft losslessly and checks vLLM's load line.)"""

import subprocess
import sys

import pytest

from tests.integration.conftest import REPO, train_tiny

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]


@pytest.fixture(scope="module")
def mask_export(fp32_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("mask_embedding")
    run = train_tiny(root / "run", "train.max_steps=120", f"data.features={fp32_store}", "draft.train_mask_embedding=true")
    export = root / "export"
    subprocess.run([sys.executable, "-m", "blockdraft.export", f"checkpoint={run}", f"out={export}", "dtype=float32"],
                   cwd=REPO, check=True, capture_output=True)
    return export


# Slow (make test-slow): in make test the eval serves a mask-embedding draft losslessly and checks
# vLLM's load line for it.
@pytest.mark.slow
def test_trained_mask_embedding_fills_vllm_s_parameter_exactly(mask_export):
    from tests.integration.test_vllm_weight_load import check_weights

    assert (mask_export / "mask_embedding.pt").is_file()
    proc = check_weights(mask_export)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "0 missing, 0 unexpected, all equal" in proc.stdout

"""A reduced-vocabulary DFlash draft: trained from a store, exported as vLLM reads it, every weight
loaded by real vLLM. (The eval test serves it: lossless, active, its own head kept.)"""

import json

import pytest

from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REDUCED_VOCAB as DRAFT_VOCAB
from tests.integration.conftest import REPO

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]


@pytest.fixture(scope="module")
def reduced_export(reduced_vocab_export):
    return reduced_vocab_export


def test_reduced_vocabulary_is_trained_and_exported_as_vllm_reads_it(reduced_export):
    run, export = reduced_export
    rows = [r for r in read_metrics(run) if "split" not in r]
    shares = [r["label_outside_vocab_share"] for r in rows]  # rare labels: some windows hold none
    assert max(shares) > 0 and all(0 <= s < 0.05 for s in shares)
    assert rows[-1]["accept_len"] > rows[0]["accept_len"]
    config = json.loads((export / "config.json").read_text())
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["vocab_size"] == 268


# Slow (make test-slow): in make test vLLM serves reduced-vocabulary drafts in the eval and in the gate,
# which a head loaded wrongly would fail (no acceptance).
@pytest.mark.slow
def test_reduced_vocabulary_export_loads_in_vllm_with_every_weight(reduced_export):
    from tests.integration.test_vllm_weight_load import check_weights

    proc = check_weights(reduced_export[1])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "0 missing, 0 unexpected, all equal" in proc.stdout

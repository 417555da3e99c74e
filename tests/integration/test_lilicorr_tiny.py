"""`draft=lilicorr` end to end on the tiny recipe: the trainer's loop learns it, the export serves it losslessly
on the reference engine, and its serve line is vLLM's V2 one. The parts are covered fast in tests/unit
(test_lilicorr*.py); this is the whole path through the apps."""

import pytest

from blockdraft.export.deploy_line import export_deploy_line
from blockdraft.export.writer import export_draft
from blockdraft.train.logger import read_metrics
from tests.integration.conftest import decode_heldout_losslessly, train_tiny

pytestmark = pytest.mark.slow


def test_tiny_lilicorr_trains_exports_and_decodes_losslessly(tmp_path):
    run = train_tiny(tmp_path / "run", "draft=lilicorr")
    rows = [r for r in read_metrics(run) if "split" not in r]
    assert rows[-1]["loss"] < rows[0]["loss"] and rows[-1]["selector_loss"] < rows[0]["selector_loss"]
    assert 0 < rows[-1]["candidate_recall"] <= 1
    export = export_draft(run, tmp_path / "export", dtype="float32")
    line = export_deploy_line(export)
    assert line.command.startswith("VLLM_USE_V2_MODEL_RUNNER=1 vllm serve") and '"method": "dflash"' in line.command
    _, stats = decode_heldout_losslessly(export, num_prompts=2)
    assert stats.num_drafts > 0

"""A trained tiny Domino draft end to end: exported as a directory marked not vLLM-servable, read
back by the importer, and decoded by the reference engine losslessly against the target."""

from blockdraft.export.writer import export_draft
from blockdraft.serve.preflight import read_draft
from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO, decode_heldout_losslessly

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
NUM_PROMPTS = 6  # of the recipe's 16 held-out prompts: enough to exercise every slot, cheap to decode


def test_trained_domino_export_is_lossless_on_the_reference_engine(tiny_domino_run, tmp_path):
    out = export_draft(tiny_domino_run, tmp_path / "domino", dtype="float32", target_dir=TARGET)
    assert read_draft(out).vllm_servable is False
    engine, stats = decode_heldout_losslessly(out, NUM_PROMPTS)
    assert engine.draft.config.kind == "domino"
    per_position = [round(n / stats.num_drafts, 3) for n in stats.accepted_per_position()]
    val_accept = [r for r in read_metrics(tiny_domino_run) if r.get("split") == "val"][-1]["val/accept_len"]
    print(f"domino: reference engine mean acceptance {stats.mean_acceptance_length:.3f} over {stats.num_drafts} drafts "
          f"(per position {per_position}), training val accept_len {val_accept:.3f}")
    assert stats.mean_acceptance_length > 1.5  # the trained draft is accepted, not merely lossless
    assert all(rate > 0 for rate in per_position)  # and every drafted slot, corrected serially, is used

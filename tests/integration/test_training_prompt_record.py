"""The record of training prompts travels: training writes it into its run and each checkpoint, from a
data file or a feature store alike, and export carries it into the draft directory, named in
blockdraft_export.json and the model card. Each test reads a run or a store other tests make anyway."""

import json

from blockdraft.data.prompt_record import RECORD_NAME, PromptRecord, prompt_hash
from blockdraft.export.writer import EXPORT_INFO, export_draft
from tests.integration.conftest import REPO, train_tiny

ROWS = REPO / ".cache" / "tiny_cpu"


def prompts_of(path) -> set:
    """The prompt hash of every row of a JSONL file, read apart from training's own reading."""
    return {prompt_hash(json.loads(line)["messages"]) for line in path.read_text().splitlines() if line.strip()}


def test_training_records_its_prompts_and_export_carries_them(tiny_dflash_run, tmp_path):
    trained, held_out = prompts_of(ROWS / "train.jsonl"), prompts_of(ROWS / "val.jsonl")
    record = PromptRecord.read(tiny_dflash_run / RECORD_NAME)
    assert set(record.hashes.tolist()) == trained and record.complete  # the training rows, not the validation ones
    assert (tiny_dflash_run / RECORD_NAME).stat().st_size == 24 + 8 * len(trained)
    final = tiny_dflash_run / "checkpoints" / "step_120" / RECORD_NAME
    assert final.read_bytes() == (tiny_dflash_run / RECORD_NAME).read_bytes()

    export = export_draft(tiny_dflash_run, tmp_path / "export", dtype="float32")
    assert (export / RECORD_NAME).read_bytes() == final.read_bytes()
    info = json.loads((export / EXPORT_INFO).read_text())
    assert info["training_prompts"] == {"file": RECORD_NAME, "prompts": len(trained), "complete": True}
    assert f"- training prompts: {len(trained)}, recorded in `{RECORD_NAME}`" in (export / "README.md").read_text()
    assert set(json.loads((export / "checksums.json").read_text())) >= {RECORD_NAME}
    # What the serve check will find: every training prompt, and a validation prompt only where the
    # tiny recipe's random prompts repeat one of them.
    assert PromptRecord.read(export / RECORD_NAME).contains(sorted(held_out)).sum() == len(held_out & trained)


def test_a_feature_store_carries_the_prompts_to_a_run_trained_from_it(fp32_store, tmp_path):
    from blockdraft.data.feature_store import FeatureStore, FeatureStoreDataset

    store = FeatureStoreDataset(FeatureStore.open(fp32_store), "train")
    assert set(store.prompt_hashes().tolist()) == prompts_of(ROWS / "train.jsonl")
    run = train_tiny(tmp_path / "run", "train.max_steps=1", "data.val=null", f"data.features={fp32_store}",
                     "data.max_rows=5")
    # data.max_rows=5 trains on the store's first five rows: the record names their prompts only.
    first = {prompt_hash(json.loads(line)["messages"]) for line in (ROWS / "train.jsonl").read_text().splitlines()[:5]}
    assert set(PromptRecord.read(run / RECORD_NAME).hashes.tolist()) == first

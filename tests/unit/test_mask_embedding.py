"""A trained mask embedding: what the draft embeds, and how the export carries it to vLLM."""

import pytest
import torch
from safetensors import safe_open

from blockdraft.draft_format.importer import import_draft
from blockdraft.draft_format.mask_embedding import MASK_EMBEDDING_FILE, write_mask_embedding
from blockdraft.errors import ConfigError
from blockdraft.export.writer import export_draft
from blockdraft.models.io import save_draft
from tests.unit.export_helpers import MASK_ID, TINY_VOCAB, make_draft, make_run


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_mask_slots_take_the_trained_vector_and_other_slots_their_rows(kind):
    draft = make_draft(kind, train_mask_embedding=True)
    table = torch.nn.Embedding(TINY_VOCAB, draft.config.hidden_size)
    draft.init_mask_embedding(table.weight, "mean")
    torch.testing.assert_close(draft.mask_embedding.detach(), table.weight.mean(0).detach())
    draft.init_mask_embedding(table.weight, "token")
    with torch.no_grad():
        draft.mask_embedding.add_(1.0)  # now unlike any row of the table
    ids = torch.tensor([[5, MASK_ID, MASK_ID, 7]])
    out = draft.embed(ids, table)
    torch.testing.assert_close(out[0, 1], draft.mask_embedding.detach())
    torch.testing.assert_close(out[0, 0], table.weight[5].detach())
    torch.testing.assert_close(out[0, 3], table.weight[7].detach())


def test_export_writes_mask_embedding_pt_outside_the_safetensors_and_reads_it_back(tmp_path):
    step_dir, trained = make_run(tmp_path / "run", "dflash", train_mask_embedding=True)
    with torch.no_grad():
        trained.mask_embedding.normal_()
    save_draft(step_dir, trained)
    out = export_draft(tmp_path / "run", tmp_path / "out", dtype="float32")  # its reload check compares logits
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert "mask_embedding" not in set(f.keys())
    saved = torch.load(out / MASK_EMBEDDING_FILE, weights_only=True)
    assert saved["mask_token_id"] == MASK_ID  # the dict form vLLM checks against dflash_config
    torch.testing.assert_close(saved["embedding"], trained.mask_embedding.detach())
    draft, cfg = import_draft(out)
    assert cfg.train_mask_embedding
    torch.testing.assert_close(draft.mask_embedding.detach(), trained.mask_embedding.detach())


def test_a_mask_embedding_for_another_token_is_refused(tmp_path):
    step_dir, trained = make_run(tmp_path / "run", "dflash", train_mask_embedding=True)
    out = export_draft(tmp_path / "run", tmp_path / "out", dtype="float32")
    (out / "checksums.json").unlink()
    write_mask_embedding(out, trained.mask_embedding.detach(), MASK_ID + 1)
    with pytest.raises(ConfigError, match="is for mask_token_id 263"):
        import_draft(out)

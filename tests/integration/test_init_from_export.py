"""`init_from=<exported draft>`: a run starts from the export's weights (each kind's export carries only its own keys)."""

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.export.writer import export_draft
from tests.integration.conftest import train_tiny


@pytest.mark.parametrize("run_fixture", ["tiny_dflash_run", "tiny_dflash2_run"])
def test_a_run_starts_from_an_exported_draft(run_fixture, request, tmp_path):
    export = export_draft(request.getfixturevalue(run_fixture), tmp_path / "export", dtype="float32")
    kind = ["draft=dflash2"] if run_fixture == "tiny_dflash2_run" else []
    # lr 1e-12: one step moves no weight measurably, so the saved step equals where the run started.
    run = train_tiny(tmp_path / "run", *kind, f"init_from={export}", "train.max_steps=1", "optim.lr=1e-12",
                     "optim.weight_decay=0.0", "data.val=null", "train.save_every=1")
    exported = load_file(str(next(export.glob("*.safetensors"))))
    started = load_file(str(run / "checkpoints" / "step_1" / "model.safetensors"))
    shared = [k for k in exported if k in started and exported[k].shape == started[k].shape]
    assert len(shared) >= len(exported) // 2, (sorted(exported)[:5], sorted(started)[:5])
    for k in shared:
        torch.testing.assert_close(started[k], exported[k], rtol=0, atol=1e-6, msg=k)

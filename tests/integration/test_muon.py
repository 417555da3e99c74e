"""optim.name=muon: Muon for the draft's matrices, AdamW for the rest, resumed like AdamW."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.errors import ConfigError
from tests.integration.conftest import train_tiny
from tests.integration.test_train_tiny import _train_rows

ARGS = ["optim=muon", "train.max_steps=40", "train.log_every=10", "train.save_every=20", "train.keep_last=5", "data.val=null"]


def test_muon_learns_and_resumes_to_the_same_run(tmp_path):
    full = train_tiny(tmp_path / "full", *ARGS)
    rows = _train_rows(full)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.2
    state = torch.load(full / "checkpoints" / "step_40" / "trainer_state.pt", weights_only=False)
    assert set(state["optimizer"]) == {"muon", "adamw"} and state["optimizer"]["muon"]["state"]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_20", resumed / "checkpoints" / "step_20")
    train_tiny(resumed, *ARGS, "resume=must")
    want = {r["step"]: r["loss"] for r in rows}
    for r in _train_rows(resumed):
        assert r["loss"] == pytest.approx(want[r["step"]], rel=1e-5)
    a, b = load_file(str(full / "checkpoints/step_40/model.safetensors")), load_file(str(resumed / "checkpoints/step_40/model.safetensors"))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-7)


def test_resuming_an_adamw_run_with_muon_is_refused(tmp_path):
    run = train_tiny(tmp_path / "run", "train.max_steps=5", "data.val=null")
    with pytest.raises(ConfigError, match="trained with optim.name=adamw, this run sets optim.name=muon"):
        train_tiny(run, "optim=muon", "train.max_steps=10", "resume=auto", "data.val=null")
    with pytest.raises(ConfigError, match="trained with optim.name=muon"):
        train_tiny(tmp_path / "muon", "optim=muon", "train.max_steps=5", "data.val=null")
        train_tiny(tmp_path / "muon", "train.max_steps=10", "resume=auto", "data.val=null")

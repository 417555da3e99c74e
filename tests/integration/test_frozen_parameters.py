"""train.frozen: the named draft parameters stay as initialised through training, the others learn, and a
pattern that names nothing is refused before any step."""

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.errors import ConfigError
from tests.integration.conftest import train_tiny


def _weights(run, step):
    return load_file(str(run / "checkpoints" / f"step_{step}" / "model.safetensors"))


def test_frozen_mlp_stays_as_copied_from_the_target_while_the_rest_trains(fp32_store, tmp_path, capsys):
    args = ["train.log_every=1", "train.save_every=1", "init_from_target=true", "data.val=null", f"data.features={fp32_store}"]
    start = _weights(train_tiny(tmp_path / "start", "train.max_steps=1", "optim.lr=0", *args), 1)
    run = train_tiny(tmp_path / "frozen", "train.max_steps=4", "train.frozen=[mlp]", *args)
    assert "[frozen] kept as initialised: layers.0.mlp.gate_proj.weight, layers.0.mlp.up_proj.weight, " \
           "layers.0.mlp.down_proj.weight" in capsys.readouterr().out
    end = _weights(run, 4)
    mlp = [k for k in end if ".mlp." in k]
    assert len(mlp) == 3
    for key in mlp:
        torch.testing.assert_close(end[key], start[key], rtol=0, atol=0)
    assert not torch.equal(end["layers.0.self_attn.q_proj.weight"], start["layers.0.self_attn.q_proj.weight"])
    assert not torch.equal(end["fc.weight"], start["fc.weight"])


@pytest.mark.parametrize("patterns, says", [
    ("[mpl]", "'mpl' names no trainable parameter of this draft; its parameters are"),
    ("[layers,fc,norm]", "freezes every trainable parameter"),
])
def test_a_bad_frozen_pattern_is_refused_before_any_step(fp32_store, tmp_path, patterns, says):
    with pytest.raises(ConfigError, match=says):
        train_tiny(tmp_path / "run", f"train.frozen={patterns}", "data.val=null", f"data.features={fp32_store}")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_resume_with_another_frozen_set_is_refused_naming_both(fp32_store, tmp_path):
    args = ["train.save_every=2", "data.val=null", f"data.features={fp32_store}"]
    run = train_tiny(tmp_path / "run", "train.max_steps=2", "train.frozen=[mlp]", *args)
    with pytest.raises(ConfigError, match=r"train.frozen=\['mlp'\], this run sets train.frozen=\[\]"):
        train_tiny(run, "train.max_steps=4", "resume=auto", *args)

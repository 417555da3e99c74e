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


def test_muon_in_float32_follows_torchs_bfloat16_iteration():
    """On a CPU the Newton-Schulz iteration runs in float32 (bfloat16 matmuls are slow there): the same
    iteration as torch.optim.Muon's, to bfloat16's precision, and one optimizer step of each agrees."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from blockdraft.config.recipe import OptimConfig

    from blockdraft.train.optim import build_optimizer, newton_schulz_float32

    g = torch.randn(48, 80, generator=torch.Generator().manual_seed(0))
    coefficients = (3.4445, -4.7750, 2.0315)
    ours, theirs = newton_schulz_float32(g, coefficients, 5, 1e-7), _zeropower_via_newtonschulz(g, coefficients, 5, 1e-7)
    assert ours.dtype == torch.float32 and ours.shape == g.shape
    torch.testing.assert_close(ours, theirs.float(), atol=0.03, rtol=0.05)
    steps = {}
    for dtype in ("float32", "bfloat16"):
        w = torch.nn.Parameter(torch.ones(48, 80))
        optimizer = build_optimizer([w], OptimConfig(name="muon", lr=1e-2, muon_ns_dtype=dtype))
        assert optimizer.ns_dtype == dtype
        w.grad = g.clone()
        optimizer.step()
        steps[dtype] = w.detach() - 1
    torch.testing.assert_close(steps["float32"], steps["bfloat16"], atol=2e-4, rtol=0.05)
    # auto on a CPU: bfloat16 only where the CPU multiplies it in hardware
    from blockdraft.machine import fast_cpu_bfloat16

    auto = build_optimizer([torch.nn.Parameter(torch.ones(4, 4))], OptimConfig(name="muon")).ns_dtype
    assert auto == ("bfloat16" if fast_cpu_bfloat16() else "float32")


def test_fewer_newton_schulz_steps_reach_torchs_iteration_and_bad_counts_are_refused_early(tmp_path):
    from blockdraft.config.recipe import OptimConfig
    from blockdraft.train.optim import build_optimizer

    w = torch.nn.Parameter(torch.ones(8, 12))
    optimizer = build_optimizer([w], OptimConfig(name="muon", muon_ns_steps=3))
    assert optimizer.muon.param_groups[0]["ns_steps"] == 3
    for bad in (0, -2):
        with pytest.raises(ConfigError, match=f"optim.muon_ns_steps={bad}: run at least 1"):
            train_tiny(tmp_path / f"ns{bad}", "optim=muon", f"optim.muon_ns_steps={bad}", "train.max_steps=2", "data.val=null")
    assert not (tmp_path / "ns0" / "checkpoints").exists()  # refused before anything ran

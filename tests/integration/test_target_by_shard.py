"""distributed.target_sharding=fsdp: no rank ever holds the whole target, measured, and the sharded target
computes what the whole one does for the families whose checkpoint names transformers converts."""

import json
import os
import subprocess
import sys

import torch

from tests.integration.conftest import REPO


def _big_target(path):
    """A random Qwen3 of 12 layers of width 1024 (about 400 MB of decoder layers in float32)."""
    from blockdraft.models.tiny_target import tiny_config
    import transformers

    # Built on the meta device and given random weights once: the default initialisers' two passes over 100M
    # parameters cost seconds. Every tensor is written (and so resident), as a real checkpoint's are.
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(tiny_config("qwen3", num_layers=12, hidden_size=1024))
    model = model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02, generator=generator)
    model.save_pretrained(path)
    return sum(p.numel() * p.element_size() for p in model.model.layers.parameters())


def test_no_rank_holds_the_whole_target(tmp_path):
    from blockdraft.models.tiny_target import save_tiny_target

    layer_bytes = _big_target(tmp_path / "big")
    families = [str(tmp_path / a) for a in ("qwen3_moe", "nemotron_h_moe")]
    for path in families:
        save_tiny_target(path, os.path.basename(path))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests/integration/target_by_shard_worker.py"), str(tmp_path / "big"), str(tmp_path), *families]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["qwen3_moe"] == report["nemotron_h_moe"] == "equal"
        assert report["local_layer_bytes"] == layer_bytes // 2  # every tensor of these layers has an even row count
        # The load and a forward (one layer gathered at a time) grow a rank by its half of the layers and one
        # gathered layer; a rank that built, read or kept gathered the whole target on the way grows by all of them.
        assert report["load_peak_growth"] < layer_bytes, (report, layer_bytes)

"""nccl and checkpoints on the GPU: a DDP step over nccl equals the plain step, and a run
checkpointed on the GPU resumes on a CPU."""

import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from blockdraft.config.recipe import LoopConfig
from blockdraft.models.target import TargetModel
from blockdraft.models.tiny_target import build_tiny_model
from blockdraft.train.logger import read_metrics
from blockdraft.train.step import train_step
from tests.conftest import make_draft
from tests.cuda.gpu_helpers import assert_grads_close, grads_of, needs_cuda, packed_batch
from tests.integration.conftest import REPO, tiny_overrides

pytestmark = needs_cuda


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_step_over_nccl_equals_the_plain_step():
    hf = build_tiny_model("qwen3", seed=0).cuda()
    target = TargetModel(hf, [1, 3])
    draft = make_draft(hf, "dflash2").cuda()
    batch, cfg = packed_batch(), LoopConfig(num_anchors=8, gamma=4.0)
    train_step(draft, target, batch, cfg, torch.Generator().manual_seed(5), "flex").loss.backward()
    plain = grads_of(draft)
    draft.zero_grad(set_to_none=True)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        wrapped = DDP(draft, device_ids=[0])
        result = train_step(wrapped, target, batch, cfg, torch.Generator().manual_seed(5), "flex")
        result.loss.backward()  # the gradient all-reduce runs over nccl here
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()
    assert_grads_close(grads_of(draft), plain, rtol=1e-5, atol=1e-7)


def _train(run_dir, env, *args):
    cmd = [sys.executable, "-m", "blockdraft.train", *tiny_overrides(run_dir, "data.val=null", "train.log_every=1", *args)]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout + proc.stderr


def test_a_run_checkpointed_on_the_gpu_resumes_on_a_cpu(tmp_path):
    run = tmp_path / "run"
    _train(run, {}, "train.max_steps=4", "train.save_every=4")  # auto: bf16 autocast and flex on the GPU
    state = torch.load(run / "checkpoints" / "step_4" / "trainer_state.pt", weights_only=False)
    assert any(t.is_cuda for s in state["optimizer"]["state"].values() for t in s.values() if torch.is_tensor(t))
    out = _train(run, {"CUDA_VISIBLE_DEVICES": ""}, "train.max_steps=6", "resume=auto")  # fp32 and SDPA on the CPU
    assert "continuing from" in out and "at step 4" in out
    rows = [r for r in read_metrics(run) if "loss" in r and r.get("split") != "val"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert "max_memory_gib" in rows[3] and "peak_rss_gib" in rows[5]  # steps 1-4 on the GPU, 5-6 on the CPU

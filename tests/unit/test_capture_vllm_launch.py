"""capture.backend=vllm runs as one process that leaves the GPUs to its servers: under torchrun or with the target
sharded it is refused with the fix, and its process never makes a CUDA context (GPU 0's memory is a server's)."""

import pytest
import torch

from blockdraft.capture.config import CaptureAppConfig, check_vllm_launch
from blockdraft.errors import ConfigError
from blockdraft.ranks import distributed


def test_torchrun_and_a_sharded_target_are_refused_with_the_fix():
    cfg = CaptureAppConfig(out="unused", backend="vllm")
    with pytest.raises(ConfigError, match="runs in one process .*not torchrun"):
        check_vllm_launch(cfg, environ={"WORLD_SIZE": "8"})
    cfg.distributed.target_sharding = "fsdp"
    with pytest.raises(ConfigError, match="set vllm.tensor_parallel_size .* leave distributed.target_sharding=none"):
        check_vllm_launch(cfg, environ={})


def test_a_process_that_leaves_the_gpus_to_others_makes_no_cuda_context(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: chosen.append(device))
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.init_distributed(use_gpu=False).device == torch.device("cpu") and chosen == []
    assert distributed.init_distributed().device == torch.device("cuda", 0) and chosen == [0]

"""The capture's compute dtype: auto takes bfloat16 only where the CPU has the kernels for it."""

import pytest
import torch

from blockdraft.capture import config as capture
from blockdraft.capture.config import CaptureAppConfig
from blockdraft.capture.identity import capture_compute_dtype


@pytest.mark.parametrize("flags,want", [("fpu avx512f avx512_bf16", torch.bfloat16),
                                        ("fpu avx512f amx_tile amx_bf16", torch.bfloat16),
                                        ("fpu avx2 avx512f", torch.float32)])
def test_auto_takes_bfloat16_on_a_cpu_with_avx512_bf16_or_amx_only(monkeypatch, flags, want):
    import blockdraft.machine

    monkeypatch.setattr(blockdraft.machine, "_read", lambda path: f"model name : x\nflags : {flags}\n")
    assert capture_compute_dtype(CaptureAppConfig(compute_dtype="auto"), torch.device("cpu")) == want
    assert capture_compute_dtype(CaptureAppConfig(compute_dtype="auto"), torch.device("cuda")) == torch.bfloat16


def test_train_follows_the_training_dtype_and_the_explicit_choices_are_kept():
    cpu = torch.device("cpu")
    assert capture_compute_dtype(CaptureAppConfig(), cpu) == torch.float32  # train.dtype auto: fp32 on a CPU
    assert capture_compute_dtype(CaptureAppConfig(compute_dtype="bfloat16"), cpu) == torch.bfloat16
    assert capture_compute_dtype(CaptureAppConfig(compute_dtype="float32"), torch.device("cuda")) == torch.float32
    assert "auto" in capture.COMPUTE_DTYPES

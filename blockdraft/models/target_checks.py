"""The `target` group's checks and dtypes: what training and capture settle before a target loads, kept
below both so that neither reaches into the other for them."""

from __future__ import annotations

from pathlib import Path

import torch

from blockdraft.errors import ConfigError


def check_target_path(target) -> None:
    """The `target` group names a local HF directory (or a tiny one a test builds there), and a
    dtype that exists: a misspelt one fails now, not after loading."""
    if target.path is None:
        raise ConfigError("target.path is not set; point it at a local Hugging Face model directory.")
    if target.tiny is None and not (Path(target.path) / "config.json").exists():
        raise ConfigError(f"target.path={target.path!r} has no config.json; give a local Hugging Face model directory.")
    resolve_dtype(target.dtype, torch.device("cpu"))


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in ("float32", "bfloat16"):
        raise ConfigError(f"dtype {name!r}: use auto, float32 or bfloat16.")
    return getattr(torch, name)


def resolve_target_dtype(name: str, train_dtype: torch.dtype) -> torch.dtype:
    """The dtype the frozen target is loaded in: auto follows the training dtype (bf16 on CUDA,
    where an 8B target then takes 16 GB instead of 32; fp32 on CPU)."""
    if name == "auto":
        return train_dtype
    dtype = resolve_dtype(name, torch.device("cpu"))
    if dtype == torch.bfloat16 and train_dtype != torch.bfloat16:
        # Without autocast the draft's fp32 layers would be fed bf16 features and embeddings.
        raise ConfigError("target.dtype=bfloat16 with an fp32 training step (train.dtype=float32, or a CPU with "
                          "train.dtype=auto): set train.dtype=bfloat16 (autocast), or target.dtype=auto / float32.")
    return dtype

"""What a store's content depends on: its compute dtype, the soft labels it keeps, and the identity written
into its index (which the pipeline's capture key is). None of it depends on how many ranks capture it."""

from __future__ import annotations

import contextlib

import torch

from blockdraft.capture.config import CaptureAppConfig
from blockdraft.data.store_identity import store_identity
from blockdraft.models.resolve import resolve_layer_ids
from blockdraft.models.target_checks import resolve_dtype

# The top-k a store keeps for a recipe on the full distribution (JetSpec's): the usual truncation.
STORE_FULL_TOP_K = 32


def store_teacher_top_k(kl_weight: float, teacher_top_k) -> int:
    """How many of the target's best tokens the store keeps per position: the run's top-k; for a run on
    the full distribution (teacher_top_k null), STORE_FULL_TOP_K, said once, since a store keeps no
    [tokens, vocab] table; 0 without soft labels."""
    if kl_weight <= 0:
        return 0
    if teacher_top_k:
        return teacher_top_k
    print(f"[capture] train.teacher_top_k=null asks for the target's full distribution, which a feature store "
          f"does not keep: keeping its top {STORE_FULL_TOP_K} (training from this store renormalises over them; "
          "train online, without data.features, for the full distribution).", flush=True)
    return STORE_FULL_TOP_K


def capture_compute_dtype(cfg: CaptureAppConfig, device: torch.device) -> torch.dtype:
    """`device`: where the target runs (with backend=vllm, the servers' device)."""
    from blockdraft.machine import fast_cpu_bfloat16

    if cfg.backend == "vllm" and device.type == "cpu":
        return torch.float32  # the servers run vLLM's CPU kernels in float32 (vllm_runtime/server.py)
    if cfg.compute_dtype == "train":
        return resolve_dtype(cfg.train.dtype, device)
    if cfg.compute_dtype == "auto":
        return torch.bfloat16 if device.type != "cpu" or fast_cpu_bfloat16() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.compute_dtype]


def capture_identity(cfg: CaptureAppConfig, target_config, layer_ids, tokenizer, teacher_top_k: int,
                     dtype: torch.dtype) -> dict:
    """The store's identity but for its rows' sources: what its content depends on. The pipeline's capture
    key is this (the sources are the regen stage's rows, which its key already covers)."""
    identity = store_identity(cfg.target.path, target_config, layer_ids, tokenizer, cfg.data,
                              cfg.storage_dtype, cfg.rows_per_shard, teacher_top_k)
    if dtype != torch.float32:  # absent from float32 captures, so the stores made before stay what they were
        identity["compute_dtype"] = str(dtype).replace("torch.", "")
    if cfg.backend != "transformers":  # likewise; a resume never mixes shards of two engines
        identity["backend"] = cfg.backend
    return identity


def planned_identity(cfg: CaptureAppConfig, device: torch.device) -> dict:
    """capture_identity of the store these settings would capture, without loading the target's weights."""
    from transformers import AutoTokenizer

    from blockdraft.models.target_families import load_text_config

    target_config = load_text_config(cfg.target.path)
    with contextlib.redirect_stdout(None):  # its note on a full-distribution run is the capture's to print
        top_k = store_teacher_top_k(cfg.train.kl_weight, cfg.train.teacher_top_k)
    return capture_identity(cfg, target_config, resolve_layer_ids(cfg.draft, target_config),
                            AutoTokenizer.from_pretrained(cfg.target.path), top_k, capture_compute_dtype(cfg, device))

"""The capture app's settings: the training recipe's groups (so `experiment=`, `target.path=`, `data.*` and
`draft.target_layer_ids=` mean what they mean for training) plus where and how the store is written."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from blockdraft.config import register_schema
from blockdraft.data.feature_store import check_storage_dtype
from blockdraft.errors import ConfigError
from blockdraft.models.target_checks import check_target_path
from blockdraft.train.config import TrainAppConfig
from blockdraft.train.target_sharding import check_strategy, check_target_mesh

COMPUTE_DTYPES = ("train", "float32", "bfloat16", "auto")


@dataclass
class CaptureAppConfig(TrainAppConfig):
    """The training app's settings, plus where and how the store is written."""

    out: str = MISSING
    """The store directory (index.json + <split>/shard-*.safetensors)."""
    storage_dtype: str = "float16"
    """float16 | bfloat16 | float32 (exact: training from it equals online training to fp32 rounding)."""
    rows_per_shard: int = 256
    """Rows per shard file: the unit a killed capture redoes, and the unit shared out among ranks under torchrun."""
    rows_per_forward: int = 1
    """Rows the target runs at once, right-padded (padding after a row changes none of its positions)."""
    compute_dtype: str = "train"
    """The target's matmuls: train (as training runs it, train.dtype) | float32 | bfloat16 | auto (bfloat16 on
    a GPU or on a CPU with AVX512-BF16 or AMX, float32 elsewhere). The store keeps storage_dtype either way."""


register_schema("capture_schema", CaptureAppConfig)


def check_capture_options(cfg: CaptureAppConfig) -> None:
    """The capture's own keys: what a pipeline checks before its first stage too."""
    check_storage_dtype(cfg.storage_dtype)
    if cfg.rows_per_shard < 1:
        raise ConfigError(f"rows_per_shard={cfg.rows_per_shard}: use 1 or more rows per shard.")
    if cfg.rows_per_forward < 1:
        raise ConfigError(f"rows_per_forward={cfg.rows_per_forward}: run 1 or more rows per target forward.")
    if cfg.compute_dtype not in COMPUTE_DTYPES:
        raise ConfigError(f"compute_dtype={cfg.compute_dtype!r}; use one of {list(COMPUTE_DTYPES)}.")


def check_capture_config(cfg: CaptureAppConfig) -> None:
    check_capture_options(cfg)
    if cfg.data.features:
        raise ConfigError("data.features is set: a capture writes a store (out=), it does not read one; drop data.features.")
    check_target_path(cfg.target)
    # The target loads as online training loads it: whole on every rank, or by shard over the ranks.
    check_strategy(cfg.distributed.target_sharding)
    check_target_mesh(cfg.distributed.target_mesh, cfg.distributed.target_sharding)
    if cfg.prepare.regenerate_builtin is None:
        cfg.data.validate(require_train=True)

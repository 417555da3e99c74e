"""The capture app's settings: the training recipe's groups (so `experiment=`, `target.path=`, `data.*` and
`draft.target_layer_ids=` mean what they mean for training) plus where and how the store is written."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from blockdraft.capture.vllm_config import CaptureVllmConfig
from blockdraft.config import register_schema
from blockdraft.config.recipe import TrainAppConfig
from blockdraft.data.feature_store import check_storage_dtype
from blockdraft.errors import ConfigError
from blockdraft.models.target_checks import check_target_path
from blockdraft.models.target_sharding import check_strategy, check_target_mesh

COMPUTE_DTYPES = ("train", "float32", "bfloat16", "auto")
BACKENDS = ("transformers", "vllm")


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
    a GPU or on a CPU with AVX512-BF16 or AMX, float32 elsewhere). The store keeps storage_dtype either way.
    With backend=vllm on a CPU the servers run float32 whatever this says (vLLM's CPU kernels)."""
    backend: str = "transformers"
    """What runs the target: transformers (in this process, or by shard over torchrun's ranks) | vllm (vLLM servers
    with its extract_hidden_states method and the project's connector: the engine that will serve the draft,
    tensor parallel within a server, several servers; one process, no torchrun). Keys under vllm.*."""
    vllm: CaptureVllmConfig = field(default_factory=CaptureVllmConfig)
    """The servers of backend=vllm (capture/vllm_config.py)."""


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
    if cfg.backend not in BACKENDS:
        raise ConfigError(f"backend={cfg.backend!r}; use one of {list(BACKENDS)}.")
    if cfg.backend == "vllm":
        from blockdraft.capture.vllm_config import check_capture_vllm

        check_capture_vllm(cfg.vllm)


def check_capture_config(cfg: CaptureAppConfig) -> None:
    check_capture_options(cfg)
    if cfg.data.features:
        raise ConfigError("data.features is set: a capture writes a store (out=), it does not read one; drop data.features.")
    check_target_path(cfg.target)
    # The target loads as online training loads it: whole on every rank, or by shard over the ranks.
    check_strategy(cfg.distributed.target_sharding)
    check_target_mesh(cfg.distributed.target_mesh, cfg.distributed.target_sharding)
    if cfg.backend == "vllm":
        check_vllm_launch(cfg)
    if cfg.prepare.regenerate_builtin is None:
        cfg.data.validate(require_train=True)


def check_vllm_launch(cfg: CaptureAppConfig, environ=None) -> None:
    """backend=vllm runs in one process that sends the rows to its servers; the servers hold the GPUs."""
    import os

    from blockdraft.capture.vllm_servers import check_placement

    env = os.environ if environ is None else environ
    if int(env.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            "backend=vllm runs in one process (its vLLM servers take the GPUs: vllm.servers, "
            "vllm.tensor_parallel_size); launch it with python -m blockdraft.capture, not torchrun."
        )
    if cfg.distributed.target_sharding != "none":
        raise ConfigError(
            f"distributed.target_sharding={cfg.distributed.target_sharding} shards a target this process loads; with "
            "backend=vllm the servers hold it: set vllm.tensor_parallel_size (GPUs per server) and leave "
            "distributed.target_sharding=none."
        )
    check_placement(cfg.vllm)

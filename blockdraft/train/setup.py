"""Everything before the first step: checks, target, tokenizer, data, draft, optimizer, resume.

Cheap checks run first so a typo fails in seconds, before the target is loaded.
"""

from __future__ import annotations

import importlib.util

import torch
from omegaconf import OmegaConf

from blockdraft import kinds
from blockdraft.errors import ConfigError
from blockdraft.models.draft_config import check_block_size, check_draft_vocab as check_kind_draft_vocab
# The target group's checks live below train (capture settles them too); the loop imports them from here.
from blockdraft.config.recipe import TrainAppConfig
from blockdraft.losses.confidence import CONFIDENCE_TARGETS
from blockdraft.models.target_checks import check_target_path, resolve_dtype, resolve_target_dtype  # noqa: F401
from blockdraft.models.target_sharding import check_strategy, check_target_mesh
from blockdraft.train.batch_loader import check_loader_workers
from blockdraft.train.optim import check_optim_config
from blockdraft.train.parallelize import check_draft_sharding

ATTENTION_BACKENDS = ("auto", "sdpa", "flex")


def check_config(cfg: TrainAppConfig, data_ready: bool = True) -> None:
    """Validation that needs neither the target's weights nor the data; `data_ready=False` (a pipeline
    checking its training stage before the rows exist) leaves out what reads the data's files."""
    t = cfg.train
    if t.num_anchors < 1:
        raise ConfigError(f"train.num_anchors={t.num_anchors}: draw at least one block per row (64 is usual).")
    if t.grad_accum < 1:
        raise ConfigError(f"train.grad_accum={t.grad_accum}: use 1 or more micro-batches per step.")
    if t.micro_batch_size < 1:
        raise ConfigError(f"train.micro_batch_size={t.micro_batch_size}: use 1 or more rows.")
    if t.max_steps < 1:
        raise ConfigError(f"train.max_steps={t.max_steps}: train at least one step.")
    if t.max_minutes is not None and not t.max_minutes > 0:
        raise ConfigError(f"train.max_minutes={t.max_minutes}: give a positive number of minutes, or null for no limit.")
    if not t.feature_noise_std >= 0:
        raise ConfigError(f"train.feature_noise_std={t.feature_noise_std}: use 0 (off) or a positive standard deviation.")
    check_loss_weights(t)
    check_optim_config(cfg.optim)
    if t.attention_backend not in ATTENTION_BACKENDS:
        raise ConfigError(f"train.attention_backend={t.attention_backend!r}; use one of {list(ATTENTION_BACKENDS)}.")
    check_block_size(cfg.draft.block_size)
    check_sliding_window(cfg.draft)
    if cfg.draft.mask_token_id is None:
        from blockdraft.models.mask_choice import missing_mask_message

        raise ConfigError(missing_mask_message(cfg.target.path))
    check_target_path(cfg.target)
    check_strategy(cfg.distributed.target_sharding)
    check_target_mesh(cfg.distributed.target_mesh, cfg.distributed.target_sharding)
    check_draft_sharding(cfg.train.draft_sharding, cfg.optim.name)
    check_loader_workers(cfg.train.loader_workers)
    for key in ("timeout_s", "startup_timeout_s", "lease_s"):
        value = getattr(cfg.distributed, key)
        if not value > 0:
            raise ConfigError(f"distributed.{key}={value!r}: give a number of seconds above 0 (docs/training.md).")
    if cfg.wandb.mode not in ("disabled", "offline", "online"):
        raise ConfigError(f"wandb.mode={cfg.wandb.mode!r}; use disabled, offline or online.")
    if cfg.wandb.mode != "disabled" and importlib.util.find_spec("wandb") is None:
        # wandb is imported only when it logs, so a machine without it still trains with it disabled.
        raise ConfigError(f"wandb.mode={cfg.wandb.mode} but wandb is not installed: pip install wandb, or set wandb.mode=disabled.")
    check_draft_vocab(cfg)
    check_mask_embedding(cfg)
    if not data_ready:
        return
    if cfg.data.features:
        check_store_options(cfg)
    elif cfg.prepare.regenerate_builtin is None:
        cfg.data.validate(require_train=True)
    elif not cfg.data.train:
        raise ConfigError("prepare.regenerate_builtin needs data.train: the file the answers are written to.")


def check_loss_weights(t) -> None:
    from blockdraft.losses.block import POSITION_WEIGHTINGS, check_dpace_alpha, check_loss_normalization

    if t.position_weighting not in POSITION_WEIGHTINGS:
        raise ConfigError(f"train.position_weighting={t.position_weighting!r}; use one of {list(POSITION_WEIGHTINGS)}.")
    check_dpace_alpha(t.dpace_alpha)
    if t.loss_normalization is not None:
        check_loss_normalization(t.loss_normalization)
    if t.max_nonfinite_steps < 1:
        raise ConfigError(f"train.max_nonfinite_steps={t.max_nonfinite_steps}: stop after at least one skipped step "
                          "(3 is the default).")
    if t.ce_weight < 0 or t.kl_weight < 0 or t.ce_weight + t.kl_weight == 0:
        raise ConfigError(f"train.ce_weight={t.ce_weight}, train.kl_weight={t.kl_weight}: use weights >= 0, not both 0.")
    if t.confidence_target not in CONFIDENCE_TARGETS:
        raise ConfigError(f"train.confidence_target={t.confidence_target!r}: use one of {list(CONFIDENCE_TARGETS)}.")
    if t.confidence_weight < 0:
        raise ConfigError(f"train.confidence_weight={t.confidence_weight}: use a weight >= 0 (0 leaves the confidence head untrained).")
    if t.kl_weight > 0 and t.teacher_top_k is not None and t.teacher_top_k < 0:
        raise ConfigError(f"train.teacher_top_k={t.teacher_top_k}: keep at least the target's best token (32 is usual), "
                          "or null for its full distribution.")
    if not t.kl_temperature > 0:
        raise ConfigError(f"train.kl_temperature={t.kl_temperature}: use a positive temperature (1.0 = the distributions as they are).")


def check_sliding_window(draft) -> None:
    """vLLM 0.32 gives a non-causal sliding-window draft layer a symmetric window: W-1 keys before and
    W-1 after each query. Training (and the reference engine) limit only the keys before a query,
    which is the same rule while W >= block_size, since no slot of a block lies more than
    block_size - 1 positions after another. Narrower, the block's first slots would see later
    slots in training that vLLM hides from them: refused rather than trained unlike it serves.
    A causal draft (JetSpec) sees no later key, so any window trains as vLLM serves it."""
    w = draft.sliding_window
    if w is not None and w < draft.block_size and not kinds.get(draft.kind).causal_in_block:
        raise ConfigError(
            f"draft.sliding_window={w} is narrower than draft.block_size={draft.block_size}: vLLM would hide later slots "
            f"of a block from its first slots (a symmetric window of {w - 1} positions), which training lets them see. "
            f"Use sliding_window >= {draft.block_size}, or null for full attention."
        )


def check_mask_embedding(cfg: TrainAppConfig) -> None:
    if cfg.draft.mask_embedding_init not in ("token", "mean"):
        raise ConfigError(f"draft.mask_embedding_init={cfg.draft.mask_embedding_init!r}; use token or mean.")


def check_draft_vocab(cfg: TrainAppConfig) -> None:
    n = cfg.draft.draft_vocab_size
    if n is None:
        return
    check_kind_draft_vocab(cfg.draft.kind, n)  # the target's vocabulary, the upper bound, is checked once it is read


def check_store_options(cfg: TrainAppConfig) -> None:
    """Training from a feature store: the store must exist, and nothing may need the target's layers."""
    from blockdraft.data.feature_store import FeatureStore

    FeatureStore.open(cfg.data.features)
    cfg.data.check_max_rows()
    if cfg.distributed.target_sharding != "none":
        raise ConfigError(
            f"distributed.target_sharding={cfg.distributed.target_sharding}: from a feature store (data.features) "
            "the target's layers are not loaded, so there is nothing to shard; set distributed.target_sharding=none."
        )


def resolve_backend(name: str, device: torch.device) -> str:
    # FlexAttention has no backward on CPU: SDPA there, flex on GPU.
    if name == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    if name == "flex" and device.type != "cuda":
        raise ConfigError("train.attention_backend=flex needs a CUDA device (no flex backward on CPU); use sdpa or auto.")
    return name


def config_yaml(cfg) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)

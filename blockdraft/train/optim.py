"""AdamW over the draft's parameters and a warmup + cosine schedule to min_lr_ratio."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List

import torch


@dataclass
class OptimConfig:
    lr: float = 6e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    warmup_ratio: float = 0.04
    """Share of max_steps spent warming up linearly from 0."""
    min_lr_ratio: float = 0.1
    """Cosine decays to lr * min_lr_ratio at max_steps."""
    grad_clip: float = 1.0
    """Clip the global grad norm to this; 0 disables."""


def build_optimizer(params, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


def build_scheduler(optimizer, cfg: OptimConfig, max_steps: int):
    warmup = max(1, round(cfg.warmup_ratio * max_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

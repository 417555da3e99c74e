"""The draft's optimizer (AdamW, or Muon for its matrices) and a warmup + cosine schedule to min_lr_ratio."""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch

from blockdraft.config.recipe import OptimConfig
from blockdraft.errors import ConfigError
from blockdraft.machine import fast_cpu_bfloat16
from blockdraft.train.seen_rows_adamw import SeenRowsAdamW

OPTIMIZERS = ("adamw", "muon")


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon over the 2-D matrices and AdamW over the rest, stepped, scheduled and saved as one
    optimizer: `param_groups` is both optimizers' groups (Muon's first), so one LR scheduler
    drives each group from its own base rate."""

    def __init__(self, matrices: list, others: list, cfg: OptimConfig):
        self.muon = torch.optim.Muon(matrices, lr=cfg.muon_lr or cfg.lr, momentum=cfg.muon_momentum,
                                     weight_decay=cfg.muon_weight_decay, adjust_lr_fn="match_rms_adamw",
                                     ns_steps=cfg.muon_ns_steps)
        self.adamw = torch.optim.AdamW(others or [torch.nn.Parameter(torch.zeros(0))], lr=cfg.lr,
                                       betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
        # Optimizer's own bookkeeping (hooks, defaults) without re-registering the parameters.
        self.defaults = {"lr": cfg.lr}
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}
        self._optimizer_state_dict_pre_hooks, self._optimizer_state_dict_post_hooks = {}, {}
        self._optimizer_load_state_dict_pre_hooks, self._optimizer_load_state_dict_post_hooks = {}, {}
        self._zero_grad_profile_name = "MuonWithAdamW.zero_grad"
        on_cuda = any(p.is_cuda for p in matrices)
        self.ns_dtype = cfg.muon_ns_dtype if cfg.muon_ns_dtype != "auto" else (
            "bfloat16" if on_cuda or fast_cpu_bfloat16() else "float32")

    @property
    def param_groups(self):
        return self.muon.param_groups + self.adamw.param_groups

    @property
    def state(self):
        return {**self.muon.state, **self.adamw.state}

    @torch.no_grad()
    def step(self, closure=None):
        with newton_schulz_in(self.ns_dtype):
            self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ConfigError("the checkpoint's optimizer state is not Muon + AdamW; resume with the optim.name it was trained with.")
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])


NS_DTYPES = ("auto", "bfloat16", "float32")


def newton_schulz_float32(grad: torch.Tensor, ns_coefficients, ns_steps: int, eps: float) -> torch.Tensor:
    """Muon's quintic Newton-Schulz orthogonalisation (the iteration torch.optim.Muon runs), in float32."""
    a, b, c = ns_coefficients
    x = grad.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@contextlib.contextmanager
def newton_schulz_in(dtype: str):
    """torch.optim.Muon as it is (bfloat16), or with its orthogonalisation in float32: torch offers
    no option for it, so its module-level iteration is swapped for the step's duration."""
    if dtype == "bfloat16":
        yield
        return
    from torch.optim import _muon

    original = getattr(_muon, "_zeropower_via_newtonschulz", None)
    if original is None:
        raise ConfigError("optim.muon_ns_dtype=float32 needs torch.optim.Muon's Newton-Schulz hook, which this "
                          f"torch {torch.__version__} lacks; set optim.muon_ns_dtype=bfloat16.")
    _muon._zeropower_via_newtonschulz = newton_schulz_float32
    try:
        yield
    finally:
        _muon._zeropower_via_newtonschulz = original


def check_optim_config(cfg: OptimConfig) -> None:
    """Refused before any data or weights load (train's check_config), and again when building."""
    if cfg.name not in OPTIMIZERS:
        raise ConfigError(f"optim.name={cfg.name!r}; use one of {list(OPTIMIZERS)}.")
    if cfg.muon_ns_dtype not in NS_DTYPES:
        raise ConfigError(f"optim.muon_ns_dtype={cfg.muon_ns_dtype!r}; use one of {list(NS_DTYPES)}.")
    if not isinstance(cfg.muon_ns_steps, int) or cfg.muon_ns_steps < 1:
        raise ConfigError(f"optim.muon_ns_steps={cfg.muon_ns_steps!r}: run at least 1 Newton-Schulz iteration (torch's default is 5).")


def build_optimizer(params, cfg: OptimConfig) -> torch.optim.Optimizer:
    check_optim_config(cfg)
    params = list(params)
    if cfg.name == "adamw":
        # AdamW; a lookup table marked row_lazy (DSpark's Markov table) is stepped in the rows a batch saw.
        return SeenRowsAdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    # Muon orthogonalises a matrix's update; vectors (norms, biases, a mask embedding) and other
    # shapes (DFlash2's [2, taps, H] base kernels) stay with AdamW.
    matrices = [p for p in params if p.ndim == 2]
    return MuonWithAdamW(matrices, [p for p in params if p.ndim != 2], cfg)


def build_scheduler(optimizer, cfg: OptimConfig, max_steps: int):
    warmup = max(1, round(cfg.warmup_ratio * max_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def continue_schedule(optimizer, scheduler, wanted_lrs: list, saved_max_steps: Optional[int], max_steps: int,
                      step: int) -> list:
    """After a resume has loaded the saved optimizer and scheduler: follow this run's peak rates (`wanted_lrs`,
    its optim.lr and muon_lr) and max_steps instead of the saved ones, so from `step` on the learning rate is
    this run's schedule (warmup, cosine to max_steps) at that step. Returns what changed, to be said."""
    changes = []
    saved_lrs = list(scheduler.base_lrs)
    if saved_lrs != wanted_lrs:
        changes.append(f"optim peak learning rate {', '.join(f'{x:g}' for x in saved_lrs)} -> "
                       f"{', '.join(f'{x:g}' for x in wanted_lrs)}: the schedule continues at the new rate")
        scheduler.base_lrs = wanted_lrs
        for group, lr in zip(optimizer.param_groups, wanted_lrs):
            group["initial_lr"] = lr
    if saved_max_steps is not None and saved_max_steps != max_steps and step < max_steps:
        changes.append(f"train.max_steps {saved_max_steps} -> {max_steps}: the learning-rate schedule "
                       f"is now a {max_steps}-step run's, continued from step {step}")
    if changes:
        before = [g["lr"] for g in optimizer.param_groups]
        for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * factor(scheduler.last_epoch)
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
        changes.append(f"learning rate at step {step}: {before[0]:.3g} -> {optimizer.param_groups[0]['lr']:.3g}")
    return changes

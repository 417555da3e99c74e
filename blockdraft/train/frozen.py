"""Draft parameters kept as initialised (`train.frozen`): fewer weights to fit a small set of rows.

A draft started from the target's last layer (`init_from_target`) and trained for thousands of steps on a
few hundred rows learns those rows by heart: on the slowest CPU's demo budget (200 rows, 3140 steps) its
training accept_len reached 3.2 to 3.5 while the held-out one stayed at 1.34. Keeping part of the copied layer as
the target trained it leaves less to memorise. Measured there, it did not raise the held-out figure at the end
of the run (docs/benchmarks-history.md, small_data): the key is for such experiments, not a default.
"""

from __future__ import annotations

from typing import List, Sequence

import torch
from torch import nn

from blockdraft.errors import ConfigError


def frozen_names(model: nn.Module, patterns: Sequence[str]) -> List[str]:
    """The trainable parameters whose name contains one of `patterns`; refuses a pattern that names none,
    or patterns that leave nothing to train."""
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    chosen = [name for name in trainable if any(pattern in name for pattern in patterns)]
    for pattern in patterns:
        if not any(pattern in name for name in trainable):
            raise ConfigError(f"train.frozen: {pattern!r} names no trainable parameter of this draft; its parameters "
                              f"are {', '.join(trainable)} (a pattern freezes every name containing it, e.g. mlp)")
    if len(chosen) == len(trainable):
        raise ConfigError(f"train.frozen={list(patterns)} freezes every trainable parameter of the draft; "
                          "leave some to train (e.g. train.frozen=[mlp])")
    return chosen


def check_frozen(draft_builder, patterns: Sequence[str]) -> None:
    """Check `patterns` against a draft built on the meta device, before anything heavy loads."""
    if patterns:
        with torch.device("meta"):
            frozen_names(draft_builder(), patterns)


def freeze(model: nn.Module, patterns: Sequence[str]) -> List[str]:
    """Stop the gradients of the parameters `patterns` name; returns their names."""
    names = frozen_names(model, patterns) if patterns else []
    parameters = dict(model.named_parameters())
    for name in names:
        parameters[name].requires_grad_(False)
    return names


def check_resume_frozen(checkpoint, saved: Sequence[str], now: Sequence[str]) -> None:
    """A resume keeps the frozen set its checkpoint was trained with: the optimizer's state holds one entry per
    trained parameter, so another set cannot take it over."""
    saved, now = list(saved or []), list(now)
    if saved != now:
        raise ConfigError(f"cannot resume from {checkpoint}: it was trained with train.frozen={saved}, this run sets "
                          f"train.frozen={now}; resume with train.frozen={saved}, or export this checkpoint and start a "
                          "new run_dir from it with init_from=<the export>.")

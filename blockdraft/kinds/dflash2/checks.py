"""DFlash2's own settings checked (its convolution is LiLiCorr's optional one too)."""

from __future__ import annotations

from blockdraft.errors import ConfigError


def check_conv(cfg) -> None:
    if cfg.hidden_size % cfg.conv_group_size:
        raise ConfigError(
            f"draft.conv_group_size={cfg.conv_group_size} does not divide hidden_size="
            f"{cfg.hidden_size}; choose a divisor of {cfg.hidden_size}."
        )
    if cfg.conv_kernel_size < 1:
        raise ConfigError(f"draft.conv_kernel_size={cfg.conv_kernel_size}: set it >= 1 (2 is usual).")


def check(cfg) -> None:
    check_conv(cfg)
    if not 1 <= cfg.selector_top_k <= cfg.vocab_size:
        raise ConfigError(
            f"draft.selector_top_k={cfg.selector_top_k} is outside [1, vocab_size={cfg.vocab_size}]; "
            "set a k no larger than the vocabulary (8 is usual)."
        )
    if cfg.selector_rank < 1:
        raise ConfigError(f"draft.selector_rank={cfg.selector_rank}: set it >= 1 (64 is usual).")

"""LiLiCorr's own settings checked, against what vLLM 0.32's LiLiCorr drafter refuses."""

from __future__ import annotations

from blockdraft.errors import ConfigError
from blockdraft.kinds.dflash2.checks import check_conv


def check(cfg) -> None:
    taps, groups = cfg.conv_kernel_size, cfg.conv_group_size
    if taps < 0 or groups < 0 or bool(taps) != bool(groups):
        raise ConfigError(
            f"draft.conv_kernel_size={taps} with draft.conv_group_size={groups}: vLLM's LiLiCorr needs both "
            "(the DFlash2 convolution) or neither (plain DFlash layers); set both > 0, or both to 0."
        )
    if taps:
        check_conv(cfg)
    k = cfg.lilicorr_candidate_topk
    if not (1 <= k <= 16 and k & (k - 1) == 0) or k > cfg.vocab_size:
        raise ConfigError(
            f"draft.lilicorr_candidate_topk={k}: vLLM's LiLiCorr takes a power of two <= 16 (and within the "
            f"vocabulary of {cfg.vocab_size}); set 1, 2, 4, 8 or 16."
        )
    # num_speculative_tokens < block_size holds for what training writes: this layout drafts block_size - 1
    # slots (drafted_per_round). A larger count asked of serve is refused there, as vLLM would refuse it
    # (serve/preflight.py, check_drafted_tokens; the pipeline checks its serve key before any stage).
    width, heads = cfg.lilicorr_width, cfg.lilicorr_num_heads
    if heads < 1 or width % heads:
        raise ConfigError(
            f"draft.lilicorr_num_heads={heads} does not divide the lattice width {width} "
            "(draft.lilicorr_hidden_size, or hidden_size when null); pick a divisor of it."
        )
    for key in ("lilicorr_factor_dim", "lilicorr_num_layers"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"draft.{key}={getattr(cfg, key)}: set it >= 1 (64 and 2 are the defaults).")
    if int(width * cfg.lilicorr_mlp_ratio) < 1:
        raise ConfigError(f"draft.lilicorr_mlp_ratio={cfg.lilicorr_mlp_ratio}: set it > 0 (2.0 is the default).")

"""DFlash2's own `draft.*` settings, with their defaults: the user's schema (models/resolve.DraftConfig) and the
resolved config (models/draft_config.DraftModelConfig) both inherit them, so each default is written here once.
LiLiCorr's optional convolution is this one (its settings add nothing to these two)."""

from dataclasses import dataclass


@dataclass(kw_only=True)
class DFlash2Settings:
    conv_kernel_size: int = 2
    """DFlash2, LiLiCorr: taps of the in-block convolution (LiLiCorr: 0, with conv_group_size 0, for none)."""
    conv_group_size: int = 16
    """DFlash2, LiLiCorr: channels sharing one dynamic coefficient; must divide hidden_size."""
    selector_rank: int = 64
    """DFlash2: rank of the pairwise selector codebooks."""
    selector_top_k: int = 8
    """DFlash2: candidates per slot the selector chooses among."""

"""LiLiCorr's own `draft.*` settings, with their defaults (written once: the schema and the resolved config inherit
them): vLLM's `lilicorr_*` dflash_config keys of its candidate-lattice head. Its optional in-block convolution
is DFlash2's (kinds/dflash2/settings.py)."""

from dataclasses import dataclass
from typing import Optional


@dataclass(kw_only=True)
class LiLiCorrSettings:
    lilicorr_hidden_size: Optional[int] = None
    """LiLiCorr: width of the candidate-lattice transformer; null = the draft's hidden_size."""
    lilicorr_candidate_topk: int = 8
    """LiLiCorr: candidates per drafted slot the lattice scores (a power of two <= 16, as vLLM requires)."""
    lilicorr_num_heads: int = 4
    """LiLiCorr: attention heads of the lattice transformer; must divide its width."""
    lilicorr_mlp_ratio: float = 2.0
    """LiLiCorr: the lattice MLP's width over the lattice width."""
    lilicorr_factor_dim: int = 64
    """LiLiCorr: width of the normalized vectors whose dot products score slot-to-slot transitions."""
    lilicorr_vector_eps: float = 1e-6
    """LiLiCorr: epsilon of those vectors' normalization."""
    lilicorr_logit_scale: float = 10.0
    """LiLiCorr: scale from the vectors' cosine (in [-1, 1]) to the path walk's logits."""
    lilicorr_num_layers: int = 2
    """LiLiCorr: layers of the lattice transformer."""

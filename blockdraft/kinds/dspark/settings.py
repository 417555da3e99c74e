"""DSpark's own `draft.*` settings, with their defaults (written once: the schema and the resolved config inherit
them)."""

from dataclasses import dataclass
from typing import Optional


@dataclass(kw_only=True)
class DSparkSettings:
    markov_rank: int = 256
    """DSpark: rank of the Markov head (markov_w1: target vocab x rank, markov_w2: rank x draft vocab)."""
    markov_head_type: str = "vanilla"
    """DSpark: the Markov head's form; vLLM 0.32 serves vanilla only (a bias from the previous token alone)."""
    enable_confidence_head: bool = True
    """DSpark: train the per-slot acceptance head vLLM's adaptive verification reads."""
    confidence_head_with_markov: bool = True
    """DSpark: the confidence head also reads the previous token's Markov embedding (ignored without the head)."""
    sample_from_anchor: bool = True
    """DSpark: every slot, the anchor's included, predicts the next token (block_size drafts a round); false =
    the DFlash layout (block_size - 1 drafts from the MASK slots)."""
    dspark_draft_topk: Optional[int] = None
    """DSpark: apply the Markov head to the backbone's k best tokens only (vLLM's dspark_draft_topk); null = all."""

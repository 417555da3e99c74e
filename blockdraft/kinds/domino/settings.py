"""Domino's own `draft.*` settings, with their defaults (written once: the schema and the resolved config inherit
them)."""

from dataclasses import dataclass
from typing import Optional


@dataclass(kw_only=True)
class DominoSettings:
    correction_hidden_size: Optional[int] = None
    """Domino: width of the GRU state; null = min(hidden_size, 1024) (1024: the published recipe's)."""
    correction_rank: int = 256
    """Domino: rank of the low-rank logit correction."""

"""The contract between the reference engine and a draft's `draft_block`: how the engine samples and what one
round's drafts are. The engine passes its sampling in, so a kind never imports the engine that calls it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

# logits [..., V] -> (tokens [...], the distribution each was drawn from [..., V]).
Pick = Callable[[Tensor], Tuple[Tensor, Tensor]]


@dataclass
class Sampler:
    """The engine's sampling, as a draft drafts with it."""

    pick: Pick
    """Draws a token from logits with the request's temperature, top-k and top-p (one-hot q when greedy)."""
    temperature: float
    """0 when greedy: for drafts that sample from their own scores (a selector's, a lattice walk's)."""
    generator: Optional[torch.Generator]


class DraftedBlock(NamedTuple):
    """One round's drafts, as rejection sampling needs them."""

    tokens: Tensor
    """[K] target ids."""
    q: Tensor
    """[K, V] the distribution each token was drawn from, over the target's vocabulary."""
    confidence: Optional[Tensor] = None
    """[K] a confidence head's predicted acceptance per slot; None without one."""

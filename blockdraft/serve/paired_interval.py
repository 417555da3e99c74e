"""How far a speedup or a round cost read from a few prompts can be trusted: a paired bootstrap over prompts.

Each prompt is generated on both sides (baseline and draft), so a prompt's pair of timings is one unit:
resampling pairs keeps what the prompt decides (its length, how predictable its reply is) on both sides
at once, and the interval says how much the figure would move with other prompts of the same kind. With
the pair of servers kept and each half of the prompts served in the other order, drift that runs one way
through the round hits both sides alike, so one round with this interval stands in for the spread of
several rounds (and their start-ups).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

LEVEL = 0.95
DRAWS = 2000


@dataclass
class PromptPair:
    """One prompt on both sides: tokens and seconds of each, and the draft side's drafting rounds (None where
    the counters were read once per phase, not per prompt)."""

    baseline_tokens: int
    baseline_s: float
    draft_tokens: int
    draft_s: float
    drafts: Optional[float] = None


def speedup(pairs: Sequence[PromptPair]) -> Optional[float]:
    """Tokens/s with the draft over tokens/s without it, over all the pairs' tokens and seconds."""
    base_s, draft_s = sum(p.baseline_s for p in pairs), sum(p.draft_s for p in pairs)
    base_t, draft_t = sum(p.baseline_tokens for p in pairs), sum(p.draft_tokens for p in pairs)
    if base_s <= 0 or draft_s <= 0 or not base_t:
        return None
    return (draft_t / draft_s) / (base_t / base_s)


def round_cost(pairs: Sequence[PromptPair]) -> Optional[float]:
    """A drafting round's seconds over a plain decode step's, over all the pairs."""
    drafts = sum(p.drafts or 0.0 for p in pairs)
    base_s, base_t = sum(p.baseline_s for p in pairs), sum(p.baseline_tokens for p in pairs)
    if not drafts or base_s <= 0 or not base_t:
        return None
    return (sum(p.draft_s for p in pairs) / drafts) / (base_s / base_t)


def interval(pairs: Sequence[PromptPair], statistic: Callable[[Sequence[PromptPair]], Optional[float]],
             draws: int = DRAWS, level: float = LEVEL, seed: int = 0) -> Optional[Tuple[float, float]]:
    """The central `level` interval of `statistic` over `draws` resamples of the pairs (with replacement);
    None with fewer than 4 pairs, where no resample says anything. Seeded: a report reads the same twice."""
    if len(pairs) < 4:
        return None
    rng = random.Random(seed)
    values: List[float] = []
    for _ in range(draws):
        value = statistic([pairs[rng.randrange(len(pairs))] for _ in pairs])
        if value is not None:
            values.append(value)
    if len(values) < draws // 2:
        return None
    values.sort()
    tail = (1.0 - level) / 2
    return values[int(tail * (len(values) - 1))], values[int((1.0 - tail) * (len(values) - 1))]

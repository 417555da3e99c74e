"""What a perfect draft reaches on the gate's one sample: the ceilings its floors are fractions of.

A draft that predicts every token of the sample right is still held below `block_size` by the sample's
length. In training, an anchor near the end of the reply has fewer tokens after it than a block drafts,
and a block's run stops at the first slot past the reply (`train/anchors.py`, `train/metrics.py`). In
serving, the reply's first token comes from the prompt's forward pass, each round adds at most
`drafted` accepted tokens and the target's own, and the last round ends where the reply does. On a
26-token reply at block 16, a perfect draft reaches 11.96 in training and 13.0 in serving, both far
below 16: a floor of a fraction of `block_size` would call it undertrained. So the gate's floors are
fractions of these ceilings, computed for the very sample it trains and serves.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence


def drafted_tokens(draft) -> int:
    """Tokens one round drafts, for the `draft` config group (DraftModelConfig.num_speculative_tokens):
    block_size, for a DSpark draft whose anchor predicts; block_size - 1 otherwise."""
    from blockdraft import kinds

    return kinds.get(draft.kind).drafted_per_round(draft.block_size, draft)


def training_ceiling(loss_mask: Sequence[bool], drafted: int) -> Optional[float]:
    """Training's accept_len of a perfect draft on a row with this loss mask: None with no valid anchor.

    An anchor is valid where it and the next token are loss tokens (`valid_anchor_mask`). Its block's
    run counts the drafted slots up to the first one that is no loss token, at most `drafted`, plus one
    for the bonus token (`accept_length`): with f loss tokens right after the anchor, 1 + min(drafted, f).
    Training averages that over the anchors it draws, uniformly: over every valid anchor, here."""
    total = anchors = 0
    following = 0  # loss tokens in a row right after position p
    for on_loss in reversed(list(loss_mask)):
        if on_loss and following:
            total += 1 + min(drafted, following)
            anchors += 1
        following = following + 1 if on_loss else 0
    return total / anchors if anchors else None


def serving_ceiling(reply_tokens: int, drafted: int) -> Optional[float]:
    """Serving's mean acceptance length (1 + accepted / drafts, as vLLM reports it) of a perfect draft on
    a reply of `reply_tokens`: None when the reply leaves no round to draft in.

    The first token comes with the prompt's forward pass. Each round then accepts at most `drafted` and
    the target adds one; the fewest rounds, ceil((n - 1) / (drafted + 1)), accept the most, and the
    last one ends with the reply's last accepted token (no token of the target's is needed after it)."""
    after_first = reply_tokens - 1
    if after_first < 1:
        return None
    rounds = math.ceil(after_first / (drafted + 1))
    accepted = min(rounds * drafted, after_first - (rounds - 1))
    return 1.0 + accepted / rounds

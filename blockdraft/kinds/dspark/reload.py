"""What the reload check compares beyond DSpark's logits: the Markov-corrected logits and the confidence
logits, which the base logits never touch."""

from __future__ import annotations

from typing import List


def probe_outputs(draft, probe, hidden) -> List:
    """[the Markov-corrected logits [1, 2B, V]] and, with the confidence head, [its logits [1, 2B, 1]]."""
    parts = [draft.corrected_logits(hidden, probe.predecessor_ids, probe.lm_head)]
    if draft.confidence_head is not None:
        parts.append(draft.confidence_logits(draft.joint_hidden(hidden, probe.predecessor_ids)).unsqueeze(-1))
    return parts

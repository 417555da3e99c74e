"""What the reload check compares beyond Domino's logits: the corrected logits, which the base logits never
touch."""

from __future__ import annotations

from typing import List


def probe_outputs(draft, probe, hidden) -> List:
    """[the corrected logits [1, 2B, V], teacher-forced on the probe's predecessors]."""
    b = draft.config.block_size
    predecessors = probe.predecessor_ids.view(2, b)  # the probe's two blocks
    states = draft.correction_states(predecessors, probe.embed).view(1, 2 * b, -1)
    return [draft.corrected_logits(hidden, states, probe.lm_head)]

"""What the reload check compares beyond DFlash2's logits: the selector's scores of the probe's candidates,
which the logits never touch."""

from __future__ import annotations

from typing import List


def probe_outputs(draft, probe, hidden) -> List:
    """[the selector's scores [1, 2B, k] of the probe's candidates given its predecessors]."""
    return [draft.candidate_selector.score(hidden, probe.predecessor_ids, probe.candidate_ids, probe.candidate_logits)]

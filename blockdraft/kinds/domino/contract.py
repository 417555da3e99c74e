"""Domino's correction head (model.py) as an export holds it.

Not a vLLM contract, since vLLM has no Domino drafter, but the importer and the reference engine hold an
export to it the same way: written here from the head's definition, not read off the module.
"""

from __future__ import annotations

from typing import Dict

from blockdraft.kinds.spec import Shape


def weight_shapes(cfg) -> Dict[str, Shape]:
    h, s, r = cfg.hidden_size, cfg.correction_hidden_size, cfg.correction_rank
    return {
        "correction.gru.weight_ih": (3 * s, h),
        "correction.gru.weight_hh": (3 * s, s),
        "correction.down.weight": (r, h + s),
        "correction.up.weight": (cfg.vocab_size, r),
    }

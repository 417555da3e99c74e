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


def stray_weights_refusal(declared, listed: str) -> str:
    """Its correction tensors under another kind's config. This refusal names the declared kind by its
    `draft.kind`, as it did before the importer's generic one (which names it by its title); those who match
    its words keep them."""
    return (
        f"declares a {declared.name} draft, but the weights carry Domino correction tensors: {listed}. Loading it "
        f"as {declared.name} would silently drop them. If it is a Domino draft, set architectures to "
        '["DominoDraftModel"] and add dflash_config.correction_hidden_size and correction_rank.'
    )

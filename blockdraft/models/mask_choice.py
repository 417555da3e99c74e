"""The mask token a target offers when none is set: suggest's first candidate, named in refusals
and taken by the gate (which checks fidelity only, so any reserved token serves it)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple


def first_mask_candidate(target_dir) -> Optional[Tuple[int, str]]:
    """(id, text) of `blockdraft suggest`'s first mask-token candidate; None where the target has none
    or its directory cannot be read (the caller's own check says why)."""
    if not target_dir or not (Path(target_dir) / "config.json").is_file():
        return None
    from transformers import AutoConfig, AutoTokenizer

    from blockdraft.models.suggest import mask_token_candidates
    from blockdraft.models.target_families import text_config

    try:
        config = text_config(AutoConfig.from_pretrained(target_dir))
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
    except (OSError, ValueError):
        return None
    found = mask_token_candidates(tokenizer, config.vocab_size, config, limit=1)
    return found[0] if found else None


def missing_mask_message(target_dir) -> str:
    """The refusal for an unset draft.mask_token_id, naming the candidate to add."""
    listing = f"`blockdraft suggest target={target_dir}` lists the candidates"
    if not target_dir or not (Path(target_dir) / "config.json").is_file():
        return f"draft.mask_token_id is not set and has no default: pick a reserved, rarely used token of the target ({listing})."
    candidate = first_mask_candidate(target_dir)
    if candidate is None:
        return ("draft.mask_token_id is not set and has no default, and the target offers no reserved special token: "
                f"pick a rarely used token id of its vocabulary ({listing}).")
    token_id, text = candidate
    return (f"draft.mask_token_id is not set and has no default: add draft.mask_token_id={token_id} ({text!r}, the "
            f"target's first reserved special token), or pick another rarely used one; {listing}.")

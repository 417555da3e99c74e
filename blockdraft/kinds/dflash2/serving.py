"""What serving a DFlash2 draft should warn of, given what the serving vLLM says of itself."""

from __future__ import annotations

from typing import List


def anchor_clamp_warning(info, draft) -> List[str]:
    """vLLM's probe reports whether its DFlash2 selector clamps the anchor ids (None: it has no DFlash2)."""
    if info.anchor_clamp is not False:
        return []
    return [
        f"vLLM {info.version}'s DFlash2 selector (qwen3_dflash2._score_edges) indexes its codebooks with "
        "unclamped anchor token ids, which can fault at some request endings. Fix: serve with a vLLM that "
        "clamps them, or patch _score_edges to use anchor_token_ids.clamp(0, V - 1)."
    ]

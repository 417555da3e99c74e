"""Where vLLM 0.32, handed a speculators checkpoint's own config.json, would serve the draft otherwise
than speculators trained it. The export written here serves it as trained (draft_format/speculators.py).

vLLM's converter (transformers_utils/configs/speculators/algos.py) sets, for a DFlash or DFlash2
checkpoint, `dflash_config.causal = not sliding_window_non_causal` (true when the key is absent), and
`_dflash_layer_causal` applies it to every layer: a draft whose sliding layers trained causal would
run its full layers causally too, which speculators trains bidirectionally. For DSpark it sets
nothing, so each layer is causal exactly where `layer_types` slides: a DSpark trained bidirectional
in its sliding layers would run them causally. And in both, vLLM's window is per query (slot i sees
the keys after anchor + i - W) where speculators lets every slot of a block see the context from
anchor - W on: past W - B + 1 context tokens, slot i misses the oldest i + 1 that training showed it.
"""

from __future__ import annotations

from typing import List, Mapping

from blockdraft.draft_format.speculators import speculators_kind, trained_causality, trained_layer_types
from blockdraft.models.draft_config import SLIDING


def vllm_causality(kind: str, config: Mapping, types: List[str]) -> List[bool]:
    """Per layer of `types`, whether vLLM 0.32 attends causally when it reads this speculators config.json itself."""
    if kind in ("dflash", "dflash2"):
        return [not config.get("sliding_window_non_causal", True)] * len(types)
    return [t == SLIDING for t in types]


def vllm_reading_notes(config: Mapping) -> List[str]:
    """What vLLM would serve otherwise from this speculators config.json as it is, one line each."""
    kind = speculators_kind(config)
    types, window = trained_layer_types(config)
    trained, served = trained_causality(kind, config, types), vllm_causality(kind, config, types)
    notes = []
    for i in (i for i, (t, s) in enumerate(zip(trained, served)) if t != s):
        notes.append(
            f"layer {i} ({types[i]}): vLLM would attend {_how(served[i])} inside the block; speculators trained it "
            f"{_how(trained[i])}. An export from here keeps it {_how(trained[i])} (config.json's layer_types and is_causal)."
        )
    if SLIDING in types:
        block = int(config.get("block_size") or 0)
        notes.append(
            f"sliding window {window}: vLLM shows slot i the keys after anchor + i - {window}, speculators trained every "
            f"slot on the context from anchor - {window} on; past {window - block + 1} context tokens slot i misses the "
            "oldest i + 1 of them (every vLLM export of the draft, this project's included, serves vLLM's window)."
        )
    return notes


def _how(causal: bool) -> str:
    return "causally" if causal else "bidirectionally"

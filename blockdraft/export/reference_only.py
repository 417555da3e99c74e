"""Draft kinds that vLLM cannot serve, whose exports only the project's reference engine runs.

Such an export is the usual directory (config.json in vLLM's layout, safetensors, checksums, model
card), so the importer, `inspect`, the smoke-serve harness's reference check and the eval read it
like any other, plus a marker in config.json that says vLLM cannot serve it. vLLM itself would not
load it either: with `method: dflash` it renames the architecture `DominoDraftModel` to
`DFlashDominoDraftModel`, which its registry lacks (read from vLLM 0.32's EAGLEConfig).
"""

from __future__ import annotations

from typing import Mapping

from blockdraft import kinds

VLLM_SERVABLE_KEY = "vllm_servable"
SERVING_NOTE_KEY = "serving_note"


def reference_only_keys(cfg) -> dict:
    """The marker, for a kind vLLM cannot serve (KindSpec.reference_only says why)."""
    reason = kinds.get(cfg.kind).reference_only
    if not reason:
        return {}
    note = (f"{reason}: serve and check it with the reference engine, "
            "`python -m blockdraft.serve draft=<this dir> target=<target dir>` (engine=auto or engine=reference).")
    return {VLLM_SERVABLE_KEY: False, SERVING_NOTE_KEY: note}


def vllm_servable(config: Mapping, kind: str) -> bool:
    """False for a reference-only kind, whatever the marker says, or where the marker says so."""
    return not kinds.get(kind).reference_only and config.get(VLLM_SERVABLE_KEY, True) is not False

"""Draft kinds that vLLM cannot serve, whose exports only the project's reference engine runs.

Such an export is the usual directory (config.json in vLLM's layout, safetensors, checksums, model
card), so the importer, `inspect`, the smoke-serve harness's reference check and the eval read it
like any other, plus a marker in config.json that says vLLM cannot serve it. vLLM itself would not
load it either: with `method: dflash` it renames the architecture `DominoDraftModel` to
`DFlashDominoDraftModel`, which its registry lacks (read from vLLM 0.32's EAGLEConfig).
"""

from __future__ import annotations

from typing import Mapping

from blockdraft.errors import ConfigError
from blockdraft.models.draft_config import DraftModelConfig

VLLM_SERVABLE_KEY = "vllm_servable"
SERVING_NOTE_KEY = "serving_note"
# Why vLLM cannot serve each kind, as the marker and the harness's warning say it.
REASONS = {"domino": "vLLM has no Domino drafter (its serial GRU correction head has no vLLM implementation)"}
DOMINO_KEYS = ("correction_hidden_size", "correction_rank")


def reference_only_keys(cfg: DraftModelConfig) -> dict:
    """The marker (and Domino's head sizes, beside the other kinds' keys in dflash_config)."""
    if cfg.kind not in REASONS:
        return {}
    note = (f"{REASONS[cfg.kind]}: serve and check it with the reference engine, "
            "`python -m blockdraft.serve draft=<this dir> target=<target dir>` (engine=auto or engine=reference).")
    return {VLLM_SERVABLE_KEY: False, SERVING_NOTE_KEY: note}


def domino_dflash_config(cfg: DraftModelConfig) -> dict:
    return {key: getattr(cfg, key) for key in DOMINO_KEYS} if cfg.kind == "domino" else {}


def read_domino(cfg: DraftModelConfig, dflash: Mapping, where: str) -> None:
    for key in DOMINO_KEYS:
        if dflash.get(key) is None:
            raise ConfigError(
                f"{where}: a Domino draft needs dflash_config.{key} (all of {list(DOMINO_KEYS)}); re-export it."
            )
        setattr(cfg, key, int(dflash[key]))


def vllm_servable(config: Mapping, kind: str) -> bool:
    """False for a reference-only kind, whatever the marker says, or where the marker says so."""
    return kind not in REASONS and config.get(VLLM_SERVABLE_KEY, True) is not False

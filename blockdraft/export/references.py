"""What each draft kind follows: the paper where one is cited, and the code it is built to match.

The model card prints a kind's lines under "References", and docs/training.md carries the same
lines (a test keeps the two in step). Paper titles are not given: none could be checked against
the paper itself, and an arXiv id is quoted only where the model's own code cites it.
"""

from __future__ import annotations

from typing import Dict, List

VLLM_MODELS = "vLLM 0.32, vllm/model_executor/models/"

REFERENCES: Dict[str, List[str]] = {
    "dflash": [f"code: {VLLM_MODELS}qwen3_dflash.py (`DFlashDraftModel`): module names, masks and computation match it"],
    "dflash2": [f"code: {VLLM_MODELS}qwen3_dflash2.py (`DFlash2DraftModel`), which extends qwen3_dflash.py as this draft does"],
    "jetspec": [f"code: {VLLM_MODELS}qwen3_dflash.py with `is_causal: true` (its per-layer causal attention)",
                "objective: the JetSpec paper's Eq. 9 (configs/objective/jetspec.yaml); no arXiv id is cited here"],
    "domino": ["paper: arXiv 2605.29707 (Domino), the id the model's code cites",
               "code: none in vLLM; the project's reference engine (blockdraft/engine/decoder.py) serves it"],
    "dspark": ["paper: arXiv 2607.05147 (DSpark), the id the model's code cites",
               f"code: {VLLM_MODELS}qwen3_dspark.py (`Qwen3DSparkModel`, `method: dspark`)"],
    "lilicorr": ["paper: arXiv 2608.20530 (LiLiCorr), the id docs/training.md cites",
                 f"code: {VLLM_MODELS}lilicorr.py (`LiLiCorrDraftModel`), whose head vLLM adapted from sglang PR #37462"],
}


def reference_lines(kind: str) -> List[str]:
    """The markdown bullets for one kind (empty for a kind without an entry)."""
    return [f"- {line}" for line in REFERENCES.get(kind, [])]

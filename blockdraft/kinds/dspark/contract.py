"""The tensors vLLM 0.32's DSparkMarkovHead and DSparkConfidenceHead hold (qwen3_dspark.py), under the
loader's `model.` prefix.

Written from vLLM's modules, not from model.py, so checking the draft's state_dict against them checks the draft.
"""

from __future__ import annotations

from typing import Dict

from blockdraft.kinds.spec import Shape


def weight_shapes(cfg) -> Dict[str, Shape]:
    r = cfg.markov_rank
    shapes: Dict[str, Shape] = {
        "markov_head.markov_w1.weight": (cfg.vocab_size, r),
        "markov_head.markov_w2.weight": (cfg.draft_vocab_size or cfg.vocab_size, r),
    }
    if cfg.enable_confidence_head:
        shapes["confidence_head.proj.weight"] = (1, cfg.hidden_size + (r if cfg.confidence_head_with_markov else 0))
        shapes["confidence_head.proj.bias"] = (1,)
    return shapes

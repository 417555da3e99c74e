"""Whether vLLM runs a DFlash draft's attention causally, decided from its config.json as vLLM does.

vLLM 0.32 resolves it per layer (`qwen3_dflash.py` `_dflash_layer_causal`): `is_causal` when
set, else `dflash_config.causal`, else causal exactly for the `sliding_attention` entries of
`layer_types`. A DFlash draft whose every layer is causal is a JetSpec draft; one with none is
DFlash; one causal in its sliding layers only is a draft with causal sliding layers
(`DraftModelConfig.sliding_causal`, speculators' trainer default), of any kind.
"""

from __future__ import annotations

from typing import List, Mapping, Tuple

from blockdraft.errors import ConfigError
from blockdraft.kinds.registry import causal_in_block_kind
from blockdraft.models.draft_config import SLIDING


def vllm_layer_causality(config: Mapping) -> List[bool]:
    """Per draft layer: does vLLM attend causally?"""
    layers = int(config.get("num_hidden_layers") or 0)
    explicit = config.get("is_causal")
    if explicit is None:
        explicit = (config.get("dflash_config") or {}).get("causal")
    if explicit is not None:
        return [bool(explicit)] * layers
    return [layer_is_sliding(config, i) for i in range(layers)]


def layer_is_sliding(config: Mapping, layer: int) -> bool:
    layer_types = config.get("layer_types") or []
    return layer < len(layer_types) and layer_types[layer] == SLIDING


def kind_with_causality(kind: str, config: Mapping, where: str) -> str:
    """A config vLLM runs causally throughout is the kind of its architecture that is causal in the block
    (a DFlashDraftModel one is JetSpec)."""
    return kind_and_sliding_causal(kind, config, where)[0]


def kind_and_sliding_causal(kind: str, config: Mapping, where: str) -> Tuple[str, bool]:
    """(kind, sliding_causal) of the draft vLLM would serve from this config."""
    causal = vllm_layer_causality(config)
    if not any(causal):
        return kind, False
    causal_kind = causal_in_block_kind(kind)
    if causal_kind is not None and all(causal):
        return causal_kind, False
    if all(c == layer_is_sliding(config, i) for i, c in enumerate(causal)):
        return kind, True
    raise ConfigError(
        f"{where}: vLLM would run layers {[i for i, c in enumerate(causal) if c]} of this {kind} draft causally, "
        "full-attention layers among them; this project trains a draft causal in its sliding-window layers only "
        "(or, for DFlash, causal throughout: JetSpec). Set `is_causal` to what the draft was trained with."
    )

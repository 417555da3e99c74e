"""Whether vLLM runs a DFlash draft's attention causally, decided from its config.json as vLLM does.

vLLM 0.32 resolves it per layer (`qwen3_dflash.py` `_dflash_layer_causal`): `is_causal` when
set, else `dflash_config.causal`, else causal exactly for the `sliding_attention` entries of
`layer_types`. A draft whose every layer is causal is a JetSpec draft; one with none is DFlash.
"""

from __future__ import annotations

from typing import List, Mapping

from blockdraft.errors import ConfigError

SLIDING = "sliding_attention"


def vllm_layer_causality(config: Mapping) -> List[bool]:
    """Per draft layer: does vLLM attend causally?"""
    layers = int(config.get("num_hidden_layers") or 0)
    explicit = config.get("is_causal")
    if explicit is None:
        explicit = (config.get("dflash_config") or {}).get("causal")
    if explicit is not None:
        return [bool(explicit)] * layers
    layer_types = config.get("layer_types") or []
    return [i < len(layer_types) and layer_types[i] == SLIDING for i in range(layers)]


def kind_with_causality(kind: str, config: Mapping, where: str) -> str:
    """A DFlash-architecture config is 'jetspec' when vLLM runs it causally throughout."""
    if kind != "dflash":
        return kind
    causal = vllm_layer_causality(config)
    if causal and all(causal):
        return "jetspec"
    if any(causal):
        raise ConfigError(
            f"{where}: vLLM would run layers {[i for i, c in enumerate(causal) if c]} causally and the others not "
            "(from `layer_types`); set `is_causal` to what the draft was trained with (false for DFlash, "
            "true for JetSpec)."
        )
    return kind

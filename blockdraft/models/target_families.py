"""The target families blockdraft can capture from, in one place: where each keeps its decoder
layers, embeddings and head, and what `target_layer_ids` means for it.

For every family here, `target_layer_ids = [i, ...]` means the output of 0-indexed decoder
layer i (the residual stream leaving it, before any final norm): HF `hidden_states[i + 1]`,
and what vLLM records as aux layer i + 1 (`hidden_states + residual` after layer i). vLLM
adds the 1 in `v1/worker/gpu_model_runner.py` (`i + 1 for i in target_layer_ids`); each
family's `vllm_capture` names the model file and line that records layer i + 1. A hybrid
family's Mamba or linear-attention layers are layers like any other in that count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple

from blockdraft.errors import ConfigError


@dataclass(frozen=True)
class TargetFamily:
    name: str
    architectures: Tuple[str, ...]
    backbone: Tuple[str, ...]
    """Attribute path from the HF model to the module holding `layers` (a multimodal model's language model)."""
    embed_keys: Tuple[str, ...]
    """Safetensors names of the input embedding, newest layout first."""
    vllm_capture: str
    """The serving vLLM's file:line that records decoder layer i's output as aux layer i + 1."""
    recurrent: bool = False
    """Has Mamba or linear-attention layers: their state cannot be rewound, so the reference engine
    re-runs the target over the whole sequence instead of cropping a KV cache."""
    head_keys: Tuple[str, ...] = ("lm_head.weight",)


_DECODER = ("model",)
_LANGUAGE_MODEL = ("model", "language_model")
_EMBED = ("model.embed_tokens.weight", "embed_tokens.weight")
_LM_EMBED = ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight")

FAMILIES: Tuple[TargetFamily, ...] = (
    TargetFamily("Qwen3", ("Qwen3ForCausalLM",), _DECODER, _EMBED, "qwen2.py:433"),
    TargetFamily("Qwen3-MoE", ("Qwen3MoeForCausalLM",), _DECODER, _EMBED, "qwen3_moe.py:514"),
    TargetFamily("Qwen2", ("Qwen2ForCausalLM",), _DECODER, _EMBED, "qwen2.py:433"),
    TargetFamily("Llama", ("LlamaForCausalLM",), _DECODER, _EMBED, "llama.py:440"),
    TargetFamily("Mistral", ("MistralForCausalLM",), _DECODER, _EMBED, "llama.py:440"),
    TargetFamily(
        "Qwen3.5", ("Qwen3_5ForCausalLM",), _DECODER, _EMBED + _LM_EMBED[:1], "qwen3_next.py:732", recurrent=True
    ),
    TargetFamily(
        "Qwen3.5-MoE", ("Qwen3_5MoeForCausalLM",), _DECODER, _EMBED + _LM_EMBED[:1], "qwen3_next.py:732", recurrent=True
    ),
    TargetFamily(
        "Qwen3.5 multimodal",
        ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"),
        _LANGUAGE_MODEL,
        _LM_EMBED,
        "qwen3_next.py:732",
        recurrent=True,
    ),
    TargetFamily(
        "Qwen3-VL",
        ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"),
        _LANGUAGE_MODEL,
        _LM_EMBED,
        "qwen3_vl.py:1887",
    ),
    # Released NemotronH checkpoints name the stack `backbone`; transformers 5 loads it as `model`.
    TargetFamily(
        "NemotronH",
        ("NemotronHForCausalLM",),
        _DECODER,
        ("backbone.embeddings.weight", "model.embeddings.weight"),
        "nemotron_h.py:654",
        recurrent=True,
    ),
)

SUPPORTED_ARCHITECTURES: Tuple[str, ...] = tuple(a for f in FAMILIES for a in f.architectures)
_BY_ARCHITECTURE = {a: f for f in FAMILIES for a in f.architectures}


def family_of(architectures: Optional[Sequence[str]]) -> TargetFamily:
    """The family of a config's first architecture, or a refusal naming every supported one."""
    arch = (list(architectures or []) or ["<none>"])[0]
    family = _BY_ARCHITECTURE.get(arch)
    if family is None:
        raise ConfigError(
            f"target architecture {arch!r} cannot expose the hidden states DFlash needs "
            f"(no known decoder-layer stack to hook). Supported: {list(SUPPORTED_ARCHITECTURES)}."
        )
    return family


def text_config(config):
    """The language model's config: itself, or a multimodal config's `text_config`, which then
    also carries the wrapper's pad/eos/bos ids where it has none of its own."""
    getter = getattr(config, "get_text_config", None)
    text = getter() if callable(getter) else config
    if text is not config:
        for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
            if getattr(text, name, None) is None and getattr(config, name, None) is not None:
                setattr(text, name, getattr(config, name))
    return text


def num_layers_in(config: dict) -> Optional[int]:
    """Decoder layers of a config.json (text part): hybrid configs may list their block types
    (`layers_block_type`, `hybrid_override_pattern`) instead of writing `num_hidden_layers`."""
    for key in ("num_hidden_layers", "layers_block_type", "hybrid_override_pattern"):
        value = config.get(key)
        if value is not None:
            return value if isinstance(value, int) else len(value)
    return None


def load_text_config(path: str | Path):
    """The target directory's language-model config, its family checked first."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    family_of(getattr(config, "architectures", None))
    return text_config(config)


def backbone_of(model, family: TargetFamily):
    """The module that owns the decoder layers (and, for a causal LM, the final norm)."""
    module = model
    for name in family.backbone:
        module = getattr(module, name, None)
        if module is None:
            raise ConfigError(
                f"{type(model).__name__} has no `{'.'.join(family.backbone)}`; the installed transformers "
                f"lays out {family.name} differently than blockdraft expects. Use a transformers release "
                "that pyproject.toml allows."
            )
    return module

"""A DFlash, DFlash2 or DSpark draft saved by speculators (the vLLM project's trainer), read as the
vLLM-style config and weight names the importer reads, attention as speculators trained it.

A speculators checkpoint is `config.json` + `model.safetensors` as `save_pretrained` writes them:
`speculators_model_type` dflash | dflash2 | dspark, the draft's Qwen3 shape in
`transformer_layer_config` (the verifier's config with the draft's layer count, its `layer_types`
and `sliding_window`), the target layers as `aux_hidden_state_layer_ids` (vLLM's aux ids: target
layer + 1, as vLLM 0.32's converter undoes) and the kind's keys at the top level. The weights carry
the module's own names, no prefix: `layers.*`, `fc`, `hidden_norm`, `norm`, DFlash2's
`layers.*.{attention,mlp}_conv.*` and `candidate_selector.*`, DSpark's `markov_head.*` and
`confidence_head.*`, plus the verifier's `embed_tokens` and `lm_head` where an older save kept
them, and `d2t`/`t2d` for a reduced vocabulary.

Attention, as speculators trains it (models/dflash/attention.py): a `sliding_attention` layer sees
the context within its window and its own block, causally inside the block unless
`sliding_window_non_causal`; a full layer sees the whole context and its whole block. The vLLM-style
config says the same thing in vLLM's terms (`layer_types`, and `is_causal` only when every layer
agrees), so the export written from it serves as trained; `export/speculators_serving.py` says where
vLLM's own reading of the speculators config would not.

Keys absent from the config are read as vLLM serves them: `sample_from_anchor` false (its
converter's default, not speculators' own true for DSpark), the confidence head off. Shape keys
absent from `transformer_layer_config` are the Qwen3Config defaults speculators rebuilds its layers with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from blockdraft.errors import ConfigError
from blockdraft.kinds.dspark.checks import MARKOV_HEAD_TYPES
from blockdraft.kinds.dspark.export import SPECULATORS_SAMPLE_FROM_ANCHOR_DEFAULT
from blockdraft.models.draft_config import SLIDING, DraftModelConfig

TYPE_KEY = "speculators_model_type"
# The vLLM architecture each speculators kind is read as (vLLM 0.32's converter picks the same ones). Keyed by
# speculators' own type names, another stack's vocabulary: each type is read through this module's conversion
# of it (its defaults, its keys, its attention), which a registry field naming a kind's type would not bring.
READ_TYPES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel", "dspark": "Qwen3DSparkModel"}
# speculators' own default of `sliding_window_non_causal` per kind (its config classes), what a
# checkpoint that lacks the key was trained with.
NON_CAUSAL_DEFAULT = {"dflash": False, "dflash2": True, "dspark": False}
# DFlash2's dflash_config keys and speculators' defaults for them (DFlash2SpeculatorConfig).
DFLASH2_DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
# transformers' Qwen3Config defaults, for keys a layer config saved as a diff leaves out.
QWEN3_DEFAULTS = {"num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": 128, "hidden_act": "silu",
                  "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "vocab_size": 151936,
                  "hidden_size": 4096, "intermediate_size": 22016}
ROPE_THETA_DEFAULT = 10000.0
# Qwen3Config's window defaults, which decide a layer config saved without them.
QWEN3_SLIDING_WINDOW = 4096
QWEN3_MAX_WINDOW_LAYERS = 28
# The DSpark keys copied as they are (vLLM's update_dspark copies the same ones).
HEAD_KEYS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov", "dspark_draft_topk")
# Tensors a speculators checkpoint carries that the draft does not own: the verifier's embedding
# (frozen, loaded from the verifier), t2d (training's target -> draft mask; d2t says the same), and
# the verifier's head and norm (excluded on save by speculators, dropped if an older save has them).
# Serving shares the target's embedding, as vLLM does for a draft without one.
DROPPED = ("embed_tokens.weight", "t2d", "verifier_lm_head.weight", "verifier_norm.weight")
# The full-vocabulary `lm_head` is the verifier's head copied verbatim and frozen: the target's own
# head stands in for it. A reduced vocabulary's `lm_head` (the target's rows for the draft's tokens)
# is the draft's own and kept, with d2t.
FULL_VOCAB_HEAD = "lm_head.weight"


def is_speculators_config(config: Mapping) -> bool:
    return TYPE_KEY in config


def speculators_kind(config: Mapping, where: str = "config.json") -> str:
    kind = config.get(TYPE_KEY)
    if kind not in READ_TYPES:
        raise ConfigError(
            f"{where}: {TYPE_KEY}={kind!r}; of speculators' checkpoints {sorted(READ_TYPES)} are read here "
            "(the block drafters vLLM serves). Train it with speculators' --speculator-type dflash, dflash2 or dspark, "
            "or export it in vLLM's layout first."
        )
    return kind


def vllm_style_config(config: Mapping, where: str = "config.json") -> dict:
    """The vLLM-style config.json a speculators DFlash, DFlash2 or DSpark config describes."""
    kind = speculators_kind(config, where)
    layer = dict(config.get("transformer_layer_config") or {})
    if not layer:
        raise ConfigError(f"{where}: `transformer_layer_config` is missing; a speculators checkpoint holds the draft's Qwen3 shape there.")
    _check_layer_config(layer, where)
    if kind != "dspark" and config.get("sample_from_anchor"):
        raise ConfigError(
            f"{where}: sample_from_anchor=true on a {kind} draft: vLLM 0.32's DFlash speculator refuses it (its anchor "
            "is the bonus token) and this project trains that layout for DSpark only. Retrain without --sample-from-anchor."
        )
    target_ids = _target_layer_ids(config, where)
    if config.get("mask_token_id") is None:
        raise ConfigError(f"{where}: `mask_token_id` is missing; speculators saves the one it trained with (--mask-token-id).")
    shape = {key: layer.get(key, default) for key, default in QWEN3_DEFAULTS.items()}
    heads = int(shape["num_attention_heads"])
    theta = _rope_theta(layer, where)
    block_size = config.get("block_size")
    if block_size is None:
        raise ConfigError(f"{where}: `block_size` is missing; add the block size the draft was trained with.")
    dflash_config = {"mask_token_id": config["mask_token_id"], "target_layer_ids": target_ids, "block_size": int(block_size)}
    if kind == "dflash2":
        dflash_config.update({key: int(config.get(key) or default) for key, default in DFLASH2_DEFAULTS.items()})
    out = {
        "architectures": [READ_TYPES[kind]],
        "model_type": "qwen3",
        **shape,
        "num_key_value_heads": layer.get("num_key_value_heads") or heads,
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        # speculators builds fc for len(ids) x the layer config's width (its draft is as wide as the target).
        "target_hidden_size": config.get("target_hidden_size") or shape["hidden_size"],
        "num_target_layers": _verifier_layers(config) or max(target_ids) + 2,
        "block_size": int(block_size),
        "draft_vocab_size": config.get("draft_vocab_size"),
        "dflash_config": dflash_config,
        **attention_keys(kind, config),
    }
    if kind == "dspark":
        out.update(_dspark_keys(config, where, target_ids))
    return out


def trained_layer_types(config: Mapping) -> Tuple[List[str], Optional[int]]:
    """(each draft layer's attention, the window) as speculators rebuilt them: through transformers'
    Qwen3Config, whose window is null unless `use_sliding_window`, and whose absent `layer_types` slide
    from `max_window_layers` on. With no window speculators masks a sliding layer as a full one."""
    layer, layers = config.get("transformer_layer_config") or {}, draft_layers(config)
    window = layer.get("sliding_window", QWEN3_SLIDING_WINDOW) if layer.get("use_sliding_window") else None
    if window is None:
        return ["full_attention"] * layers, None
    first_sliding = layer.get("max_window_layers", QWEN3_MAX_WINDOW_LAYERS)
    types = list(layer.get("layer_types") or [SLIDING if i >= first_sliding else "full_attention" for i in range(layers)])
    return types, int(window)


def trained_sliding_causal(kind: str, config: Mapping) -> bool:
    """Whether the sliding layers were trained causal inside the block (full layers never are)."""
    return not bool(config.get("sliding_window_non_causal", NON_CAUSAL_DEFAULT[kind]))


def trained_causality(kind: str, config: Mapping, types: List[str]) -> List[bool]:
    """Per layer of `types` (trained_layer_types'), whether speculators trained it causal inside the block."""
    return [t == SLIDING and trained_sliding_causal(kind, config) for t in types]


def draft_layers(config: Mapping) -> int:
    """The draft's layer count, as speculators' Qwen3Config rebuilds it."""
    layer = config.get("transformer_layer_config") or {}
    return int(layer.get("num_hidden_layers", QWEN3_DEFAULTS["num_hidden_layers"]))


def attention_keys(kind: str, config: Mapping) -> dict:
    """`layer_types`, the window, and `is_causal` when every layer agrees: vLLM's reading of it is
    what speculators trained (qwen3_dflash.py `_resolve_layer_attention`)."""
    types, window = trained_layer_types(config)
    causal = trained_causality(kind, config, types)
    out: dict = {"is_causal": causal[0]} if len(set(causal)) == 1 else {}
    if SLIDING in types:
        out.update({"use_sliding_window": True, "layer_types": types, "sliding_window": window})
    return out


def _dspark_keys(config: Mapping, where: str, target_ids: list) -> dict:
    head_type = config.get("markov_head_type") or "vanilla"
    if head_type not in MARKOV_HEAD_TYPES:
        raise ConfigError(
            f"{where}: markov_head_type={head_type!r}: vLLM 0.32 serves only the {list(MARKOV_HEAD_TYPES)} Markov head "
            "(qwen3_dspark.py); retrain with speculators' --markov-head-type vanilla."
        )
    rank = config.get("markov_rank")
    if rank is not None and int(rank) < 1:
        raise ConfigError(
            f"{where}: markov_rank={rank} (no Markov head): vLLM's DSpark always builds one; "
            "retrain with --markov-rank >= 1, or train a DFlash draft."
        )
    out = {
        "target_layer_ids": target_ids,
        "mask_token_id": config["mask_token_id"],
        "sample_from_anchor": bool(config.get("sample_from_anchor", SPECULATORS_SAMPLE_FROM_ANCHOR_DEFAULT)),
    }
    out.update({key: config[key] for key in HEAD_KEYS if config.get(key) is not None})
    out["markov_head_type"] = head_type
    return out


def _check_layer_config(layer: Mapping, where: str) -> None:
    model_type = layer.get("model_type", "qwen3")
    if model_type != "qwen3":
        raise ConfigError(
            f"{where}: transformer_layer_config.model_type={model_type!r}; vLLM's Qwen3 block drafters and "
            "this project's are Qwen3 layers. Retrain with speculators' qwen3 draft architecture."
        )
    odd = sorted({t for t in layer.get("layer_types") or [] if t not in ("full_attention", SLIDING)})
    if odd:
        raise ConfigError(
            f"{where}: transformer_layer_config.layer_types has {odd}; speculators' DFlash drafts are built of "
            f"full_attention and {SLIDING} layers only. Retrain with those."
        )


def _target_layer_ids(config: Mapping, where: str) -> list:
    aux = config.get("aux_hidden_state_layer_ids")
    if not aux:
        raise ConfigError(
            f"{where}: `aux_hidden_state_layer_ids` is missing; speculators saves the target layers it trained on "
            "there (--target-layer-ids)."
        )
    if min(aux) < 1:
        raise ConfigError(
            f"{where}: aux_hidden_state_layer_ids={aux} holds {min(aux)}; vLLM reads aux id i as target layer i - 1, "
            "so every id must be >= 1."
        )
    return [int(i) - 1 for i in aux]


def _rope_theta(layer: Mapping, where: str) -> float:
    params = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    params = params.get("full_attention", params)  # per-layer-type parameters (speculators reads them too)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type != "default":
        raise ConfigError(
            f"{where}: transformer_layer_config's rope_type is {rope_type!r}; this project's drafts use default RoPE "
            "(rope_theta only). Retrain the draft without RoPE scaling."
        )
    theta = params.get("rope_theta") or layer.get("rope_theta")
    return float(theta) if theta else ROPE_THETA_DEFAULT


def verifier_path(config: Mapping):
    """The verifier speculators trained against, as it recorded it (a local directory or a Hub id), or None."""
    return ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")


def _verifier_layers(config: Mapping):
    """The verifier's layer count when its recorded path is a local model directory, else None."""
    path = verifier_path(config)
    if not path or not (Path(path) / "config.json").is_file():
        return None
    try:
        verifier = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return (verifier.get("text_config") or verifier).get("num_hidden_layers")


def draft_tensors(state: Dict[str, torch.Tensor], cfg: DraftModelConfig) -> Dict[str, torch.Tensor]:
    """The draft's own tensors of a speculators checkpoint (names already without a `model.` prefix)."""
    dropped = DROPPED if cfg.draft_vocab_size else DROPPED + (FULL_VOCAB_HEAD,)
    return {name: tensor for name, tensor in state.items() if name not in dropped}

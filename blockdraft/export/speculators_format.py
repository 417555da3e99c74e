"""A DSpark draft saved by speculators (the vLLM project's trainer), read as the vLLM-style config
and weight names the importer reads.

A speculators checkpoint is `config.json` + `model.safetensors` as `save_pretrained` writes them:
`speculators_model_type: "dspark"`, `architectures: ["DSparkSpeculator"]`, the draft's Qwen3 shape
in `transformer_layer_config` (the verifier's config with the draft's layer count), the target
layers as `aux_hidden_state_layer_ids` (vLLM's aux ids: target layer + 1, as vLLM 0.32's
`update_dspark` undoes) and the DSpark keys at the top level. The weights carry the module's own
names, no prefix: `layers.*`, `fc`, `hidden_norm`, `norm`, `markov_head.*`, `confidence_head.*`,
plus the verifier's `embed_tokens` and `lm_head`, and `d2t`/`t2d` for a reduced vocabulary.

Keys absent from the config are read as vLLM serves them: `sample_from_anchor` false (its
converter's default, not speculators' own true), the confidence head off. Shape keys absent from
`transformer_layer_config` are the Qwen3Config defaults speculators rebuilds its layers with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Mapping

import torch

from blockdraft.errors import ConfigError
from blockdraft.export.dspark_config import SPECULATORS_SAMPLE_FROM_ANCHOR_DEFAULT
from blockdraft.models.draft_config import MARKOV_HEAD_TYPES, DraftModelConfig

TYPE_KEY = "speculators_model_type"
READ_TYPES = ("dspark",)
# transformers' Qwen3Config defaults, for keys a layer config saved as a diff leaves out.
QWEN3_DEFAULTS = {"num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": 128, "hidden_act": "silu",
                  "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "vocab_size": 151936,
                  "hidden_size": 4096, "intermediate_size": 22016}
ROPE_THETA_DEFAULT = 10000.0
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


def vllm_style_config(config: Mapping, where: str = "config.json") -> dict:
    """The vLLM-style config.json (`Qwen3DSparkModel`) a speculators DSpark config describes."""
    kind = config.get(TYPE_KEY)
    if kind not in READ_TYPES:
        raise ConfigError(
            f"{where}: {TYPE_KEY}={kind!r}; of speculators' checkpoints only {list(READ_TYPES)} is read here. "
            "Train it with speculators' --speculator-type dspark, or export it in vLLM's layout first."
        )
    layer = dict(config.get("transformer_layer_config") or {})
    if not layer:
        raise ConfigError(f"{where}: `transformer_layer_config` is missing; a speculators checkpoint holds the draft's Qwen3 shape there.")
    _check_layer_config(layer, where)
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
    target_ids = _target_layer_ids(config, where)
    if config.get("mask_token_id") is None:
        raise ConfigError(f"{where}: `mask_token_id` is missing; speculators saves the one it trained with (--mask-token-id).")
    shape = {key: layer.get(key, default) for key, default in QWEN3_DEFAULTS.items()}
    heads = int(shape["num_attention_heads"])
    theta = _rope_theta(layer, where)
    block_size = config.get("block_size")
    if block_size is None:
        raise ConfigError(f"{where}: `block_size` is missing; add the block size the draft was trained with.")
    out = {
        "architectures": ["Qwen3DSparkModel"],
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
        "dflash_config": {"mask_token_id": config["mask_token_id"], "target_layer_ids": target_ids, "block_size": int(block_size)},
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
            f"{where}: transformer_layer_config.model_type={model_type!r}; vLLM's Qwen3DSparkModel and this "
            "project's DSpark draft are Qwen3 layers. Retrain with speculators' qwen3 draft architecture."
        )
    sliding = [i for i, t in enumerate(layer.get("layer_types") or []) if t != "full_attention"]
    if sliding or layer.get("use_sliding_window"):
        raise ConfigError(
            f"{where}: transformer_layer_config has sliding-window layers {sliding or 'all'}; this project's DSpark "
            "draft attends to the whole context in every layer. Retrain with full attention in every draft layer."
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


def _verifier_layers(config: Mapping):
    """The verifier's layer count when its recorded path is a local model directory, else None."""
    path = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
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

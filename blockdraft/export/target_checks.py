"""Does a draft fit the target it will be served with? Read from the target's config files only.

Each of these loads and serves without complaint in vLLM and then fails quietly: a
vocabulary or width mismatch gives garbage drafts, a layer id of L-1 captures the
pre-norm state instead of the trained post-norm one, and a mask id that aliases pad or
eos erodes acceptance. No weights are read, so this is cheap on any target size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from blockdraft.errors import ConfigError
from blockdraft.models.draft_config import DraftModelConfig, layers_outside
from blockdraft.models.target_families import num_layers_in

SPECIAL_ROLES = ("pad", "eos", "bos")


def check_against_target(cfg: DraftModelConfig, target_dir: str | Path) -> None:
    """Raise one ConfigError listing every mismatch between `cfg` and the target at `target_dir`."""
    target_dir = Path(target_dir)
    config = target_text_config(target_dir)
    problems = [
        _vocab_problem(cfg, config, target_dir),
        _width_problem(cfg, config, target_dir),
        _layer_problem(cfg, config, target_dir),
        *_mask_problems(cfg, config, target_dir),
    ]
    problems = [p for p in problems if p]
    if problems:
        raise ConfigError(f"the draft does not fit the target {target_dir}:\n  - " + "\n  - ".join(problems))


def read_json(path: Path) -> Optional[dict]:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON ({err}); repair the target's files.") from err


def target_text_config(target_dir: Path) -> dict:
    """The target's config.json; for multimodal wrappers, the language model's `text_config`."""
    config = read_json(target_dir / "config.json")
    if config is None:
        raise ConfigError(
            f"target={target_dir} has no config.json; give the Hugging Face directory of the target model."
        )
    if "vocab_size" not in config and isinstance(config.get("text_config"), dict):
        return config["text_config"]
    return config


def _vocab_problem(cfg: DraftModelConfig, config: dict, target_dir: Path) -> Optional[str]:
    vocab = config.get("vocab_size")
    if vocab is None or vocab == cfg.vocab_size:
        return None
    return (
        f"vocab_size: draft {cfg.vocab_size}, target {vocab} ({target_dir}/config.json). vLLM shares the "
        "target's embedding and head, so the draft must be trained for this target: export with target= "
        "the model it was trained on, or retrain against this one."
    )


def _width_problem(cfg: DraftModelConfig, config: dict, target_dir: Path) -> Optional[str]:
    width = config.get("hidden_size")
    if width is None or width == cfg.target_hidden_size:
        return None
    n = len(cfg.target_layer_ids)
    return (
        f"target_hidden_size: draft {cfg.target_hidden_size} (fc.weight takes {n} x {cfg.target_hidden_size} = "
        f"{n * cfg.target_hidden_size} inputs), target hidden_size {width} (vLLM feeds {n} x {width} = "
        f"{n * width}). The draft was trained on another target; use that target, or retrain."
    )


def _layer_problem(cfg: DraftModelConfig, config: dict, target_dir: Path) -> Optional[str]:
    layers = num_layers_in(config)
    if layers is None:
        return None
    bad = layers_outside(cfg.target_layer_ids, layers)
    if not bad:
        return None
    return (
        f"dflash_config.target_layer_ids: {cfg.target_layer_ids} has {bad} outside [0, {layers - 2}], but the "
        f"target has num_hidden_layers {layers} (the last layer is excluded: vLLM captures it before the "
        "final norm). The draft was trained on a deeper target; use that target, or retrain with ids in range."
    )


def _mask_problems(cfg: DraftModelConfig, config: dict, target_dir: Path) -> List[str]:
    mask, vocab = cfg.mask_token_id, config.get("vocab_size")
    if vocab is not None and not 0 <= mask < vocab:
        return [
            f"dflash_config.mask_token_id: {mask} is outside the target's embedding table [0, {vocab}); "
            "retrain with a reserved token id of this target."
        ]
    specials = special_token_ids(target_dir, config)
    return [
        f"dflash_config.mask_token_id: {mask} is the target's {role} token ({where}); the runtime fills "
        "drafted slots with it, so it would alias real text and erode acceptance. Retrain with a reserved, "
        "rarely used token (not pad, eos or bos)."
        for role, token_id, where in specials
        if token_id == mask
    ]


def special_token_ids(target_dir: Path, config: dict) -> List[Tuple[str, int, str]]:
    """(role, id, where) for every pad/eos/bos id named by the target's config or tokenizer files."""
    found: Dict[Tuple[str, int], str] = {}
    sources = [("config.json", config), ("generation_config.json", read_json(target_dir / "generation_config.json"))]
    for name, data in sources:
        for role in SPECIAL_ROLES:
            for token_id in _as_ids((data or {}).get(f"{role}_token_id")):
                found.setdefault((role, token_id), f"{role}_token_id in {name}")
    vocab = _tokenizer_vocab(target_dir)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        data = read_json(target_dir / name) or {}
        for role in SPECIAL_ROLES:
            text = _token_text(data.get(f"{role}_token"))
            if text is not None and text in vocab:
                found.setdefault((role, vocab[text]), f"{role}_token {text!r} in {name}")
    return [(role, token_id, where) for (role, token_id), where in found.items()]


def _as_ids(value) -> List[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int)]
    return []


def _token_text(value) -> Optional[str]:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _tokenizer_vocab(target_dir: Path) -> Dict[str, int]:
    """Token text -> id from tokenizer.json and tokenizer_config.json's added_tokens_decoder."""
    vocab: Dict[str, int] = {}
    tokenizer = read_json(target_dir / "tokenizer.json") or {}
    model_vocab = (tokenizer.get("model") or {}).get("vocab")
    if isinstance(model_vocab, dict):
        vocab.update(model_vocab)
    for token in tokenizer.get("added_tokens") or []:
        vocab[token["content"]] = token["id"]
    decoder = (read_json(target_dir / "tokenizer_config.json") or {}).get("added_tokens_decoder") or {}
    for token_id, token in decoder.items():
        vocab[token["content"]] = int(token_id)
    return vocab

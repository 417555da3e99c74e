"""Helpers that propose draft settings for a target: the layer spread and mask-token candidates.

    python -m blockdraft.models.suggest target=<target_dir> [num_draft_layers=5]
    python -m blockdraft.models.suggest <target_dir> [num_draft_layers]

print both (`blockdraft suggest ...` is the same command; `--cfg job` prints the settings it would use).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List

from blockdraft.errors import ConfigError
from blockdraft.models.draft_config import check_layer_ids, default_layer_ids
from blockdraft.models.target import special_token_ids


def suggest_layer_ids(num_target_layers: int, n: int) -> List[int]:
    """The usual spread, refused (with the reason) where it collapses on a small target."""
    ids = default_layer_ids(num_target_layers, n)
    check_layer_ids(ids, num_target_layers)
    return ids


def mask_token_candidates(tokenizer, vocab_size: int, target_config=None, limit: int = 10) -> List[tuple]:
    """(id, text) of added special tokens that are neither pad, bos nor eos, inside the
    embedding table; reserved-looking names first, since the template never emits them."""
    forbidden = set(special_token_ids(target_config, tokenizer))
    found = []
    for token_id, token in sorted(tokenizer.added_tokens_decoder.items()):
        if token_id in forbidden or token_id >= vocab_size or not token.special:
            continue
        found.append((token_id, token.content))
    found.sort(key=lambda pair: (not any(w in pair[1].lower() for w in ("reserved", "unused", "mask", "fim")), pair[0]))
    return found[:limit]


@dataclass
class SuggestSettings:
    target: str = ""
    """The target's local Hugging Face directory (or the first word without `=`)."""
    num_draft_layers: int = 5
    """Draft layers the target_layer_ids spread is for (or the second word without `=`)."""


def parse_arguments(argv: List[str]) -> SuggestSettings:
    """`target=<dir> num_draft_layers=<n>`, or the same two values as positional words."""
    values, positional = {}, []
    for word in argv:
        key, sep, value = word.partition("=")
        if not sep:
            positional.append(word)
        elif key in SuggestSettings.__dataclass_fields__:
            values[key] = value
        else:
            raise ConfigError(f"{key}= is not a key of suggest; its keys are target=<dir> and num_draft_layers=<n>.")
    if len(positional) > 2:
        raise ConfigError(f"{positional}: suggest takes a target directory and a number of draft layers, no more.")
    for key, value in zip(("target", "num_draft_layers"), positional):
        values.setdefault(key, value)
    try:
        settings = SuggestSettings(values.get("target", ""), int(values.get("num_draft_layers", 5)))
    except ValueError:
        raise ConfigError(f"num_draft_layers={values['num_draft_layers']!r} is not a whole number.") from None
    if not settings.target:
        raise ConfigError("no target: write `python -m blockdraft.models.suggest target=<target_dir> [num_draft_layers=5]`.")
    if not (Path(settings.target) / "config.json").is_file():
        raise ConfigError(f"target={settings.target} has no config.json; give the target's local Hugging Face directory.")
    if settings.num_draft_layers < 1:
        raise ConfigError(f"num_draft_layers={settings.num_draft_layers}: use 1 or more.")
    return settings


def usage() -> str:
    from blockdraft.config.key_table import key_rows, render_rows

    return f"{__doc__.strip()}\n\nkeys:\n{render_rows(key_rows(SuggestSettings, SuggestSettings()))}"


def main(argv: List[str]) -> int:
    from blockdraft.config.cfg_flag import split_cfg_job

    if any(a in ("-h", "--help") for a in argv):
        print(usage())
        return 0
    try:
        argv, show_config = split_cfg_job(argv, "the settings suggest would use")
        settings = parse_arguments(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if show_config:
        print(f"target: {settings.target}\nnum_draft_layers: {settings.num_draft_layers}")
        return 0
    from transformers import AutoConfig, AutoTokenizer

    from blockdraft.models.target_families import text_config

    config = text_config(AutoConfig.from_pretrained(settings.target))
    tokenizer = AutoTokenizer.from_pretrained(settings.target)
    n = settings.num_draft_layers
    try:
        print(f"target_layer_ids for {n} draft layers: {suggest_layer_ids(config.num_hidden_layers, n)}")
    except ConfigError as err:
        print(f"target_layer_ids: {err}")
    print("mask_token_id candidates (id, token):")
    for token_id, text in mask_token_candidates(tokenizer, config.vocab_size, config):
        print(f"  {token_id}\t{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

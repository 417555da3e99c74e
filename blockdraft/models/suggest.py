"""Helpers that propose draft settings for a target: the layer spread and mask-token candidates, printed as
keys to paste with what each means.

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
    from blockdraft.config.cfg_flag import front_door

    done, settings = front_door(argv, usage, parse_arguments,
                                lambda s: f"target: {s.target}\nnum_draft_layers: {s.num_draft_layers}",
                                "the settings suggest would use")
    if done is not None:
        return done
    from transformers import AutoConfig, AutoTokenizer

    from blockdraft.models.target_families import text_config

    config = text_config(AutoConfig.from_pretrained(settings.target))
    tokenizer = AutoTokenizer.from_pretrained(settings.target)
    print("\n".join(report(settings, config, tokenizer)))
    return 0


def fitting_layer_count(num_target_layers: int, wanted: int) -> int:
    """`wanted`, or the most draft layers below it whose spread over a small target stays distinct."""
    for n in range(wanted, 0, -1):
        try:
            suggest_layer_ids(num_target_layers, n)
            return n
        except ConfigError:
            continue
    return 1


def report(settings: SuggestSettings, config, tokenizer) -> List[str]:
    """What suggest prints: the target, the keys to paste, what each means, the other mask candidates and a
    pipeline command that uses them (docs/your-own-target.md walks through it)."""
    layers = config.num_hidden_layers
    n = fitting_layer_count(layers, settings.num_draft_layers)
    ids = suggest_layer_ids(layers, n)
    candidates = mask_token_candidates(tokenizer, config.vocab_size, config)
    arch = ",".join(getattr(config, "architectures", None) or ["?"])
    lines = [f"target  {settings.target}: {arch}, {layers} layers, hidden {config.hidden_size}, vocab {config.vocab_size}"]
    if n != settings.num_draft_layers:
        lines.append(f"        {settings.num_draft_layers} draft layers would tap the same target layer twice on "
                     f"{layers} layers: {n} suggested")
    mask = f"draft.mask_token_id={candidates[0][0]}" if candidates else "draft.mask_token_id=<none found: see below>"
    keys = [mask, f"draft.target_layer_ids=[{','.join(map(str, ids))}]", f"draft.num_layers={n}", "draft.block_size=16"]
    lines += ["", "keys (give them to `blockdraft pipeline` or `blockdraft train`):", "  " + " ".join(keys), ""]
    lines += [f"  {keys[0]:<36} the token the draft's MASK slots hold: "
              + (f"{candidates[0][1]!r}, a reserved special token the chat template never emits (never pad, eos or "
                 "bos). Other candidates are below, reserved-looking names first; skip any the chat template "
                 "writes (such as <|im_start|>)." if candidates else
                 "this tokenizer has no spare special token. Add one to the tokenizer, or give any id the chat "
                 "template never emits with draft.train_mask_embedding=true."),
              f"  {keys[1]:<36} the target layers whose outputs feed the draft (HF hidden_states[i + 1]): an early "
              "layer to the third-to-last, spread evenly; vLLM reads the same layers.",
              f"  {keys[2]:<36} the draft's own decoder layers, one per tapped layer here: 5 for 4B-8B targets "
              "(the published drafts), 1 for a CPU draft; more layers accept more and cost more per round.",
              f"  {keys[3]:<36} slots per block, anchor included: vLLM drafts block_size - 1 tokens a round. 16 on "
              "a GPU (the published drafts); 4 on a CPU, where a longer block makes a round cost more.",
              "", "mask_token_id candidates (id, token):"]
    lines += [f"  {token_id}\t{text}" for token_id, text in candidates]
    lines += ["", "a pipeline with these keys (docs/your-own-target.md):",
              f"  .venv/bin/blockdraft pipeline target={settings.target} out=runs/mine prompts=<your chats.jsonl> "
              f"experiment=dflash_gpu gate=true {' '.join(keys)}"]
    return lines

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Helpers that propose draft settings for a target: the layer spread and mask-token candidates.

`python -m blockdraft.models.suggest <target_dir> [num_draft_layers]` prints both.
"""

from __future__ import annotations

import sys
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


def main(argv: List[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    if not argv:
        print("usage: python -m blockdraft.models.suggest <target_dir> [num_draft_layers]", file=sys.stderr)
        return 2
    from transformers import AutoConfig, AutoTokenizer

    from blockdraft.models.target_families import text_config

    config = text_config(AutoConfig.from_pretrained(argv[0]))
    tokenizer = AutoTokenizer.from_pretrained(argv[0])
    n = int(argv[1]) if len(argv) > 1 else 5
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

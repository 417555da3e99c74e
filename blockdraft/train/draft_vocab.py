"""A reduced draft vocabulary: the N target tokens the replies use most.

The draft then projects onto N rows instead of the target's V, which is most of a small
draft's cost per supervised slot. vLLM serves it with the draft's own `lm_head` and a
`d2t` offset table, filling the other V - N logits with -inf, so a token outside the set
can never be drafted: the set is the N most frequent reply tokens (what the draft is
asked to predict), plus the tokens replies end with, which every reply needs.
"""

from __future__ import annotations

from typing import Sequence

import torch

from blockdraft.errors import ConfigError


def reply_token_counts(dataset, vocab_size: int) -> torch.Tensor:
    """[V] how often each token is a supervised (reply) token in `dataset`, counted a block at a time."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for block in dataset.reply_token_blocks():
        counts += torch.bincount(block.long(), minlength=vocab_size)[:vocab_size]
    return counts


def required_tokens(dataset, eos_ids: Sequence[int]) -> torch.Tensor:
    """Tokens the vocabulary must hold: every token a reply ends with, and the target's eos ids."""
    ends = dataset.reply_end_tokens().tolist()
    return torch.tensor(sorted(set(ends) | set(int(i) for i in eos_ids)), dtype=torch.long)


def select_draft_vocab(counts: torch.Tensor, size: int, required: torch.Tensor) -> torch.Tensor:
    """[size] sorted target ids: `required`, then the most frequent others (ties: lower id first)."""
    vocab = len(counts)
    if not 1 <= size < vocab:
        raise ConfigError(f"draft.draft_vocab_size={size} must be in [1, {vocab}); use null for the full vocabulary.")
    if len(required) > size:
        raise ConfigError(
            f"draft.draft_vocab_size={size} cannot hold the {len(required)} tokens replies end with; use a larger size."
        )
    score = counts.double()
    score[required] = float("inf")
    # Stable order: by count descending, ties by id ascending (sort is stable on the id order).
    order = torch.sort(score, descending=True, stable=True).indices
    return order[:size].sort().values


def coverage(counts: torch.Tensor, token_ids: torch.Tensor) -> float:
    """Share of reply tokens whose id is in `token_ids`."""
    total = int(counts.sum())
    return float(counts[token_ids].sum()) / total if total else 0.0


def eos_ids_of(target_config, tokenizer) -> list:
    ids = set()
    for source in (target_config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    return sorted(ids)


def choose_draft_vocab(draft, train_data, lm_head_weight: torch.Tensor, tokenizer, target_config, verbose: bool) -> float:
    """Pick the vocabulary from the training replies and load the target's head rows for it.
    Every rank computes the same set from the same rows. Returns the share of reply tokens covered."""
    cfg = draft.config
    counts = reply_token_counts(train_data, cfg.vocab_size)
    ids = select_draft_vocab(counts, cfg.draft_vocab_size, required_tokens(train_data, eos_ids_of(target_config, tokenizer)))
    draft.set_draft_vocab(ids, lm_head_weight)
    share = coverage(counts, ids)
    if verbose:
        print(
            f"[draft vocab] {cfg.draft_vocab_size} of {cfg.vocab_size} target tokens cover {share:.2%} of the "
            f"{int(counts.sum()):,} reply tokens of the training data; the other {1 - share:.2%} are labels "
            "outside the draft's vocabulary, excluded from the loss (metrics: label_outside_vocab_share)",
            flush=True,
        )
    return share

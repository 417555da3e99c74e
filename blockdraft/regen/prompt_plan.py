"""Which prompts regen answers, before any generation: the training and held-out splits of a prompt
set, the held-out ones reserved first where a file is short, refused where the ranges would overlap.
The pipeline's preflight plans the same splits (blockdraft/pipeline/prompt_supply.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List

from blockdraft.errors import ConfigError
from blockdraft.regen.turns import prompt_ids, turn_inputs

if TYPE_CHECKING:
    from blockdraft.regen.app import RegenConfig

# The smoke-serve harness reads held-out ShareGPT prompts from here on (blockdraft/serve/prompts.py: data
# may not import serve); so does regen.
SHAREGPT_HELD_OUT_SKIP = 10_000


@dataclass
class PromptSplit:
    conversations: List[List[dict]]
    first_source_position: int  # 0-based position in the prompt set of the first one taken
    end_source_position: int  # one past the last one read
    skipped_long: List[int] = field(default_factory=list)  # source positions over max_prompt_tokens
    opening_lengths: List[int] = field(default_factory=list)  # templated tokens of each taken conversation's opening


def source_conversations(spec: str, limit: int) -> List[List[dict]]:
    """The set's conversations that open with a user question, in order, at most `limit`."""

    if spec == "tiny_prompts":
        from blockdraft.data.builtin_prompts import tiny_prompts

        return list(tiny_prompts(limit))
    if spec == "sharegpt":
        from blockdraft.data.sharegpt import iter_sharegpt_rows

        rows = iter_sharegpt_rows()
    else:
        from blockdraft.data.rows import iter_rows, new_report

        rows = iter_rows(spec, new_report(spec))
    out = []
    for row in rows:
        if len(out) >= limit:
            break
        if turn_inputs(row.messages, 1):
            out.append(row.messages)
    return out


def take_prompts(conversations: List[List[dict]], n: int, skip: int, length_of, max_tokens: int) -> PromptSplit:
    """`n` conversations from position `skip` on whose opening fits in `max_tokens`; those that do not are counted."""
    split = PromptSplit([], skip, skip)
    for position in range(skip, len(conversations)):
        if len(split.conversations) >= n:
            break
        split.end_source_position = position + 1
        length = length_of(conversations[position])
        if length <= max_tokens:
            split.conversations.append(conversations[position])
            split.opening_lengths.append(length)
        else:
            split.skipped_long.append(position)
    return split


def plan_splits(cfg: RegenConfig, tokenizer) -> Dict[str, PromptSplit]:
    """Training and held-out prompts, before any generation. With the held-out range right after the
    training one (a prompt file), the held-out prompts are reserved first and the training ones take
    the rest; a file that cannot hold the held-out prompts and one training prompt is refused."""

    lengths: Dict[int, int] = {}  # by id(): the reservation and the split read the same conversations

    def length_of(conversation):
        if id(conversation) not in lengths:
            lengths[id(conversation)] = len(prompt_ids(tokenizer, turn_inputs(conversation, 1)[0], cfg.chat_template_kwargs))
        return lengths[id(conversation)]

    heldout_skip = cfg.heldout_skip
    # Generous: enough rows for the skipped-long prompts of both splits.
    budget = 2 * (cfg.num_train + cfg.num_heldout) + cfg.train_skip + (heldout_skip or 0) + 64
    if cfg.prompts == "sharegpt" and heldout_skip is None:
        heldout_skip = SHAREGPT_HELD_OUT_SKIP
        budget += heldout_skip
    conversations = source_conversations(cfg.prompts, budget)
    num_train = cfg.num_train
    if heldout_skip is None:
        num_train = reserve_heldout(cfg, take_prompts(conversations, cfg.num_train + cfg.num_heldout, cfg.train_skip,
                                                      length_of, cfg.max_prompt_tokens))
    train = take_prompts(conversations, num_train, cfg.train_skip, length_of, cfg.max_prompt_tokens)
    if heldout_skip is None:
        heldout_skip = train.end_source_position
    check_disjoint(train, heldout_skip, cfg)
    heldout = take_prompts(conversations, cfg.num_heldout, heldout_skip, length_of, cfg.max_prompt_tokens)
    check_ranges_apart(train, heldout, cfg)
    for name, split, want in (("train", train, num_train), ("heldout", heldout, cfg.num_heldout)):
        if len(split.conversations) < want:
            print(f"[regen] note: {cfg.prompts} has only {len(split.conversations)} usable {name} prompts (asked {want})", file=sys.stderr)
    return {"train": train, "heldout": heldout}


def reserve_heldout(cfg: RegenConfig, usable: PromptSplit) -> int:
    """How many training prompts are left once the held-out ones are reserved from `usable` (every
    usable prompt from train_skip on, up to both counts); refused when not even one is left."""
    have, want = len(usable.conversations), cfg.num_train + cfg.num_heldout
    if have >= want:
        return cfg.num_train
    long = f" ({len(usable.skipped_long)} more are longer than max_prompt_tokens={cfg.max_prompt_tokens})" if usable.skipped_long else ""
    if cfg.num_train and have <= cfg.num_heldout:
        raise ConfigError(
            f"prompts={cfg.prompts} holds {have} usable prompts from position {cfg.train_skip}{long}: too few for "
            f"num_heldout={cfg.num_heldout} held-out prompts and any training ones; lower num_heldout (regen.num_heldout= "
            f"in the pipeline) below {have}, or bring a larger prompt file")
    left = have - cfg.num_heldout
    print(f"[regen] note: prompts={cfg.prompts} holds {have} usable prompts{long}: the {cfg.num_heldout} held-out "
          f"ones are reserved first and training takes the other {left} (num_train={cfg.num_train} asked)", file=sys.stderr)
    return left


def check_disjoint(train: PromptSplit, heldout_skip: int, cfg: RegenConfig) -> None:
    if cfg.num_heldout and cfg.num_train and train.first_source_position < heldout_skip + cfg.num_heldout and heldout_skip < train.end_source_position:
        raise ConfigError(
            f"the training prompts (positions {train.first_source_position}..{train.end_source_position - 1} of {cfg.prompts}) "
            f"overlap the held-out ones (from heldout_skip={heldout_skip}); lower num_train, or set heldout_skip to "
            f"{train.end_source_position} or more"
        )


def check_ranges_apart(train: PromptSplit, heldout: PromptSplit, cfg: RegenConfig) -> None:
    """The ranges as read: a held-out range that skipped long prompts reaches past heldout_skip + num_heldout."""
    if (train.conversations and heldout.conversations and train.first_source_position < heldout.end_source_position
            and heldout.first_source_position < train.end_source_position):
        raise ConfigError(
            f"the held-out prompts (positions {heldout.first_source_position}..{heldout.end_source_position - 1} of "
            f"{cfg.prompts}, long ones skipped) overlap the training ones ({train.first_source_position}.."
            f"{train.end_source_position - 1}); set train_skip to {heldout.end_source_position} or more, or move "
            "heldout_skip past the training prompts"
        )

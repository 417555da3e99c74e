"""Which prompts regen answers, before any generation: the training and held-out splits of a prompt
set, the held-out ones reserved first where a file is short, refused where the ranges would overlap,
and apart by content too: a held-out prompt asked again among the training ones is passed over, and
ShareGPT's training prompts stay out of its held-out range (blockdraft/data/held_out.py). The
pipeline's preflight plans the same splits (blockdraft/pipeline/prompt_supply.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AbstractSet, Dict, List, Optional

from blockdraft.data.held_out import SHAREGPT_HELD_OUT_START, held_out_hashes
from blockdraft.data.prompt_record import prompt_hash
from blockdraft.errors import ConfigError
from blockdraft.regen.turns import prompt_ids, turn_inputs

if TYPE_CHECKING:
    from blockdraft.regen.config import RegenConfig


@dataclass
class PromptSplit:
    conversations: List[List[dict]]
    first_source_position: int  # 0-based position in the prompt set of the first one taken
    end_source_position: int  # one past the last one read
    skipped_long: List[int] = field(default_factory=list)  # source positions over max_prompt_tokens
    opening_lengths: List[int] = field(default_factory=list)  # templated tokens of each taken conversation's opening
    skipped_repeated: List[int] = field(default_factory=list)  # source positions whose prompt the other split holds


def source_conversations(spec: str, limit: int) -> List[List[dict]]:
    """The set's conversations that open with a user question, in order, at most `limit`."""

    if spec == "tiny_prompts":
        from blockdraft.data.builtin_prompts import tiny_prompts

        return list(tiny_prompts(limit))
    report = None
    if spec == "sharegpt":
        from blockdraft.data.sharegpt import iter_sharegpt_rows

        rows = iter_sharegpt_rows()
    else:
        from blockdraft.data.rows import iter_rows, new_report

        report = new_report(spec)
        rows = iter_rows(spec, report)
    out, unasked = [], 0
    for row in rows:
        if len(out) >= limit:
            break
        if turn_inputs(row.messages, 1):
            out.append(row.messages)
        else:
            unasked += 1
    # A user's own file: what was passed over is said, with the lines and the fix, as training says it.
    if report is not None and report.total_rejected:
        report.rows_kept = report.rows_read - report.total_rejected
        print(f"[regen] rows passed over as unreadable: {report.summary()}", flush=True)
    if report is not None and unasked:
        print(f"[regen] {spec}: {unasked} rows open with no user turn to answer: passed over", flush=True)
    return out


def take_prompts(conversations: List[List[dict]], n: int, skip: int, length_of, max_tokens: int,
                 exclude: AbstractSet[int] = frozenset(), stop: Optional[int] = None, identity=prompt_hash) -> PromptSplit:
    """`n` conversations from position `skip` on (before `stop`) whose opening fits in `max_tokens` and whose
    prompt (`identity`, its hash) is not in `exclude` (prompts another split holds); those passed over are counted."""
    split = PromptSplit([], skip, skip)
    end = len(conversations) if stop is None else min(stop, len(conversations))
    for position in range(skip, end):
        if len(split.conversations) >= n:
            break
        split.end_source_position = position + 1
        if exclude and identity(conversations[position]) in exclude:
            split.skipped_repeated.append(position)
            continue
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
    the rest; a file that cannot hold the held-out prompts and one training prompt is refused. No
    held-out prompt shares its text with a training one, and ShareGPT's training prompts stay out of its
    held-out range (blockdraft/data/held_out.py) unless allow_held_out_training=true."""

    lengths: Dict[int, int] = {}  # by id(): the reservation and the split read the same conversations
    identities: Dict[int, int] = {}

    def length_of(conversation):
        if id(conversation) not in lengths:
            lengths[id(conversation)] = len(prompt_ids(tokenizer, turn_inputs(conversation, 1)[0], cfg.chat_template_kwargs))
        return lengths[id(conversation)]

    def identity_of(conversation):
        if id(conversation) not in identities:
            identities[id(conversation)] = prompt_hash(conversation)
        return identities[id(conversation)]

    heldout_skip = cfg.heldout_skip
    guarded = cfg.prompts == "sharegpt" and not cfg.allow_held_out_training
    if cfg.prompts == "sharegpt":
        # Every usable prompt (11,157, read in about a second): the held-out range is at the end.
        conversations = source_conversations(cfg.prompts, sys.maxsize)
        heldout_skip = SHAREGPT_HELD_OUT_START if heldout_skip is None else heldout_skip
    else:
        # Generous: enough rows for the skipped-long prompts of both splits.
        budget = 2 * (cfg.num_train + cfg.num_heldout) + cfg.train_skip + (heldout_skip or 0) + 64
        conversations = source_conversations(cfg.prompts, budget)
    if guarded:
        check_train_skip_outside_held_out(cfg)
    held_out = held_out_hashes(conversations) if guarded else frozenset()
    stop = SHAREGPT_HELD_OUT_START if guarded else None
    num_train = cfg.num_train
    if heldout_skip is None:
        num_train = reserve_heldout(cfg, take_prompts(conversations, cfg.num_train + cfg.num_heldout, cfg.train_skip,
                                                      length_of, cfg.max_prompt_tokens))
    train = take_prompts(conversations, num_train, cfg.train_skip, length_of, cfg.max_prompt_tokens, held_out, stop, identity_of)
    if heldout_skip is None:
        heldout_skip = train.end_source_position
    check_disjoint(train, heldout_skip, cfg)
    trained = {identity_of(c) for c in train.conversations}
    heldout = take_prompts(conversations, cfg.num_heldout, heldout_skip, length_of, cfg.max_prompt_tokens, trained,
                           identity=identity_of)
    check_ranges_apart(train, heldout, cfg)
    if guarded and len(train.conversations) < num_train:
        note_held_out_stop(cfg, train, num_train)
    for name, split, want in (("train", train, num_train), ("heldout", heldout, cfg.num_heldout)):
        if len(split.conversations) < want and not (guarded and name == "train"):
            print(f"[regen] note: {cfg.prompts} has only {len(split.conversations)} usable {name} prompts (asked {want})", file=sys.stderr)
    return {"train": train, "heldout": heldout}


def check_train_skip_outside_held_out(cfg: RegenConfig) -> None:
    if cfg.train_skip >= SHAREGPT_HELD_OUT_START:
        raise ConfigError(
            f"train_skip={cfg.train_skip} starts the training prompts inside ShareGPT's held-out range (positions "
            f"{SHAREGPT_HELD_OUT_START} on, which the serve check and the eval read); set train_skip below "
            f"{SHAREGPT_HELD_OUT_START}, or allow_held_out_training=true to train there anyway")


def note_held_out_stop(cfg: RegenConfig, train: PromptSplit, asked: int) -> None:
    """ShareGPT's held-out range ended the training prompts before `asked` were taken: said, not refused,
    as for a prompt file that runs out."""
    print(f"[regen] note: training takes {len(train.conversations)} ShareGPT prompts (num_train={asked} asked): they "
          f"stop where ShareGPT's held-out range starts (position {SHAREGPT_HELD_OUT_START}, which the serve check and "
          f"the eval read), after {len(train.skipped_long)} longer than max_prompt_tokens={cfg.max_prompt_tokens} and "
          f"{len(train.skipped_repeated)} asked again in the held-out range were passed over. For more, bring your own "
          "rows (prompts=<rows>), or train into the held-out range with allow_held_out_training=true (the serve "
          "check and the eval then refuse this draft's ShareGPT prompts unless allow_training_prompts=true)",
          file=sys.stderr)


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

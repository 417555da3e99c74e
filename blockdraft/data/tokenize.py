"""One conversation -> token ids and a loss mask that is on for assistant tokens only.

The loss mask marks the tokens the drafter learns to write: assistant replies and the
marker that ends them, as the chat template renders them. Where the template wraps
replies in `{% generation %}`, its own mask is used; otherwise the replies are located
in the rendered text (see `_assistant_char_spans`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from jinja2 import TemplateError

from blockdraft.data.rows import Reason
from blockdraft.errors import DataError

GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")


@dataclass(frozen=True)
class TokenizedRow:
    """A conversation's ids and mask; `loss_mask[t]` is on when token t is assistant-written."""

    input_ids: list[int]
    loss_mask: list[bool]
    truncated: bool = False


@dataclass(frozen=True)
class RowRejected:
    """A conversation that yields no training signal, and why."""

    reason: Reason
    detail: str


def chat_template_of(tokenizer: Any) -> str:
    """The tokenizer's chat template, or an error saying how to give it one."""
    template: Optional[Union[str, Mapping[str, str]]] = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("default")
    if not template:
        raise DataError(
            f"tokenizer {type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '?')}) has no chat "
            "template, so assistant turns cannot be found; load the target's own tokenizer (one with "
            "a chat template), or set tokenizer.chat_template to the template serving uses"
        )
    return template


def has_generation_mask(tokenizer: Any) -> bool:
    """Whether the template marks replies with `{% generation %}` (so it can mask them itself)."""
    return bool(GENERATION_TAG.search(chat_template_of(tokenizer)))


def tokenize_row(
    messages: list[dict[str, str]],
    tokenizer: Any,
    seq_length: int,
    overlong: str = "truncate",
    chat_template_kwargs: Optional[Mapping[str, Any]] = None,
) -> Union[TokenizedRow, RowRejected]:
    """Ids and assistant-only loss mask of one conversation, cut to `seq_length`.

    A conversation over `seq_length` keeps its head (`overlong="truncate"`) or is
    rejected (`overlong="drop"`); one with no assistant token left is rejected.
    """
    kwargs = dict(chat_template_kwargs or {})
    try:
        if has_generation_mask(tokenizer):
            ids, mask = _tokenize_with_generation_mask(messages, tokenizer, kwargs)
        else:
            ids, mask = _tokenize_by_located_replies(messages, tokenizer, kwargs)
    except TemplateError as e:
        return RowRejected(Reason.TEMPLATE_ERROR, f"the chat template failed: {e}")
    except _NotLocated as e:
        return RowRejected(Reason.ASSISTANT_NOT_LOCATED, str(e))
    if not any(mask):
        return RowRejected(Reason.NO_ASSISTANT_TOKENS, "no assistant turn with tokens to supervise")
    if len(ids) <= seq_length:
        return TokenizedRow(ids, mask)
    if overlong == "drop":
        return RowRejected(Reason.OVERLONG_DROPPED, f"{len(ids)} tokens > data.seq_length={seq_length}")
    ids, mask = ids[:seq_length], mask[:seq_length]
    if not any(mask):
        return RowRejected(
            Reason.NO_ASSISTANT_AFTER_TRUNCATION,
            f"the first assistant token comes after data.seq_length={seq_length}",
        )
    return TokenizedRow(ids, mask, truncated=True)


def _tokenize_with_generation_mask(
    messages: list[dict[str, str]], tokenizer: Any, kwargs: dict[str, Any]
) -> tuple[list[int], list[bool]]:
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kwargs
    )
    return list(encoded["input_ids"]), [bool(m) for m in encoded["assistant_masks"]]


class _NotLocated(Exception):
    """An assistant reply could not be found in the rendered conversation."""


def _tokenize_by_located_replies(
    messages: list[dict[str, str]], tokenizer: Any, kwargs: dict[str, Any]
) -> tuple[list[int], list[bool]]:
    """Mask from assistant replies found in the rendered text, for templates without a mask."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer and its chat template has no "
            "{% generation %} markers, so assistant tokens cannot be found; load it with use_fast=True"
        )
    full = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    spans = _assistant_char_spans(messages, tokenizer, full, kwargs)
    mask = [any(s < b and e > a for a, b in spans) for s, e in offsets]
    # The marker right after a reply (<|im_end|>, <|eot_id|>, </s>) is written by the model too.
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    ends = {b for _, b in spans}
    for t, (s, e) in enumerate(offsets):
        if s in ends and e > s and ids[t] in special:
            mask[t] = True
    return ids, mask


def _assistant_char_spans(
    messages: list[dict[str, str]], tokenizer: Any, full: str, kwargs: dict[str, Any]
) -> list[tuple[int, int]]:
    """Character spans of the assistant replies within the rendered conversation `full`.

    A reply starts where the rendered conversation leaves the generation prompt of the
    turns before it: the assistant header belongs to the prompt, while text the template
    adds after the header (an empty think block, say) is part of what the model writes
    only if serving's generation prompt lacks it. A reply ends where its content ends.
    Empty replies cannot be located this way and add nothing.
    """
    spans, floor = [], 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not message["content"].strip():
            continue
        prompt_end = _prompt_end(messages[:i], tokenizer, full, kwargs)
        search_from = max(floor, prompt_end)
        if prompt_end < 0:  # no generation prompt ends before the reply, so its header is unknown
            search_from = max(search_from, _content_floor(messages, i, tokenizer, full, kwargs))
        content_start, content_end = _locate(full, message["content"], search_from, i + 1)
        # A prompt that diverges before the previous reply ended says nothing about this one.
        start = prompt_end if prompt_end >= floor else content_start
        spans.append((start, content_end))
        floor = content_end
    return spans


def _prompt_end(before: list[dict[str, str]], tokenizer: Any, full: str, kwargs: dict[str, Any]) -> int:
    """How far `full` agrees with the generation prompt of the turns `before` a reply (-1: none)."""
    if not before:
        return -1
    try:
        prompt = tokenizer.apply_chat_template(before, tokenize=False, add_generation_prompt=True, **kwargs)
    except TemplateError:
        return -1  # some templates refuse a prefix (no user turn yet) that the whole row satisfies
    return _common_prefix_length(prompt, full)


# Private-use characters: no template writes them and replies all but never hold them.
_MARKER = "\ue000\ue001\ue002"


def _content_floor(messages: list[dict[str, str]], i: int, tokenizer: Any, full: str, kwargs: dict[str, Any]) -> int:
    """How far into `full` reply i's content cannot start, from rendering a marker in its place.

    Without it, a reply that opens the conversation is searched for from the start of the
    text, and one the template's own header holds (`a` in `assistant`) is found there.
    """
    probe = [*messages[:i], {**messages[i], "content": _MARKER}]
    try:
        rendered = tokenizer.apply_chat_template(probe, tokenize=False, **kwargs)
    except TemplateError:
        return 0
    at = rendered.find(_MARKER)
    return min(at, _common_prefix_length(rendered, full)) if at >= 0 else 0


def _locate(text: str, content: str, start: int, number: int) -> tuple[int, int]:
    """Where `content` (as is, or trimmed, as many templates do) appears in `text` after `start`."""
    for candidate in (content, content.strip()):
        found = text.find(candidate, start)
        if found >= 0:
            return found, found + len(candidate)
    raise _NotLocated(
        f"message {number} (assistant) does not appear verbatim in the rendered chat; "
        "the template rewrites it"
    )


def _common_prefix_length(a: str, b: str) -> int:
    # Bisection over slice comparisons: a character loop is slow on long conversations.
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low

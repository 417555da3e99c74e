"""What the target answers, turn by turn: the turns of a conversation, the rollout that answers them in
order, the row it becomes, and the token ids a turn is sent as. Shared by every backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from blockdraft.data.chat_turns import asks, user_turns


@dataclass
class Reply:
    """One generated assistant turn."""

    text: str
    tokens: int
    finish_reason: str  # "stop" (the target ended its turn) | "length" (cut at max_tokens)


def turn_inputs(messages: Sequence[dict], max_turns: int) -> List[List[dict]]:
    """What the target answers, turn by turn: the non-assistant messages before each original
    assistant turn (the first one with any leading system message), at most `max_turns` of
    them. The original assistant turns are dropped: the target writes its own. A turn with no
    user question (a conversation opening with the assistant, two replies in a row) ends it."""
    answerable = []
    for turn in user_turns(messages):
        if not asks(turn):
            break  # a turn without a question ends the conversation
        answerable.append(turn)
    return answerable[:max_turns]


def rollout(segments: Sequence[List[dict]], reply: Callable[[List[dict]], Optional[Reply]]) -> tuple[List[dict], List[Reply]]:
    """The conversation with every turn answered by `reply`, in order, each answer the context
    of the next. A reply cut at max_tokens, or `None` (the context no longer fits), ends it."""
    conversation: List[dict] = []
    replies: List[Reply] = []
    for segment in segments:
        answer = reply(conversation + list(segment))
        if answer is None:
            break
        conversation += [*segment, {"role": "assistant", "content": answer.text}]
        replies.append(answer)
        if answer.finish_reason == "length":
            break  # the target never ended this turn; a next turn would follow a cut reply
    return conversation, replies


def regen_row(conversation: List[dict], settings: dict, index: int, replies: Sequence[Reply],
              served_by: Optional[dict] = None) -> dict:
    """The JSONL row both backends write: the chat, and how (and which prompt) it was generated; `served_by`:
    the server that answered and the model name it was sent."""
    generation = {**settings, "index": index, "finish_reasons": [r.finish_reason for r in replies]}
    if served_by is not None:
        generation["served_by"] = served_by
    return {"messages": conversation, "generation": generation}


def prompt_ids(tokenizer, messages: List[dict], chat_template_kwargs: Optional[dict] = None) -> List[int]:
    """Token ids of the conversation with the generation prompt, as serving renders it."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {}))
    # The template already holds any BOS; adding special tokens again would double it.
    return list(tokenizer(text, add_special_tokens=False).input_ids)

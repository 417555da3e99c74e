"""The turns of a chat row: what each assistant reply answers. One rule, shared by regen (which turns the
target answers) and the record of training prompts (a prompt's identity is the first turn)."""

from __future__ import annotations

from typing import List, Sequence


def user_turns(messages: Sequence[dict]) -> List[List[dict]]:
    """The non-assistant messages before each assistant reply, and those after the last, as {role, content}:
    one segment per turn, the first with any leading system message; never empty (a row with no message
    is one empty turn)."""
    segments: List[List[dict]] = [[]]
    for message in messages:
        if message["role"] == "assistant":
            segments.append([])
            continue
        segments[-1].append({"role": message["role"], "content": message["content"]})
    return segments


def asks(turn: Sequence[dict]) -> bool:
    """Whether a turn holds a user question: one without (a conversation opening with the assistant, two
    replies in a row) gives a reply nothing to answer."""
    return any(m["role"] == "user" and m["content"].strip() for m in turn)

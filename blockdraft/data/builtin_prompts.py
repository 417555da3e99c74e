"""Built-in prompt sets that need no download."""

from __future__ import annotations

import random
from typing import Iterator, List

_WORDS = (
    "river stone garden light music paper window market winter summer engine forest "
    "letter bridge cloud ocean story number table silver orange doctor planet signal"
).split()
_ASKS = ("Tell me about", "Write a short note on", "Describe", "Explain", "List facts about")


def tiny_prompts(n: int, seed: int = 0) -> Iterator[List[dict]]:
    """Short synthetic user turns, e.g. for a tiny target answering its own training data."""
    rng = random.Random(seed)
    for _ in range(n):
        text = f"{rng.choice(_ASKS)} {rng.choice(_WORDS)} and {rng.choice(_WORDS)}."
        yield [{"role": "user", "content": text}]


def builtin_prompt_set(name: str, n: int, skip: int = 0) -> List[List[dict]]:
    """Prompts (message lists ending with a user turn) of a named set."""
    if name == "tiny_prompts":
        return list(tiny_prompts(n + skip))[skip:]
    if name == "sharegpt":
        from blockdraft.data.sharegpt import sharegpt_prompts

        return [row.messages for row in sharegpt_prompts(n, skip=skip)]
    raise ValueError(f"unknown built-in prompt set {name!r}; use tiny_prompts or sharegpt")

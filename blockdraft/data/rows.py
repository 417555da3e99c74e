"""Chat rows in, normalised `{role, content}` messages out, and an account of every row set aside.

Accepted shapes, one object per JSONL line or per dataset row:
  {"messages": [{"role": "user", "content": "..."}, ...]}          OpenAI style
  {"conversations": [{"from": "human", "value": "..."}, ...]}      ShareGPT style
A row that cannot be read is never dropped silently: it is counted in a `RejectReport`
under its reason with its line (JSONL) or 1-based row index (datasets), or, with `strict`,
stops the run. Where the rows come from is `blockdraft.data.sources`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional

from blockdraft.data.sources import load_rows, parse_source
from blockdraft.errors import ConfigError, DataError


class Reason(str, Enum):
    """Why a row was set aside. The value is the key shown in reports."""

    NOT_UTF8 = "not_utf8"
    BAD_JSON = "bad_json"
    NOT_AN_OBJECT = "not_an_object"
    NO_MESSAGES = "no_messages"
    WRONG_TYPE = "wrong_type"
    MISSING_FIELD = "missing_field"
    UNKNOWN_ROLE = "unknown_role"
    TEMPLATE_ERROR = "template_error"
    ASSISTANT_NOT_LOCATED = "assistant_not_located"
    NO_ASSISTANT_TOKENS = "no_assistant_tokens"
    NO_ASSISTANT_AFTER_TRUNCATION = "no_assistant_after_truncation"
    OVERLONG_DROPPED = "overlong_dropped"


# Reasons that mean the row itself is malformed; `strict` makes these fatal.
UNREADABLE = frozenset(
    {
        Reason.NOT_UTF8,
        Reason.BAD_JSON,
        Reason.NOT_AN_OBJECT,
        Reason.NO_MESSAGES,
        Reason.WRONG_TYPE,
        Reason.MISSING_FIELD,
        Reason.UNKNOWN_ROLE,
    }
)

FIXES = {
    Reason.NOT_UTF8: "re-encode the file as UTF-8, with no lone surrogate escapes (\\ud800-\\udfff)",
    Reason.BAD_JSON: "write one complete JSON object per line",
    Reason.NOT_AN_OBJECT: "write each row as a JSON object with a `messages` list",
    Reason.NO_MESSAGES: "give the row a non-empty `messages` (or ShareGPT `conversations`) list",
    Reason.WRONG_TYPE: "make `messages` a list of objects whose role and content are strings",
    Reason.MISSING_FIELD: "give every message a `role` and a `content` (ShareGPT: `from` and `value`)",
    Reason.UNKNOWN_ROLE: "use roles system, user, assistant (ShareGPT: system, human, gpt)",
    Reason.TEMPLATE_ERROR: "fix the row so the chat template accepts it, or use another template",
    Reason.ASSISTANT_NOT_LOCATED: "use a chat template with {% generation %} markers",
    Reason.NO_ASSISTANT_TOKENS: "add an assistant reply; only assistant tokens are trained on",
    Reason.NO_ASSISTANT_AFTER_TRUNCATION: "raise data.seq_length or shorten the prompt",
    Reason.OVERLONG_DROPPED: "raise data.seq_length, or set data.overlong=truncate",
}

ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
}


@dataclass(frozen=True)
class ChatRow:
    """One conversation and where it came from."""

    line: int  # 1-based line of a JSONL file, or 1-based row of a dataset
    messages: list[dict[str, str]]


class RowProblem(Exception):
    """A row could not be normalised; carries the reason and what exactly was wrong."""

    def __init__(self, reason: Reason, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass
class RejectReport:
    """Rows read, kept, truncated and set aside (with line numbers) for one source."""

    source: str
    unit: str = "line"  # "line" for JSONL files, "row" for datasets
    rows_read: int = 0
    rows_kept: int = 0
    rejected: dict[str, list[int]] = field(default_factory=dict)
    first_detail: dict[str, str] = field(default_factory=dict)
    truncated: list[int] = field(default_factory=list)
    seq_length: Optional[int] = None

    def reject(self, line: int, reason: Reason, detail: str) -> None:
        self.rejected.setdefault(reason.value, []).append(line)
        self.first_detail.setdefault(reason.value, detail)

    def count(self, reason: Reason) -> int:
        return len(self.rejected.get(reason.value, []))

    def lines(self, reason: Reason) -> list[int]:
        return list(self.rejected.get(reason.value, []))

    @property
    def total_rejected(self) -> int:
        return sum(len(lines) for lines in self.rejected.values())

    def error(self, line: int, reason: Reason, detail: str) -> DataError:
        """The error `strict` raises, naming the line, what was wrong and the fix."""
        return DataError(
            f"{self.source} {self.unit} {line}: {reason.value}: {detail}. "
            f"Fix: {FIXES[reason]}, or set data.strict=false to count and skip such {self.unit}s."
        )

    def summary(self, max_lines: int = 5) -> str:
        """Counts per reason with the first few line numbers, one reason per line."""
        head = (
            f"{self.source}: {self.rows_read} {self.unit}s read, {self.rows_kept} kept, "
            f"{self.total_rejected} rejected"
        )
        if self.truncated:
            shown = _first(self.truncated, max_lines)
            head += f", {len(self.truncated)} truncated to {self.seq_length} tokens ({self.unit}s {shown})"
        parts = [head]
        for reason, lines in sorted(self.rejected.items()):
            parts.append(
                f"  {reason}: {len(lines)} ({self.unit}s {_first(lines, max_lines)}); "
                f"first: {self.first_detail[reason]}; fix: {FIXES[Reason(reason)]}"
            )
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> "RejectReport":
        return cls(**saved)


def _first(lines: list[int], limit: int) -> str:
    shown = ", ".join(str(n) for n in lines[:limit])
    return shown + (", ..." if len(lines) > limit else "")


def normalize_row(row: Any) -> list[dict[str, str]]:
    """The row's messages as `{role, content}` dicts, or `RowProblem` saying what is wrong."""
    if not isinstance(row, Mapping):
        raise RowProblem(Reason.NOT_AN_OBJECT, f"row is a JSON {type(row).__name__}, not an object")
    if row.get("messages") is not None:
        raw, role_key, content_key, column = row["messages"], "role", "content", "messages"
    elif row.get("conversations") is not None:
        raw, role_key, content_key, column = row["conversations"], "from", "value", "conversations"
    else:
        raise RowProblem(Reason.NO_MESSAGES, "row has neither `messages` nor `conversations`")
    if not isinstance(raw, list):
        raise RowProblem(Reason.WRONG_TYPE, f"`{column}` is a {type(raw).__name__}, not a list")
    if not raw:
        raise RowProblem(Reason.NO_MESSAGES, f"`{column}` is empty")
    return [_normalize_message(m, i, role_key, content_key) for i, m in enumerate(raw, start=1)]


def _normalize_message(message: Any, index: int, role_key: str, content_key: str) -> dict[str, str]:
    where = f"message {index}"
    if not isinstance(message, Mapping):
        raise RowProblem(Reason.WRONG_TYPE, f"{where} is a {type(message).__name__}, not an object")
    for key in (role_key, content_key):
        if message.get(key) is None:
            raise RowProblem(Reason.MISSING_FIELD, f"{where} has no `{key}`")
    role = message[role_key]
    if not isinstance(role, str):
        raise RowProblem(Reason.WRONG_TYPE, f"{where} `{role_key}` is a {type(role).__name__}, not a string")
    if role not in ROLE_ALIASES:
        raise RowProblem(Reason.UNKNOWN_ROLE, f"{where} has {role_key} {role!r}")
    normalized = {"role": ROLE_ALIASES[role], "content": _text_of(message[content_key], where, content_key)}
    # Thinking models keep their reasoning apart; the chat template decides how to render it.
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        normalized["reasoning_content"] = _encodable(reasoning, where, "reasoning_content")
    return normalized


def _text_of(content: Any, where: str, key: str) -> str:
    """Content as one string; OpenAI's list of `{type: text, text}` parts is joined."""
    if isinstance(content, str):
        return _encodable(content, where, key)
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return _encodable("".join(p["text"] for p in content), where, key)
    raise RowProblem(Reason.WRONG_TYPE, f"{where} `{key}` is a {type(content).__name__}, not a string")


def _encodable(text: str, where: str, key: str) -> str:
    # JSON may escape a lone surrogate (`\ud800`), which Python decodes into a str the
    # tokenizer cannot encode: it would raise mid-tokenisation instead of counting the row.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        detail = f"{where} `{key}` holds a lone surrogate U+{ord(text[e.start]):04X} at character {e.start + 1}"
        raise RowProblem(Reason.NOT_UTF8, detail) from None
    return text


def _keep_or_reject(
    number: int, parse: Any, report: RejectReport, strict: bool
) -> Optional[ChatRow]:
    """Normalise one row; count it as rejected (or raise, when strict) if it cannot be read."""
    report.rows_read += 1
    try:
        return ChatRow(line=number, messages=normalize_row(parse()))
    except RowProblem as problem:
        if strict:
            raise report.error(number, problem.reason, problem.detail) from None
        report.reject(number, problem.reason, problem.detail)
        return None


def _parse_jsonl_line(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        detail = f"byte 0x{raw[e.start]:02x} at column {e.start + 1} is not UTF-8"
        raise RowProblem(Reason.NOT_UTF8, detail) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RowProblem(Reason.BAD_JSON, f"{e.msg} at column {e.colno}") from None
    except RecursionError:
        raise RowProblem(Reason.BAD_JSON, "arrays or objects nested too deeply to read") from None
    except ValueError as e:  # an integer literal past Python's digit limit
        raise RowProblem(Reason.BAD_JSON, str(e)) from None


def iter_jsonl_rows(
    path: str | Path, report: RejectReport, strict: bool = False, max_rows: Optional[int] = None
) -> Iterator[ChatRow]:
    """Normalised rows of a JSONL file, numbered by line; blank lines are not rows."""
    kept = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark is not content
            if not raw.strip():
                continue
            row = _keep_or_reject(number, lambda: _parse_jsonl_line(raw), report, strict)
            if row is not None:
                yield row
                kept += 1
                if max_rows is not None and kept >= max_rows:
                    return


def iter_records(
    records: Iterable[Any], report: RejectReport, strict: bool = False, max_rows: Optional[int] = None
) -> Iterator[ChatRow]:
    """Normalised rows of in-memory records (dicts, or a `datasets.Dataset`), numbered from 1."""
    kept = 0
    for number, record in enumerate(records, start=1):
        row = _keep_or_reject(number, lambda: record, report, strict)
        if row is not None:
            yield row
            kept += 1
            if max_rows is not None and kept >= max_rows:
                return


def new_report(source: Any) -> RejectReport:
    """An empty report named after the source: its spec (path or dataset id), or the kind of object given."""
    if isinstance(source, (str, Path)):
        return RejectReport(source=str(source), unit=parsed_source(source).unit)
    return RejectReport(source=f"<{type(source).__name__}>", unit="row")


def parsed_source(source: str | Path) -> Any:
    """The parsed source; one gone since the config was checked is a data error."""
    try:
        return parse_source(str(source), key="data file")
    except ConfigError as err:
        raise DataError(str(err)) from None


def iter_rows(
    source: Any, report: RejectReport, strict: bool = False, max_rows: Optional[int] = None
) -> Iterator[ChatRow]:
    """Rows of a source string (`blockdraft.data.sources`), a `datasets.Dataset` or a list of dicts."""
    if isinstance(source, (str, Path)):
        parsed = parsed_source(source)
        if parsed.kind == "jsonl":
            return iter_jsonl_rows(Path(parsed.spec).expanduser(), report, strict, max_rows)
        return iter_records(load_rows(parsed), report, strict, max_rows)
    return iter_records(source, report, strict, max_rows)

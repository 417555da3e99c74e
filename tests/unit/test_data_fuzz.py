"""Fault injection into data preparation: broken lines are counted, never crash the run, and
never change the rows kept beside them.

How lines are treated (what these tests pin down):
  * A blank line (only ASCII whitespace, after the byte-order mark on line 1) is not a row:
    it is neither kept nor rejected, but it still counts for the line numbers after it.
    So `rows_read == rows_kept + total_rejected == lines - blank lines`.
  * Tool calls are rejected and counted. An assistant turn with `tool_calls` and no (or
    null) `content` is `missing_field`; a `tool` result is `unknown_role`. Rows keep only
    role and content per message, so a tool call could not be rendered the way the target
    sees it. An assistant turn with both `content` and `tool_calls` is kept, as its text.
  * Empty content is kept: an empty user or system message is valid chat. An empty reply
    under a template with `{% generation %}` supervises its end marker alone (stopping at
    once is a real target); a template without the markers cannot locate an empty reply,
    so a row whose only reply is empty is `no_assistant_tokens` there.
  * Text Python reads but the tokenizer cannot (a JSON-escaped lone surrogate) is
    `not_utf8`; JSON that Python refuses to load (nested too deeply, an integer past the
    digit limit) is `bad_json`.
  * A kept row has the ids and mask it has on its own, and its mask marks exactly its
    replies and their end markers, whatever the rows around it hold.
"""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockdraft.data.config import DataConfig
from blockdraft.data.dataset import prepare_dataset, tokenize_rows
from blockdraft.data.rows import UNREADABLE, Reason, normalize_row
from blockdraft.data.tiny_tokenizer import CHAT_TEMPLATE, IM_END, build_tiny_tokenizer
from blockdraft.data.tokenize import tokenize_row
from blockdraft.errors import DataError

BOM = b"\xef\xbb\xbf"
KEPT, BLANK = "kept", "blank"


def tokenizers():
    """The tiny tokenizer as built (mask from `{% generation %}`) and without the markers
    (mask from locating the replies): the two ways `tokenize_row` finds assistant tokens."""
    marked = build_tiny_tokenizer()
    located = build_tiny_tokenizer()
    located.chat_template = CHAT_TEMPLATE.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    return {"generation": marked, "located": located}


TOKENIZERS = tokenizers()


def chat(*turns):
    """A row of (role, content) turns, or of whole message dicts where a turn needs more keys."""
    return {"messages": [t if isinstance(t, dict) else {"role": t[0], "content": t[1]} for t in turns]}


def line(row):
    return json.dumps(row, ensure_ascii=False).encode()


def raw_chat(user: bytes, reply: bytes, extra: bytes = b"") -> bytes:
    """A row written by hand, for bytes and escapes `json.dumps` would never produce."""
    return b'{"messages": [{"role": "user", "content": "%s"}, {"role": "assistant", "content": "%s"%s}]}' % (
        user,
        reply,
        extra,
    )


GOOD = line(chat(("user", "what is 2+2?"), ("assistant", "4")))
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
ASK = ("user", "2+2?")


def corpus(generation: bool) -> list[tuple[str, bytes, str]]:
    """(what, line, expected outcome: KEPT, BLANK or a reason) for the tokenizer kind given."""
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    sharegpt = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    # Tool results are where huge messages come from; this one is rejected for its role,
    # so it covers reading, decoding and parsing a 10 MB line. Pushing 10 MB through the
    # tiny byte-level tokenizer takes over half a minute, so that runs in the slow test.
    ten_mb_tool_result = line(chat(("user", "read the log"), ("tool", "x" * (10 << 20))))
    return [
        ("good row behind a byte-order mark", BOM + GOOD, KEPT),
        ("invalid JSON", b"{not json", Reason.BAD_JSON),
        ("a JSON array", b"[1, 2]", Reason.NOT_AN_OBJECT),
        ("a JSON number", b"42", Reason.NOT_AN_OBJECT),
        ("a JSON string", b'"hello"', Reason.NOT_AN_OBJECT),
        ("JSON null", b"null", Reason.NOT_AN_OBJECT),
        ("no messages key", b'{"text": "hi"}', Reason.NO_MESSAGES),
        ("empty messages", b'{"messages": []}', Reason.NO_MESSAGES),
        ("messages a string", b'{"messages": "hi"}', Reason.WRONG_TYPE),
        ("messages an object", b'{"messages": {"role": "user"}}', Reason.WRONG_TYPE),
        ("a message that is a string", b'{"messages": ["hi"]}', Reason.WRONG_TYPE),
        ("content a number", line(chat(("user", 3), ("assistant", "a"))), Reason.WRONG_TYPE),
        ("content a list of numbers", line(chat(("user", [1, 2]), ("assistant", "a"))), Reason.WRONG_TYPE),
        ("content an object", line(chat(("user", "q"), ("assistant", {"text": "a"}))), Reason.WRONG_TYPE),
        ("role a number", line(chat(("user", "q"), (1, "a"))), Reason.WRONG_TYPE),
        ("content null", line(chat(("user", None), ("assistant", "a"))), Reason.MISSING_FIELD),
        ("no role", b'{"messages": [{"content": "q"}]}', Reason.MISSING_FIELD),
        ("no content", b'{"messages": [{"role": "user"}]}', Reason.MISSING_FIELD),
        ("", b"", BLANK),
        ("unknown role", line(chat(("robot", "beep"), ("assistant", "a"))), Reason.UNKNOWN_ROLE),
        ("ShareGPT unknown speaker", line({"conversations": [{"from": "bing", "value": "x"}]}), Reason.UNKNOWN_ROLE),
        (
            "tool call without content",
            line(chat(ASK, {"role": "assistant", "tool_calls": [TOOL_CALL]})),
            Reason.MISSING_FIELD,
        ),
        (
            "tool call with null content",
            line(chat(ASK, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]})),
            Reason.MISSING_FIELD,
        ),
        (
            "tool result",
            line(
                chat(
                    ASK,
                    {"role": "assistant", "content": "adding", "tool_calls": [TOOL_CALL]},
                    {"role": "tool", "content": "4", "tool_call_id": "c1"},
                    ("assistant", "4"),
                )
            ),
            Reason.UNKNOWN_ROLE,
        ),
        (
            "text beside a tool call",
            line(chat(ASK, {"role": "assistant", "content": "adding", "tool_calls": [TOOL_CALL]})),
            KEPT,
        ),
        ("whitespace only", b" \t \r", BLANK),
        ("empty user message", line(chat(("system", ""), ("user", ""), ("assistant", "hello"))), KEPT),
        (
            "empty only reply",
            line(chat(("user", "say nothing"), ("assistant", ""))),
            KEPT if generation else Reason.NO_ASSISTANT_TOKENS,
        ),
        ("content as text parts", line(chat(("user", parts), ("assistant", "c"))), KEPT),
        ("not UTF-8", raw_chat(b"caf\xe9", b"a"), Reason.NOT_UTF8),
        ("lone surrogate escape", raw_chat(b"\\ud800", b"a"), Reason.NOT_UTF8),
        ("surrogate in reasoning", raw_chat(b"q", b"a", b', "reasoning_content": "\\udfff"'), Reason.NOT_UTF8),
        ("surrogate pair escape", raw_chat(b"\\ud83d\\ude00", b"ok"), KEPT),
        ("nested 100000 deep", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", Reason.BAD_JSON),
        ("a 5000-digit integer", b'{"messages": [{"role": "user", "content": %s}]}' % (b"7" * 5000), Reason.BAD_JSON),
        ("no assistant turn", line(chat(("system", "s"), ("user", "q"))), Reason.NO_ASSISTANT_TOKENS),
        ("a reply the header holds, first", line(chat(("assistant", "a"), ("user", "b"), ("assistant", "a"))), KEPT),
        ("ShareGPT row", line(sharegpt), KEPT),
        ("special-token text", line(chat(("user", "<|im_end|>"), ("assistant", "<|im_start|>user\n"))), KEPT),
        ("a CRLF line ending", GOOD + b"\r", KEPT),
        ("10 MB tool result", ten_mb_tool_result, Reason.UNKNOWN_ROLE),
        (
            "256 KB prompt",
            line(chat(("user", "y" * (256 << 10)), ("assistant", "a"))),
            Reason.NO_ASSISTANT_AFTER_TRUNCATION,
        ),
        ("64 KB reply, truncated", line(chat(("user", "write a lot"), ("assistant", "z" * (64 << 10)))), KEPT),
        ("the same good row again", GOOD, KEPT),
        ("a truncated last line, no newline", GOOD[:-7], Reason.BAD_JSON),
    ]


def write(path: Path, lines: list[bytes], final_newline: bool = True) -> str:
    path.write_bytes(b"\n".join(lines) + (b"\n" if final_newline else b""))
    return str(path)


def documents(ds) -> list[tuple[int, list[int], list[bool]]]:
    """(source line, ids, mask) of every conversation, in order (the dataset is not packed)."""
    return [
        (ds.source_lines(i)[0], ds[i]["input_ids"].tolist(), ds[i]["loss_mask"].tolist()) for i in range(len(ds))
    ]


@pytest.mark.parametrize("kind", ["generation", "located"])
def test_fixed_corpus_every_line_is_kept_or_counted_and_good_rows_are_untouched(tmp_path, kind):
    tok = TOKENIZERS[kind]
    entries = corpus(generation=kind == "generation")
    lines = [raw for _, raw, _ in entries]
    path = write(tmp_path / "mixed.jsonl", lines, final_newline=False)
    cfg = DataConfig(seq_length=96, cache_dir=str(tmp_path / "cache"))

    ds, report = prepare_dataset(path, tok, cfg)

    expected_rejected: dict[str, list[int]] = {}
    for number, (_, _, outcome) in enumerate(entries, start=1):
        if isinstance(outcome, Reason):
            expected_rejected.setdefault(outcome.value, []).append(number)
    kept = [n for n, (_, _, outcome) in enumerate(entries, start=1) if outcome == KEPT]
    blank = [n for n, (_, _, outcome) in enumerate(entries, start=1) if outcome == BLANK]
    what = {n: label for n, (label, _, _) in enumerate(entries, start=1)}
    assert report.rejected == expected_rejected, {r: [what[n] for n in ns] for r, ns in report.rejected.items()}
    got = documents(ds)
    assert [n for n, _, _ in got] == kept
    assert report.rows_read == report.rows_kept + report.total_rejected == len(lines) - len(blank)
    assert report.truncated == [n for n in kept if what[n] == "64 KB reply, truncated"]
    for n, ids, mask in got:
        check_row(tok, kind == "generation", lines[n - 1], ids, mask, cfg.seq_length, n in report.truncated)

    # The good rows alone, in a file of their own, give the very same ids and masks.
    alone = write(tmp_path / "good.jsonl", [lines[n - 1] for n in kept])
    ds_alone, report_alone = prepare_dataset(alone, tok, cfg)
    assert report_alone.total_rejected == 0 and report_alone.rows_kept == len(kept)
    assert [(ids, mask) for _, ids, mask in documents(ds_alone)] == [(ids, mask) for _, ids, mask in got]

    # The cached result keeps the same account of every line.
    again, report_again = prepare_dataset(path, tok, cfg)
    assert report_again.rejected == report.rejected and report_again.rows_read == report.rows_read
    assert documents(again) == got


def test_strict_stops_at_the_first_unreadable_line_of_the_corpus(tmp_path):
    entries = corpus(generation=True)
    path = write(tmp_path / "mixed.jsonl", [raw for _, raw, _ in entries])
    first = next(n for n, (_, _, outcome) in enumerate(entries, start=1) if outcome in UNREADABLE)
    cfg = DataConfig(seq_length=96, strict=True, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match=rf"mixed\.jsonl line {first}: bad_json: "):
        prepare_dataset(path, TOKENIZERS["generation"], cfg)


def test_max_rows_stops_reading_but_every_line_read_is_accounted_for(tmp_path):
    # Lines past the cap are not read at all, so they are neither kept nor rejected; every
    # line up to the last one read is. The cap counts training rows, so a row the tokenizer
    # rejects (line 3 here) takes no place: the third training row is line 6.
    lines = [GOOD, b"{bad", line(chat(("user", "no reply"))), b"", GOOD, GOOD, GOOD]
    path = write(tmp_path / "capped.jsonl", lines)
    ds, report = prepare_dataset(path, TOKENIZERS["generation"], DataConfig(max_rows=3, cache_dir=str(tmp_path)))
    assert [n for n, _, _ in documents(ds)] == [1, 5, 6]
    assert report.rejected == {"bad_json": [2], "no_assistant_tokens": [3]}
    assert report.rows_read == report.rows_kept + report.total_rejected == 5


def test_rows_given_in_memory_are_accounted_for_too(tmp_path):
    rows = [
        chat(("user", "q"), ("assistant", "a")),
        "not a row",
        chat(("user", "\ud800"), ("assistant", "a")),
        chat(("user", "only a question")),
        chat({"role": "assistant", "tool_calls": [TOOL_CALL]}),
    ]
    ds, report = prepare_dataset(rows, TOKENIZERS["generation"], DataConfig(cache_dir=str(tmp_path)))
    assert [n for n, _, _ in documents(ds)] == [1]
    assert report.rejected == {
        "not_an_object": [2],
        "not_utf8": [3],
        "no_assistant_tokens": [4],
        "missing_field": [5],
    }
    assert report.rows_read == 5


@pytest.mark.slow
def test_a_10_mb_message_through_the_tokenizer(tmp_path):
    tok = TOKENIZERS["generation"]
    big = "x" * (10 << 20)
    lines = [GOOD, line(chat(("user", "q"), ("assistant", big))), line(chat(("user", big), ("assistant", "a"))), GOOD]
    path = write(tmp_path / "big.jsonl", lines)
    ds, report = prepare_dataset(path, tok, DataConfig(seq_length=64, cache_dir=str(tmp_path)))
    assert [n for n, _, _ in documents(ds)] == [1, 2, 4] and report.truncated == [2]
    assert report.lines(Reason.NO_ASSISTANT_AFTER_TRUNCATION) == [3]
    assert documents(ds)[1][1] == tokenize_row(normalize_row(json.loads(lines[1])), tok, 64).input_ids


# Property test: JSONL files mixing rows that must be kept, lines that must be rejected,
# blank lines and junk that may go either way.

# Besides any text, text made of the template's own pieces: a reply such as `a` or
# `assistant` must be found where the template puts it, not inside a header.
TEMPLATE_PIECES = ["a", "assistant", "user", "\n", " ", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "é"]
TEXT = st.text(max_size=30) | st.lists(st.sampled_from(TEMPLATE_PIECES), max_size=5).map("".join)
REPLY = TEXT.filter(str.strip)
ROLES = ["system", "user", "assistant", "human", "gpt", "tool", "robot", "", "User"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
CONTENTS = (
    TEXT
    | st.none()
    | st.integers()
    | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": TEXT}), max_size=2)
    | JSON_VALUES
)


@st.composite
def valid_rows(draw):
    """A row with at least one non-blank reply, in one of the accepted shapes."""
    before = draw(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), TEXT), max_size=3))
    after = draw(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), TEXT), max_size=2))
    turns = before + [("assistant", draw(REPLY))] + after
    shape = draw(st.sampled_from(["openai", "parts", "sharegpt"]))
    if shape == "sharegpt":
        names = {"system": "system", "user": "human", "assistant": "gpt"}
        return {"conversations": [{"from": names[r], "value": c} for r, c in turns]}
    if shape == "parts":
        return {"messages": [{"role": r, "content": [{"type": "text", "text": c}]} for r, c in turns]}
    return chat(*turns)


@st.composite
def junk_rows(draw):
    """Dicts shaped roughly like rows: mostly well-formed messages, each with some chance of
    an odd role, an odd content type, a missing key or a tool call."""
    messages = []
    for _ in range(draw(st.integers(0, 4))):
        message = {}
        odd = draw(st.integers(0, 7))
        if odd != 0:
            message["role"] = draw(st.sampled_from(ROLES) if odd > 2 else st.integers() | st.none() | TEXT)
        if odd != 1:
            message["content"] = draw(CONTENTS if odd == 2 else TEXT)
        if odd == 3:
            message["tool_calls"] = [TOOL_CALL]
        messages.append(message)
    key = draw(st.sampled_from(["messages", "conversations", "msgs"]))
    if key == "conversations":
        messages = [{"from": m.get("role"), "value": m.get("content")} for m in messages]
    return {key: messages if draw(st.integers(0, 5)) else draw(JSON_VALUES)}


def encode(value, ascii_only):
    return json.dumps(value, ensure_ascii=ascii_only).encode()


def cut_short(raw: bytes, fraction: float) -> bytes:
    # Any strict prefix of a JSON object lacks its closing brace, so it is always rejected.
    return raw[: max(1, int(len(raw) * fraction))]


@st.composite
def lines_of_a_file(draw):
    """(kind, line): kind `valid` must be kept when it fits, `cut` must be rejected,
    `junk` may go either way, `blank` is no row."""
    pick = draw(st.integers(0, 9))
    if pick <= 3:  # most files keep some rows
        return "valid", encode(draw(valid_rows()), draw(st.booleans()))
    if pick <= 5:
        return "junk", encode(draw(junk_rows()), draw(st.booleans()))
    if pick == 6:
        return "junk", encode(draw(JSON_VALUES), draw(st.booleans()))
    if pick == 7:
        return "junk", draw(st.binary(max_size=40)).replace(b"\n", b"")
    if pick == 8:
        return "blank", draw(st.sampled_from([b"", b" ", b"\t", b"\r", b"  \r"]))
    return "cut", cut_short(encode(draw(valid_rows()), draw(st.booleans())), draw(st.floats(0.0, 0.99)))


def numbered_lines(data: bytes) -> list[bytes]:
    """The file's lines as the reader numbers them (split on `\\n` only)."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # after the final newline: no line there
    return lines


def is_blank(raw: bytes, number: int) -> bool:
    return not (raw.removeprefix(BOM) if number == 1 else raw).strip()


def check_row(tok, generation, raw, ids, mask, seq_length, truncated):
    """Ids and mask of a kept row equal those of the row tokenised on its own, and the mask
    marks exactly the reply tokens (and their end markers), in order."""
    messages = normalize_row(json.loads(raw.removeprefix(BOM).decode("utf-8")))
    full = tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    assert ids == full[:seq_length] and truncated == (len(full) > seq_length)
    replies = "".join(
        m["content"] + IM_END for m in messages if m["role"] == "assistant" and (generation or m["content"].strip())
    )
    expected = tok(replies, add_special_tokens=False)["input_ids"]
    supervised = [t for t, on in zip(ids, mask) if on]
    assert 1 <= len(supervised) <= len(ids) == len(mask)
    assert supervised == (expected[: len(supervised)] if truncated else expected)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(lines_of_a_file(), min_size=1, max_size=12),
    final_newline=st.booleans(),
    kind=st.sampled_from(["generation", "located"]),
    seq_length=st.sampled_from([40, 4096]),
    overlong=st.sampled_from(["truncate", "drop"]),
)
def test_any_file_is_kept_or_counted_line_by_line(lines, final_newline, kind, seq_length, overlong):
    tok = TOKENIZERS[kind]
    data = b"\n".join(raw for _, raw in lines) + (b"\n" if final_newline else b"")
    numbered = numbered_lines(data)
    kinds = {n: what for n, (what, _) in enumerate(lines[: len(numbered)], start=1)}
    blank = {n for n, raw in enumerate(numbered, start=1) if is_blank(raw, n)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        path.write_bytes(data)
        cfg = DataConfig(seq_length=seq_length, overlong=overlong, cache_dir=str(Path(tmp) / "cache"))
        try:
            ds, report = prepare_dataset(str(path), tok, cfg)
            got = documents(ds)
        except DataError as e:
            assert "no usable rows" in str(e)
            _, report = tokenize_rows(str(path), tok, cfg)
            assert report.rows_kept == 0
            got = []

        kept = [n for n, _, _ in got]
        rejected = [(reason, n) for reason, numbers in report.rejected.items() for n in numbers]
        rejected_lines = [n for _, n in rejected]
        assert set(report.rejected) <= {reason.value for reason in Reason}
        assert len(set(rejected_lines)) == len(rejected_lines), "a line rejected twice"
        assert kept == sorted(set(kept)) and not set(kept) & set(rejected_lines)
        assert set(kept) | set(rejected_lines) == set(range(1, len(numbered) + 1)) - blank
        assert report.rows_read == report.rows_kept + report.total_rejected == len(numbered) - len(blank)
        assert report.rows_kept == len(kept) and set(report.truncated) <= set(kept)
        assert {n for n, what in kinds.items() if what == "cut"} <= set(rejected_lines)
        if seq_length == 4096:  # every generated valid row fits
            assert {n for n, what in kinds.items() if what == "valid"} <= set(kept)
        for n, ids, mask in got:
            check_row(tok, kind == "generation", numbered[n - 1], ids, mask, seq_length, n in report.truncated)

        # Strict mode stops at the first unreadable line, and with no such line changes nothing.
        unreadable = sorted(n for reason, n in rejected if Reason(reason) in UNREADABLE)
        strict = DataConfig(seq_length=seq_length, overlong=overlong, strict=True, cache_dir=cfg.cache_dir)
        if unreadable:
            with pytest.raises(DataError, match=rf"line {unreadable[0]}: \w+: "):
                prepare_dataset(str(path), tok, strict)
        elif got:
            strict_ds, _ = prepare_dataset(str(path), tok, strict)
            assert documents(strict_ds) == got

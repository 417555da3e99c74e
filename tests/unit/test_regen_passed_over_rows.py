"""Regen on a user's own prompt file says which rows it passed over, with their lines and the fix, as training
does: an unreadable row and a row with no user turn to answer are counted, not dropped unseen."""

import json

from blockdraft.regen.prompt_plan import source_conversations


def test_unreadable_and_unanswerable_rows_are_named(tmp_path, capsys):
    rows = tmp_path / "chats.jsonl"
    rows.write_text("\n".join([
        json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}),
        json.dumps({"messages": [{"role": "user", "content": "What is 2 + 2?"}]}),
        json.dumps({"messages": [{"role": "assistant", "content": "an answer with no question"}]}),
    ]) + "\n")
    conversations = source_conversations(str(rows), limit=10)
    assert [c[0]["content"] for c in conversations] == ["What is 2 + 2?"]
    said = capsys.readouterr().out
    assert "3 lines read, 2 kept, 1 rejected" in said and "unknown_role: 1 (lines 1)" in said and "fix: use roles" in said
    assert "1 rows open with no user turn to answer: passed over" in said


def test_a_clean_file_says_nothing(tmp_path, capsys):
    rows = tmp_path / "chats.jsonl"
    rows.write_text(json.dumps({"messages": [{"role": "user", "content": "Hello?"}]}) + "\n")
    assert len(source_conversations(str(rows), limit=10)) == 1
    assert capsys.readouterr().out == ""

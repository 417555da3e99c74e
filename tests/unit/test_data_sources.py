"""Rows from `datasets`: a save_to_disk folder, parquet and arrow files, and hub ids, through the
same row checks, rejection report (row indices) and tokenisation cache as JSONL."""

import time

import datasets
import pytest

import blockdraft.data.tokenize_stream as stream_module
from blockdraft.data.config import DataConfig
from blockdraft.data.dataset import prepare_dataset
from blockdraft.data.rows import Reason
from blockdraft.data.sources import check_source, parse_source
from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer
from blockdraft.errors import ConfigError


def chat(question, answer, role="assistant"):
    return {"messages": [{"role": "user", "content": question}, {"role": role, "content": answer}]}


# Row 2 has a role no chat knows, row 4 no reply: both set aside, by row index.
ROWS = [chat("q1", "a1"), chat("q2", "a2", role="robot"), chat("q3", "a3"), chat("q4", "", role="user"), chat("q5", "a5")]


@pytest.fixture
def tok():
    return build_tiny_tokenizer()


def _written(kind, tmp_path):
    rows = datasets.Dataset.from_list(ROWS)
    if kind == "save_to_disk":
        rows.save_to_disk(str(tmp_path / "disk"))
        return tmp_path / "disk"
    if kind == "parquet":
        rows.to_parquet(str(tmp_path / "rows.parquet"))
        return tmp_path / "rows.parquet"
    if kind == "parquet_folder":
        (tmp_path / "pq").mkdir()
        datasets.Dataset.from_list(ROWS[:3]).to_parquet(str(tmp_path / "pq" / "part-0.parquet"))
        datasets.Dataset.from_list(ROWS[3:]).to_parquet(str(tmp_path / "pq" / "part-1.parquet"))
        return tmp_path / "pq"
    rows.save_to_disk(str(tmp_path / "saved"))  # an arrow file as datasets writes it
    return next((tmp_path / "saved").glob("*.arrow"))


@pytest.mark.parametrize("kind", ["save_to_disk", "parquet", "parquet_folder", "arrow"])
def test_a_datasets_source_is_read_checked_and_reported_by_row(kind, tok, tmp_path, monkeypatch):
    path = _written(kind, tmp_path)
    cfg = DataConfig(train=str(path), seq_length=64, cache_dir=str(tmp_path / "cache"))
    cfg.validate()
    dataset, report = prepare_dataset(str(path), tok, cfg)
    assert len(dataset) == 3 and report.unit == "row"
    assert report.lines(Reason.UNKNOWN_ROLE) == [2]
    assert report.lines(Reason.NO_ASSISTANT_TOKENS) == [4]
    assert "5 rows read, 3 kept, 2 rejected" in report.summary() and "unknown_role: 1 (rows 2)" in report.summary()
    assert dataset.source_lines(1) == [3]

    calls = []
    monkeypatch.setattr(stream_module, "tokenize_row", lambda *a, **k: calls.append(1))
    again, _ = prepare_dataset(str(path), tok, cfg)  # the tokenisation cache answers: nothing is tokenised
    assert calls == [] and [again[i]["input_ids"].tolist() for i in range(3)] == [dataset[i]["input_ids"].tolist() for i in range(3)]


def test_strict_names_the_row_index(tok, tmp_path):
    path = _written("parquet", tmp_path)
    from blockdraft.errors import DataError

    with pytest.raises(DataError, match="rows.parquet row 2: unknown_role"):
        prepare_dataset(str(path), tok, DataConfig(seq_length=64, strict=True, cache_dir=str(tmp_path / "cache")))


def test_hub_ids_are_parsed_with_config_and_split():
    source = parse_source("HuggingFaceH4/ultrachat_200k:default@train_sft")
    assert (source.kind, source.name, source.config, source.split) == ("hub", "HuggingFaceH4/ultrachat_200k", "default", "train_sft")
    assert parse_source("imdb").split == "train" and parse_source("imdb").config is None


def test_a_hub_id_missing_offline_is_refused_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    began = time.monotonic()
    with pytest.raises(ConfigError, match="data.train='nobody-here/no-such-rows@train'.*not in the local Hugging Face cache.*HF_HUB_OFFLINE=1"):
        DataConfig(train="nobody-here/no-such-rows@train").validate()
    assert time.monotonic() - began < 30


@pytest.mark.parametrize("spec,match", [
    ("/no/such/rows.parquet", "does not exist"),
    ("./missing.jsonl", "does not exist"),
    ("not a dataset id!", "does not exist"),
])
def test_what_is_neither_a_path_nor_an_id_is_refused(spec, match):
    with pytest.raises(ConfigError, match=match):
        check_source(spec, "data.train")


def test_a_folder_with_no_rows_in_it_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match="neither one written by datasets.save_to_disk nor one holding parquet"):
        check_source(str(tmp_path), "data.val")


def test_regeneration_takes_its_prompts_from_a_datasets_source(tmp_path, monkeypatch):
    from blockdraft.regen.prompt_plan import source_conversations
    from blockdraft.regen.config import RegenConfig

    path = _written("parquet", tmp_path)
    conversations = source_conversations(str(path), limit=10)
    # Every row that opens with a user question is a prompt (the rejected rows' openings too).
    assert [c[0]["content"] for c in conversations] == ["q1", "q3", "q4", "q5"]
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the message of an offline machine, whatever an earlier test left set
    with pytest.raises(ConfigError, match="prompts='nobody-here/no-such-prompts'.*not in the local Hugging Face cache"):
        RegenConfig(target_dir=str(target), out=str(tmp_path / "out"), prompts="nobody-here/no-such-prompts").validate()

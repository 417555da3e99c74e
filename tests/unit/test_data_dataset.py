import json
from dataclasses import replace

import datasets
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import blockdraft.data.tokenize_stream as stream_module
from blockdraft.data.config import DataConfig
from blockdraft.data.dataset import collate, pack_documents, prepare_dataset
from blockdraft.data.rows import Reason
from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer
from blockdraft.errors import ConfigError, DataError


def chat(question, answer):
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


@pytest.fixture
def tok():
    return build_tiny_tokenizer()


@pytest.fixture
def train_file(tmp_path):
    lines = [
        json.dumps(chat("q1", "a1")),
        "{broken",
        json.dumps({"messages": [{"role": "user", "content": "no reply"}]}),
        json.dumps({"conversations": [{"from": "human", "value": "q4"}, {"from": "gpt", "value": "a4 " * 30}]}),
        json.dumps(chat("q5", "a5")),
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def cfg(tmp_path, train_file):
    return DataConfig(train=str(train_file), seq_length=64, cache_dir=str(tmp_path / "cache"))


def count_tokenize_calls(monkeypatch):
    calls = []
    real = stream_module.tokenize_row

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(stream_module, "tokenize_row", counting)
    return calls


def test_rejects_are_counted_with_line_numbers_and_long_rows_truncated(tok, cfg, train_file):
    ds, report = prepare_dataset(str(train_file), tok, cfg)
    assert len(ds) == 3 and ds.source_lines(1) == [4]
    assert report.lines(Reason.BAD_JSON) == [2]
    assert report.lines(Reason.NO_ASSISTANT_TOKENS) == [3]
    assert report.truncated == [4] and len(ds[1]["input_ids"]) == 64
    assert (report.rows_read, report.rows_kept, report.total_rejected) == (5, 3, 2)
    summary = report.summary()
    assert "5 lines read, 3 kept, 2 rejected, 1 truncated to 64 tokens" in summary
    assert "bad_json: 1 (lines 2)" in summary and "no_assistant_tokens: 1 (lines 3)" in summary


def test_drop_and_strict(tok, cfg, train_file):
    _, report = prepare_dataset(str(train_file), tok, replace(cfg, overlong="drop"))
    assert report.lines(Reason.OVERLONG_DROPPED) == [4]
    with pytest.raises(DataError, match="train.jsonl line 2: bad_json"):
        prepare_dataset(str(train_file), tok, replace(cfg, strict=True))


def test_second_call_reads_the_cache(tok, cfg, train_file, monkeypatch):
    calls = count_tokenize_calls(monkeypatch)
    first, first_report = prepare_dataset(str(train_file), tok, cfg)
    tokenized_once = len(calls)
    second, second_report = prepare_dataset(str(train_file), tok, cfg)
    assert len(calls) == tokenized_once > 0
    assert [first[i]["input_ids"].tolist() for i in range(len(first))] == [
        second[i]["input_ids"].tolist() for i in range(len(second))
    ]
    assert second_report.summary() == first_report.summary()


def test_cache_misses_when_rows_tokenizer_or_settings_change(tok, cfg, train_file, monkeypatch):
    calls = count_tokenize_calls(monkeypatch)
    prepare_dataset(str(train_file), tok, cfg)
    runs = [len(calls)]
    prepare_dataset(str(train_file), tok, replace(cfg, seq_length=32))
    runs.append(len(calls))
    prepare_dataset(str(train_file), tok, replace(cfg, chat_template_kwargs={"enable_thinking": False}))
    runs.append(len(calls))
    other = build_tiny_tokenizer()
    other.chat_template = other.chat_template.replace("<|im_start|>", "<|im_start|> ")
    prepare_dataset(str(train_file), other, cfg)
    runs.append(len(calls))
    train_file.write_text(train_file.read_text() + json.dumps(chat("q6", "a6")) + "\n")
    prepare_dataset(str(train_file), tok, cfg)
    runs.append(len(calls))
    assert runs == sorted(set(runs)), "every change must tokenise again"
    prepare_dataset(str(train_file), tok, replace(cfg, packing=True))  # layout only: cached
    assert len(calls) == runs[-1]


def test_packing_restarts_positions_per_document(tok, tmp_path):
    rows = [chat("q", "a"), chat("qq", "bb"), chat("q", "a" * 40)]
    cfg = DataConfig(seq_length=64, packing=True, cache_dir=str(tmp_path))
    ds, _ = prepare_dataset(rows, tok, cfg)
    lengths = ds.documents.lengths().tolist()
    assert len(ds) == 2 and ds[0]["document_lengths"].tolist() == lengths[:2]
    batch = collate([ds[0], ds[1]], pad_id=tok.pad_token_id)
    a, b = lengths[0], lengths[1]
    assert batch["position_ids"][0, : a + b].tolist() == list(range(a)) + list(range(b))
    assert batch["document_ids"][0, : a + b].tolist() == [0] * a + [1] * b
    assert batch["document_ids"][0, a + b :].eq(-1).all()


def test_collate_pads_and_types(tok, tmp_path):
    rows = [chat("q", "a"), chat("q", "a longer reply")]
    ds, _ = prepare_dataset(rows, tok, DataConfig(cache_dir=str(tmp_path)))
    batch = collate([ds[0], ds[1]], pad_id=tok.pad_token_id, pad_to=64)
    n0 = len(ds[0]["input_ids"])
    assert batch["input_ids"].shape == (2, 64) and batch["input_ids"].dtype == torch.long
    for key in ("loss_mask", "attention_mask"):
        assert batch[key].dtype == torch.bool
    assert batch["attention_mask"][0].sum() == n0 and batch["input_ids"][0, n0:].eq(tok.pad_token_id).all()
    assert not batch["loss_mask"][0, n0:].any()
    assert batch["loss_mask"][0].tolist() == ds[0]["loss_mask"].tolist() + [False] * (64 - n0)


def test_works_with_distributed_sampler(tok, tmp_path):
    rows = [chat(f"q{i}", f"a{i}") for i in range(6)]
    ds, _ = prepare_dataset(rows, tok, DataConfig(cache_dir=str(tmp_path)))
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0)
        loader = DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=lambda b: collate(b, pad_id=0))
        seen += [tuple(row.tolist()) for batch in loader for row in batch["input_ids"]]
    assert sorted(seen) == sorted(tuple(ds[i]["input_ids"].tolist()) for i in range(len(ds)))


def test_datasets_object_is_accepted(tok, tmp_path):
    rows = datasets.Dataset.from_list([chat("q", "a")])
    ds, report = prepare_dataset(rows, tok, DataConfig(cache_dir=str(tmp_path)))
    assert len(ds) == 1 and report.unit == "row"


def test_no_usable_row_is_an_error(tok, tmp_path):
    prompt_only = {"messages": [{"role": "user", "content": "q"}]}
    with pytest.raises(DataError, match="(?s)no usable rows.*no_assistant_tokens: 1 \\(rows 1\\)"):
        prepare_dataset([prompt_only], tok, DataConfig(cache_dir=str(tmp_path)))


def test_pack_documents_keeps_order():
    assert pack_documents([3, 3, 3, 5, 1], 6) == [0, 2, 3, 5]
    assert pack_documents([], 6) == [0]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"train": None}, "data.train is not set"),
        ({"train": "/no/such.jsonl"}, "data.train='/no/such.jsonl' does not exist"),
        ({"seq_length": 1}, "data.seq_length=1"),
        ({"overlong": "cut"}, "data.overlong='cut' is not one of truncate, drop"),
        ({"max_rows": 0}, "data.max_rows=0"),
    ],
)
def test_config_validation_names_the_key(cfg, change, match):
    cfg.validate()
    with pytest.raises(ConfigError, match=match):
        replace(cfg, **change).validate()


def test_cache_dir_default_follows_the_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("BLOCKDRAFT_CACHE_DIR", str(tmp_path))
    assert DataConfig().resolved_cache_dir() == tmp_path / "tokenized"
    assert DataConfig(cache_dir=str(tmp_path / "mine")).resolved_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("BLOCKDRAFT_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert DataConfig().resolved_cache_dir().parts[-3:] == (".cache", "blockdraft", "tokenized")


def test_an_omegaconf_data_node_is_accepted(tok, cfg, train_file):
    from omegaconf import OmegaConf

    node = OmegaConf.structured(cfg)
    ds, _ = prepare_dataset(str(train_file), tok, node)
    assert len(ds) == 3


@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("max_rows", [1, 2, 3, 5])
def test_max_rows_are_the_first_training_rows_as_a_store_of_every_row_holds_them(tok, tmp_path, packing, max_rows):
    # Rows set aside (no reply, unreadable, overlong with drop) and packed rows: max_rows counts training
    # rows, so online training and a feature store of the whole file read the same ones.
    lines = [json.dumps(chat(f"q{i}", "a " * (3 + 5 * (i % 3)))) for i in range(12)]
    lines[1], lines[4] = "{broken", json.dumps({"messages": [{"role": "user", "content": "no reply"}]})
    lines[6] = json.dumps(chat("long", "x " * 200))
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    base = DataConfig(train=str(path), seq_length=96, overlong="drop", packing=packing, cache_dir=str(tmp_path / "cache"))
    every, _ = prepare_dataset(str(path), tok, base)
    first, _ = prepare_dataset(str(path), tok, replace(base, max_rows=max_rows))
    assert len(first) == min(max_rows, len(every))
    for i in range(len(first)):
        assert all(torch.equal(first[i][k], every[i][k]) for k in every[i]), i
    assert torch.equal(first.reply_tokens(), torch.cat([every[i]["input_ids"][every[i]["loss_mask"]] for i in range(len(first))]))

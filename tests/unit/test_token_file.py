"""The memory-mapped token file: the rows it maps are the rows tokenised in memory, batch for batch;
several tokenising processes give the same file and the same report as one; a torn, stale or abandoned
file is never read; and the file is mapped, not loaded."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import blockdraft.data.tokenize_stream as stream_module
from blockdraft.data.config import DataConfig
from blockdraft.data.dataset import CACHE_FORMAT, TokenizedDataset, dataset_key, prepare_dataset, tokenize_rows
from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer
from blockdraft.data.token_file import MANIFEST
from blockdraft.errors import DataError
from blockdraft.ranks.distributed import DistInfo
from blockdraft.train.batch_order import GlobalBatches

ONE_PROCESS = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def chat(question, answer):
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def write_rows(path: Path, count: int, bad_lines=()) -> Path:
    lines = [json.dumps(chat(f"question {i}", "answer " * (1 + i % 7))) for i in range(count)]
    for n in bad_lines:
        lines[n - 1] = "{broken"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def counting_tokenize_calls(monkeypatch):
    calls = []
    real = stream_module.tokenize_row
    monkeypatch.setattr(stream_module, "tokenize_row", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def rows_of(ds):
    return [{k: v.tolist() for k, v in ds[i].items()} for i in range(len(ds))]


@pytest.mark.parametrize("packing", [False, True])
def test_the_token_file_gives_the_rows_and_batches_of_tokenising_in_memory(tok, tmp_path, packing):
    path = write_rows(tmp_path / "rows.jsonl", 40, bad_lines=[3])
    cfg = DataConfig(seq_length=48, packing=packing, cache_dir=str(tmp_path / "cache"), tokenize_workers=1)
    mapped, report = prepare_dataset(str(path), tok, cfg)
    documents, in_memory_report = tokenize_rows(str(path), tok, cfg)
    in_memory = TokenizedDataset(documents, cfg.seq_length, cfg.packing)
    assert rows_of(mapped) == rows_of(in_memory) and len(mapped) > 10
    assert report.summary() == in_memory_report.summary()
    assert torch.equal(mapped.prompt_hashes(), in_memory.prompt_hashes())
    assert mapped.source_lines(2) == in_memory.source_lines(2)
    assert torch.equal(mapped.reply_tokens(), in_memory.reply_tokens())
    a, b = (GlobalBatches(ds, 2, 2, tok.pad_token_id, ONE_PROCESS, seed=5) for ds in (mapped, in_memory))
    for _ in range(3):
        for (batch_a, _gen_a), (batch_b, _gen_b) in zip(a.next_step(), b.next_step()):
            assert batch_a.keys() == batch_b.keys() and all(torch.equal(batch_a[k], batch_b[k]) for k in batch_a)


def test_every_rank_maps_the_file_and_none_loads_it(tok, tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", 8)
    cfg = DataConfig(seq_length=64, cache_dir=str(tmp_path / "cache"), tokenize_workers=1)
    ds, _ = prepare_dataset(str(path), tok, cfg)
    folder = cfg.resolved_cache_dir() / dataset_key(str(path), tok, cfg)
    maps = Path("/proc/self/maps").read_text()
    for name in ("tokens", "loss_mask", "starts", "lines", "prompt_hashes"):
        assert str(folder / f"{name}.bin") in maps, f"{name}.bin is not mapped"
    assert not list(cfg.resolved_cache_dir().glob("*.pt")) and not list(cfg.resolved_cache_dir().glob("*.tmp"))
    first = int(ds.documents.tokens[0])
    ds.documents.tokens[0] = first + 1  # a private map: writing to it never reaches the file
    assert int(prepare_dataset(str(path), tok, cfg)[0].documents.tokens[0]) == first


def test_several_processes_tokenise_what_one_does_in_order(tok, tmp_path, monkeypatch):
    path = write_rows(tmp_path / "rows.jsonl", 3 * stream_module.CHUNK_ROWS + 17, bad_lines=[5, 600])
    one = DataConfig(seq_length=60, overlong="drop", cache_dir=str(tmp_path / "one"), tokenize_workers=1)
    many = replace(one, cache_dir=str(tmp_path / "many"), tokenize_workers=2)
    calls = counting_tokenize_calls(monkeypatch)  # counts the calls made in this process only
    b, report_b = prepare_dataset(str(path), tok, many)
    assert not calls, "the workers tokenise, not this process"
    a, report_a = prepare_dataset(str(path), tok, one)
    assert len(calls) == 3 * stream_module.CHUNK_ROWS + 15
    assert rows_of(a) == rows_of(b) and report_a.to_dict() == report_b.to_dict()
    assert report_a.total_rejected > 2  # unreadable lines and overlong rows, both counted in line order
    # data.max_rows stops part way through a chunk: rows the workers read ahead are not counted as read.
    a, report_a = prepare_dataset(str(path), tok, replace(one, max_rows=300))
    b, report_b = prepare_dataset(str(path), tok, replace(many, max_rows=300))
    assert rows_of(a) == rows_of(b) and report_a.to_dict() == report_b.to_dict() and len(b) == 300
    assert report_b.rows_read < 3 * stream_module.CHUNK_ROWS
    # data.strict stops at the unreadable line, whichever process found it.
    with pytest.raises(DataError, match="line 5: bad_json"):
        prepare_dataset(str(path), tok, replace(many, strict=True))


def test_a_torn_or_stale_file_is_tokenised_again(tok, tmp_path, monkeypatch):
    path = write_rows(tmp_path / "rows.jsonl", 12)
    cfg = DataConfig(seq_length=64, cache_dir=str(tmp_path / "cache"), tokenize_workers=1)
    folder = cfg.resolved_cache_dir() / dataset_key(str(path), tok, cfg)
    calls = counting_tokenize_calls(monkeypatch)
    expected = rows_of(prepare_dataset(str(path), tok, cfg)[0])
    assert len(calls) == 12
    rows_of(prepare_dataset(str(path), tok, cfg)[0])
    assert len(calls) == 12, "a whole, current file is mapped, not tokenised again"

    tokens = folder / "tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-4])  # torn: a copy cut short
    assert rows_of(prepare_dataset(str(path), tok, cfg)[0]) == expected and len(calls) == 24

    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, "format": CACHE_FORMAT - 1}))  # stale: an older layout
    assert rows_of(prepare_dataset(str(path), tok, cfg)[0]) == expected and len(calls) == 36

    (folder / MANIFEST).unlink()  # a folder without its manifest was never finished
    abandoned = folder.with_name(f"{folder.name}.{__import__('socket').gethostname()}.999999999.tmp")
    abandoned.mkdir()  # a writer killed part way, on this host: removed by the next writer
    assert rows_of(prepare_dataset(str(path), tok, cfg)[0]) == expected and len(calls) == 48
    assert not abandoned.exists() and sorted(p.name for p in folder.parent.iterdir()) == [folder.name]


def test_no_usable_rows_is_still_an_error_from_the_file(tok, tmp_path):
    cfg = DataConfig(cache_dir=str(tmp_path), tokenize_workers=1)
    for _ in range(2):  # written, then read back from the file
        with pytest.raises(DataError, match="no usable rows"):
            prepare_dataset([{"messages": [{"role": "user", "content": "q"}]}], tok, cfg)


def test_tokenize_workers_is_checked(tmp_path):
    from blockdraft.errors import ConfigError

    with pytest.raises(ConfigError, match="data.tokenize_workers=0 must be 1 or more"):
        DataConfig(train=str(write_rows(tmp_path / "r.jsonl", 1)), tokenize_workers=0).validate()


@pytest.mark.parametrize("block", [1, 3, 7, 1000])
def test_reply_tokens_read_a_block_at_a_time_are_those_of_the_whole_file(block):
    from blockdraft.data.dataset import Documents, reply_ends

    g = torch.Generator().manual_seed(block)
    ids = [torch.randint(0, 20, (n,), generator=g).tolist() for n in (5, 9, 4, 11)]
    masks = [(torch.rand(len(x), generator=g) > 0.4).tolist() for x in ids]
    ds = TokenizedDataset(Documents.from_lists(ids, masks, [1, 2, 3, 4]), seq_length=16)
    tokens, mask = ds.documents.tokens.long(), ds.documents.loss_mask
    assert torch.equal(ds.reply_end_tokens(block=block), reply_ends(tokens, mask))
    assert torch.equal(torch.cat(list(ds.reply_token_blocks(block=block))).long(), tokens[mask])


def test_the_pipeline_keeps_the_token_files_beside_out_unless_told_otherwise():
    from blockdraft.pipeline import commands
    from blockdraft.pipeline.settings import parse_overrides

    for stage in ("capture", "train"):
        argv = commands.stage_argv(stage, parse_overrides(["target=/t", "out=/o"]), True)
        assert "data.cache_dir=/o/tokenized" in argv, stage
        given = commands.stage_argv(stage, parse_overrides(["target=/t", "out=/o", "data.cache_dir=/fast"]), True)
        assert given.index("data.cache_dir=/fast") > given.index("data.cache_dir=/o/tokenized")  # the last one wins

"""Chat rows -> a map-style dataset of token ids and loss masks, cached on disk, and its collate.

Tokenisation runs once per (rows, tokenizer, settings): the result is a memory-mapped token file
(blockdraft/data/token_file.py) under a hash of the rows' content, the tokenizer (vocabulary, merges,
chat template) and the settings that change the ids. Rows stream through several processes straight
into that file (blockdraft/data/tokenize_stream.py); every reader maps it, none loads it. Packing only
lays cached conversations out into rows, so it is applied after the cache and does not invalidate it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
from torch.utils.data import Dataset

from blockdraft.data.config import DataConfig, as_data_config
from blockdraft.data.rows import RejectReport, new_report, parsed_source
from blockdraft.data.sources import load_rows
from blockdraft.data.token_file import TokenFileWriter, map_arrays, read_manifest
from blockdraft.data.tokenize import RowRejected, chat_template_of
from blockdraft.data.tokenize_stream import stopped_at, tokenised_rows
from blockdraft.errors import DataError

log = logging.getLogger(__name__)

# Bump when the cached layout or the tokenisation rules change, so old entries are ignored.
# 2: data.max_rows counts training rows (after rejects and packing), as a feature store does; 3: each
# conversation's prompt hash, for the record of training prompts; 4: a memory-mapped token file, not one .pt
CACHE_FORMAT = 4


@dataclass
class Documents:
    """Tokenised conversations laid end to end; conversation d is tokens[starts[d]:starts[d+1]]."""

    # Read from a token file, each is a private map of its array (token_file.py): rows are read on demand.
    tokens: torch.Tensor  # (total,) int32
    loss_mask: torch.Tensor  # (total,) bool
    starts: torch.Tensor  # (D + 1,) int64
    lines: torch.Tensor  # (D,) int64: source line (or row) of each conversation
    prompt_hashes: torch.Tensor  # (D,) int64: each conversation's prompt (blockdraft/data/prompt_record.py)

    @classmethod
    def from_lists(cls, ids: list[list[int]], masks: list[list[bool]], lines: list[int],
                   prompt_hashes: Optional[list[int]] = None) -> "Documents":
        lengths = torch.tensor([len(x) for x in ids], dtype=torch.int64)
        starts = torch.zeros(len(ids) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=starts[1:])
        return cls(
            tokens=torch.tensor([t for x in ids for t in x], dtype=torch.int32),
            loss_mask=torch.tensor([m for x in masks for m in x], dtype=torch.bool),
            starts=starts,
            lines=torch.tensor(lines, dtype=torch.int64),
            prompt_hashes=torch.tensor(prompt_hashes if prompt_hashes is not None else [0] * len(ids), dtype=torch.int64),
        )

    def lengths(self) -> torch.Tensor:
        return self.starts[1:] - self.starts[:-1]

    def prefix(self, count: int) -> "Documents":
        """The first `count` conversations."""
        end = int(self.starts[count])
        return Documents(self.tokens[:end], self.loss_mask[:end], self.starts[:count + 1].clone(), self.lines[:count].clone(),
                         self.prompt_hashes[:count].clone())


class TokenizedDataset(Dataset):
    """Map-style rows in a fixed order, each one conversation or (packed) several.

    Item r is a dict: `input_ids` (L,) long, `loss_mask` (L,) bool, `document_lengths`
    (D_r,) long, summing to L; `collate` turns a list of items into a padded batch.
    """

    def __init__(self, documents: Documents, seq_length: int, packing: bool = False, max_rows: Optional[int] = None):
        count = len(documents.lines)
        groups = list(pack_documents(documents.lengths().tolist(), seq_length) if packing else range(count + 1))
        if max_rows is not None and len(groups) - 1 > max_rows:
            # The first max_rows rows, as a feature store of every row serves them (packing is order-preserving,
            # so they are the rows packed from all the documents).
            groups = groups[:max_rows + 1]
            documents = documents.prefix(groups[-1])
        self.documents = documents
        self.document_lengths = documents.lengths()  # (D,)
        self.row_starts = torch.as_tensor(groups, dtype=torch.int64)  # (R + 1,) into documents

    def __len__(self) -> int:
        return len(self.row_starts) - 1

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} of a dataset of {len(self)} rows")
        first, last = int(self.row_starts[index]), int(self.row_starts[index + 1])
        begin, end = int(self.documents.starts[first]), int(self.documents.starts[last])
        return {
            "input_ids": self.documents.tokens[begin:end].long(),
            "loss_mask": self.documents.loss_mask[begin:end].clone(),
            "document_lengths": self.document_lengths[first:last].clone(),
        }

    def reply_tokens(self) -> torch.Tensor:
        """Every supervised token id (for the draft vocabulary)."""
        return torch.cat([torch.zeros(0, dtype=torch.int32), *self.reply_token_blocks()]).long()

    def reply_token_blocks(self, block: int = 1 << 24):
        """The supervised token ids, `block` tokens of the file at a time: a rank counting them over a
        million rows holds one block, not a copy of the token file."""
        tokens, mask = self.documents.tokens, self.documents.loss_mask
        for a in range(0, len(tokens), block):
            yield tokens[a:a + block][mask[a:a + block]]

    def reply_end_tokens(self, block: int = 1 << 24) -> torch.Tensor:
        """The last supervised token of every reply (end-of-turn tokens), `block` tokens at a time."""
        tokens, mask, total = self.documents.tokens, self.documents.loss_mask, len(self.documents.tokens)
        ends = [torch.zeros(0, dtype=torch.long)]
        for a in range(0, total, block):
            b = min(a + block, total)
            following = mask[a + 1:b + 1]  # one past the block: a reply may end on its last token
            if b == total:
                following = torch.cat([following, mask.new_zeros(1)])
            ends.append(tokens[a:b][mask[a:b] & ~following].long())
        return torch.cat(ends)

    def source_lines(self, index: int) -> list[int]:
        """Source lines of the conversations in row `index`, to trace a row back to the file."""
        first, last = int(self.row_starts[index]), int(self.row_starts[index + 1])
        return self.documents.lines[first:last].tolist()

    def row_prompt_hashes(self, index: int) -> torch.Tensor:
        """(D_r,) int64: the prompt hash of each conversation in row `index` (a feature store keeps them)."""
        first, last = int(self.row_starts[index]), int(self.row_starts[index + 1])
        return self.documents.prompt_hashes[first:last].clone()

    def prompt_hashes(self) -> torch.Tensor:
        """(D,) int64: the prompt of every conversation these rows hold (data.max_rows applied)."""
        return self.documents.prompt_hashes[: int(self.row_starts[-1])]


def reply_ends(tokens: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Ids at positions where a supervised run ends (the next token is unsupervised or absent)."""
    following = torch.cat([loss_mask[1:], loss_mask.new_zeros(1)])
    return tokens[loss_mask & ~following]


def pack_documents(lengths: list[int], seq_length: int) -> list[int]:
    """Row boundaries (into the document list) packing documents in order, up to seq_length each.

    Greedy and order-preserving, so the layout is the same on every rank and every run.
    """
    if not lengths:
        return [0]
    boundaries, used = [0], 0
    for d, length in enumerate(lengths):
        if used and used + length > seq_length:
            boundaries.append(d)
            used = 0
        used += length
    boundaries.append(len(lengths))
    return boundaries


def collate(
    batch: list[dict[str, torch.Tensor]], pad_id: int, pad_to: Optional[int] = None
) -> dict[str, torch.Tensor]:
    """Right-pad items to the longest (or to `pad_to`) and describe where documents lie.

    Returns `input_ids` (N, T) long, `loss_mask` (N, T) bool, `attention_mask` (N, T) bool
    (real tokens), `position_ids` (N, T) long restarting at 0 for each document, and
    `document_ids` (N, T) long numbering documents 0.. within a row, -1 on padding.
    Items read from a feature store also carry `features` (L, F), and with soft labels
    `teacher_ids` / `teacher_logits` (L, k): each padded with zeros to (N, T, *).
    """
    longest = max((len(item["input_ids"]) for item in batch), default=0)
    width = longest if pad_to is None else pad_to
    if width < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest row ({longest} tokens)")
    n = len(batch)
    out = {
        "input_ids": torch.full((n, width), pad_id, dtype=torch.long),
        "loss_mask": torch.zeros((n, width), dtype=torch.bool),
        "attention_mask": torch.zeros((n, width), dtype=torch.bool),
        "position_ids": torch.zeros((n, width), dtype=torch.long),
        "document_ids": torch.full((n, width), -1, dtype=torch.long),
    }
    for row, item in enumerate(batch):
        lengths = item["document_lengths"]
        size = int(lengths.sum())
        out["input_ids"][row, :size] = item["input_ids"]
        out["loss_mask"][row, :size] = item["loss_mask"]
        out["attention_mask"][row, :size] = True
        out["position_ids"][row, :size] = torch.cat([torch.arange(int(k)) for k in lengths])
        out["document_ids"][row, :size] = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    for key, dtype in (("features", torch.float32), ("teacher_ids", torch.long), ("teacher_logits", torch.float32)):
        if batch and key in batch[0]:
            out[key] = torch.zeros((n, width, batch[0][key].shape[-1]), dtype=dtype)
            for row, item in enumerate(batch):
                out[key][row, : len(item[key])] = item[key]
    return out


def prepare_dataset(
    path_or_rows: Any, tokenizer: Any, cfg: DataConfig | Mapping[str, Any], key: Optional[str] = None
) -> tuple[TokenizedDataset, RejectReport]:
    """Tokenise rows (a JSONL path, a `save_to_disk` folder, a `datasets.Dataset` or a list of
    dicts) into the token file, or map the one there is; report what was set aside.

    `key`: the cache key when the caller has it (`dataset_key`; ranks get rank 0's), so the rows are not
    hashed again. Raises `DataError` when no row is left, or with `cfg.strict` at the first unreadable row.
    """
    cfg = as_data_config(cfg)
    cfg.validate(require_train=False)
    chat_template_of(tokenizer)  # refuse a template-less tokenizer before reading anything
    source = _as_source(path_or_rows)
    key = key or cache_key(source, tokenizer, cfg)
    folder = cfg.resolved_cache_dir() / key
    manifest = read_manifest(folder, key, CACHE_FORMAT)
    if manifest is not None:
        log.info("tokenised rows mapped from %s", folder)
    else:
        _write_token_file(folder, key, source, tokenizer, cfg)
        manifest = read_manifest(folder, key, CACHE_FORMAT)
        if manifest is None:
            raise DataError(f"the token file just written at {folder} cannot be read back (its folder was changed "
                            "meanwhile); check that nothing else writes under data.cache_dir and run again")
    documents = Documents(**map_arrays(folder, manifest))
    report = RejectReport.from_dict(manifest["report"])
    report.source = new_report(source).source  # the same rows may sit at another path now
    if report.rows_kept == 0:
        raise DataError(
            f"no usable rows in {report.source}; every row was set aside:\n{report.summary()}\n"
            "Fix the rows as the reasons say, or point data.train / data.val at other rows."
        )
    (log.warning if report.total_rejected else log.info)("data: %s", report.summary())
    return TokenizedDataset(documents, cfg.seq_length, cfg.packing, cfg.max_rows), report


def dataset_key(path_or_rows: Any, tokenizer: Any, cfg: DataConfig | Mapping[str, Any]) -> str:
    """The cache key `prepare_dataset` files these rows under (one process computes it, the ranks share it)."""
    return cache_key(_as_source(path_or_rows), tokenizer, as_data_config(cfg))


def _write_token_file(folder: Path, key: str, source: Any, tokenizer: Any, cfg: DataConfig) -> None:
    writer = TokenFileWriter(folder, key, CACHE_FORMAT)
    try:
        report = stream_rows(writer, source, tokenizer, cfg)
    except BaseException:
        writer.abandon()  # nothing half-written is left to be read
        raise
    writer.commit(report)
    log.info("tokenised %d rows into %s", report.rows_kept, folder)


def stream_rows(sink: Any, source: Any, tokenizer: Any, cfg: DataConfig) -> RejectReport:
    """Every row of `source` through `tokenize_row` (in `cfg.tokenize_workers` processes), in order, into
    `sink.add(ids, mask, line, prompt_hash)`, counting what is set aside and why."""
    report = new_report(source)
    report.seq_length = cfg.seq_length
    rows = RowCounter(cfg.seq_length, cfg.packing)
    settings = {"seq_length": cfg.seq_length, "overlong": cfg.overlong,
                "chat_template_kwargs": dict(cfg.chat_template_kwargs)}
    stream = tokenised_rows(source, report, tokenizer, settings, cfg.strict, cfg.tokenize_workers)
    try:
        for row in stream:
            if isinstance(row.outcome, RowRejected):
                report.reject(row.line, row.outcome.reason, row.outcome.detail)
                continue
            ids, mask, truncated = row.outcome
            if truncated:
                report.truncated.append(row.line)
            sink.add(ids, mask, row.line, row.prompt)
            rows.add(len(ids))
            report.rows_kept += 1
            if cfg.max_rows is not None and rows.closed >= cfg.max_rows:
                stopped_at(report, row)  # rows the workers read ahead are not part of the data
                break  # the first max_rows training rows are whole: no later conversation changes them
    finally:
        stream.close()
    return report


class _Lists:
    """A sink that keeps the rows as lists (for `tokenize_rows`)."""

    def __init__(self):
        self.ids, self.masks, self.lines, self.prompts = [], [], [], []

    def add(self, ids, mask, line: int, prompt: int) -> None:
        self.ids.append(list(ids))
        self.masks.append(list(mask))
        self.lines.append(line)
        self.prompts.append(prompt)


def tokenize_rows(source: Any, tokenizer: Any, cfg: DataConfig) -> tuple[Documents, RejectReport]:
    """Every row of `source` tokenised into memory, with the report: for small row sets and tests
    (`prepare_dataset` streams into the token file instead)."""
    sink = _Lists()
    report = stream_rows(sink, source, tokenizer, cfg)
    return Documents.from_lists(sink.ids, sink.masks, sink.lines, sink.prompts), report


class RowCounter:
    """How many training rows the conversations so far make whole (pack_documents' rule, step by step):
    data.max_rows counts those rows, after the rows set aside and after packing. Packed, a row is whole
    once a conversation has begun the next one (which TokenizedDataset then leaves out)."""

    def __init__(self, seq_length: int, packing: bool):
        self.seq_length, self.packing, self.closed, self.used = seq_length, packing, 0, 0

    def add(self, length: int) -> None:
        if not self.packing:
            self.closed += 1
            return
        if self.used and self.used + length > self.seq_length:
            self.closed += 1
            self.used = 0
        self.used += length


def _as_source(path_or_rows: Any) -> Any:
    """Paths and datasets as given; other row collections as a list, so they can be hashed."""
    if isinstance(path_or_rows, (str, Path)) or _is_hf_dataset(path_or_rows):
        return path_or_rows
    if isinstance(path_or_rows, Mapping):
        raise DataError(
            f"prepare_dataset got a mapping with keys {sorted(path_or_rows)[:5]}, not rows; "
            "pass one split (e.g. dataset_dict['train']) or a list of rows"
        )
    return list(path_or_rows)


def _is_hf_dataset(value: Any) -> bool:
    return type(value).__module__.startswith("datasets.") and hasattr(value, "_fingerprint")


def cache_key(source: Any, tokenizer: Any, cfg: DataConfig) -> str:
    """Hash of everything that changes the tokenised result: rows, tokenizer and settings."""
    parts = {
        "format": CACHE_FORMAT,
        "rows": source_fingerprint(source),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "seq_length": cfg.seq_length,
        "overlong": cfg.overlong,
        "strict": cfg.strict,
        "max_rows": cfg.max_rows,
        "packing": cfg.packing if cfg.max_rows is not None else None,  # where reading stops depends on it then
        "chat_template_kwargs": dict(cfg.chat_template_kwargs),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def source_fingerprint(source: Any) -> str:
    """Content hash of a file or folder; the fingerprint of a `datasets.Dataset` (a hub id's too);
    else the rows' JSON."""
    digest = hashlib.sha256()
    if isinstance(source, (str, Path)) and not Path(source).expanduser().exists():
        parsed = parsed_source(source)  # a hub id: its cached dataset's fingerprint
        digest.update(f"{parsed.spec}\n{load_rows(parsed)._fingerprint}".encode())
    elif isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if path.is_dir():
                digest.update(str(file.relative_to(path)).encode())
            _hash_file(file, digest)
    elif _is_hf_dataset(source):
        digest.update(source._fingerprint.encode())
    else:
        digest.update(json.dumps(source, sort_keys=True, default=repr).encode())
    return digest.hexdigest()


def _hash_file(path: Path, digest: Any) -> None:
    if not path.exists():
        raise DataError(f"data file {path} does not exist; check data.train / data.val")
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of the tokenizer's full definition (vocabulary, merges, added tokens) and chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = backend.to_str()
    else:
        definition = json.dumps(sorted(tokenizer.get_vocab().items()))
    template = getattr(tokenizer, "chat_template", None)
    payload = json.dumps({"definition": definition, "template": template}, sort_keys=True, default=repr)
    return hashlib.sha256(payload.encode()).hexdigest()

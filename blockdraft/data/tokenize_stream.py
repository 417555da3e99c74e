"""Rows of a source tokenised by several processes, given back one at a time in the source's order.

Only a bounded window of rows is ever held: the reader hands out chunks of `CHUNK_ROWS` rows, at most
two per worker are in flight, and each result is given back (and written) before more is read. Rows
are read and checked here (their account goes to the report as they are read); the chat template and
the tokenizer, the costly part, run in the workers. A source of one chunk is tokenised in this
process: starting workers would take longer than the rows.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Union

import numpy as np

from blockdraft.data.prompt_record import prompt_hash
from blockdraft.data.rows import ChatRow, RejectReport, iter_rows
from blockdraft.data.tokenize import RowRejected, tokenize_row
from blockdraft.errors import DataError

CHUNK_ROWS = 256
IN_FLIGHT_PER_WORKER = 2


@dataclass(frozen=True)
class Tokenised:
    """One row's outcome: its ids, mask and prompt, or why it was set aside."""

    line: int
    read: int  # the report's rows_read once this row was read (where a stop at this row leaves it)
    outcome: Union[tuple, RowRejected]  # (ids int32 array, loss mask bool array, truncated)
    prompt: int = 0


def default_workers() -> int:
    """min(8, the CPUs this process may run on): tokenising beyond that waits on reading rows."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def tokenised_rows(source: Any, report: RejectReport, tokenizer: Any, settings: dict, strict: bool,
                   workers: Optional[int]) -> Iterator[Tokenised]:
    """Every row of `source`, tokenised, in order. `settings`: seq_length, overlong, chat_template_kwargs."""
    chunks = _read_chunks(source, report, strict)
    first = next(chunks, None)
    second = next(chunks, None) if first is not None and first[1] is None else None
    workers = default_workers() if workers is None else workers
    if second is None or workers <= 1:
        _set_worker_state(tokenizer, settings)
        for rows, error in _chained(first, second, chunks):
            yield from _tokenise_chunk(rows)
            if error is not None:
                raise error
        return
    yield from _in_workers(_chained(first, second, chunks), tokenizer, settings, workers)


def _in_workers(chunks, tokenizer: Any, settings: dict, workers: int) -> Iterator[Tokenised]:
    # Spawned, never forked: the process tokenising is a trainer or a test that already runs threads (torch's,
    # gloo's, the tokenizer's own), and a forked child can wait forever on a lock one of them held at the fork
    # (seen: a pool worker stuck on a futex in a long test run). The tokenizer is pickled to each worker once.
    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_set_worker_state,
                                                     initargs=(tokenizer, settings))
    pending: deque = deque()
    try:
        for rows, error in chunks:
            pending.append((pool.apply_async(_tokenise_chunk, (rows,)), error))
            while len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                yield from _collect(pending.popleft())
        while pending:
            yield from _collect(pending.popleft())
    finally:
        pool.terminate()  # also when the reader stops early (data.max_rows) or a row raises
        pool.join()


def _collect(entry) -> Iterator[Tokenised]:
    result, error = entry
    yield from result.get()
    if error is not None:
        raise error


def _chained(first, second, rest):
    for chunk in (first, second):
        if chunk is not None:
            yield chunk
    yield from rest


def _read_chunks(source: Any, report: RejectReport, strict: bool):
    """(rows, error) chunks: an error reading (data.strict) is raised once the rows before it are given back."""
    rows = iter_rows(source, report, strict=strict)
    while True:
        chunk, error = [], None
        try:
            for row in rows:
                chunk.append((row, report.rows_read))
                if len(chunk) == CHUNK_ROWS:
                    break
        except DataError as e:
            error = e
        if chunk or error is not None:
            yield chunk, error
        if error is not None or len(chunk) < CHUNK_ROWS:
            return


# What a worker tokenises with: set once per process (the pool's initializer), not sent with every chunk.
_STATE: dict = {}


def _set_worker_state(tokenizer: Any, settings: dict) -> None:
    _STATE.update(tokenizer=tokenizer, **settings)


def _tokenise_chunk(rows: list[tuple[ChatRow, int]]) -> list[Tokenised]:
    out = []
    for row, read in rows:
        result = tokenize_row(row.messages, _STATE["tokenizer"], _STATE["seq_length"], _STATE["overlong"],
                              _STATE["chat_template_kwargs"])
        if isinstance(result, RowRejected):
            out.append(Tokenised(row.line, read, result))
            continue
        arrays = (np.asarray(result.input_ids, dtype=np.int32), np.asarray(result.loss_mask, dtype=np.bool_))
        out.append(Tokenised(row.line, read, (*arrays, result.truncated), prompt_hash(row.messages)))
    return out


def stopped_at(report: RejectReport, stop: Tokenised) -> None:
    """The report as if reading had stopped right after row `stop` (data.max_rows reached): rows read ahead
    of it, for the workers, are not part of the data."""
    report.rows_read = stop.read
    for reason in list(report.rejected):
        kept = [line for line in report.rejected[reason] if line <= stop.line]
        if kept:
            report.rejected[reason] = kept
        else:
            del report.rejected[reason]
            report.first_detail.pop(reason, None)

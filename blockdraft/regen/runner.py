"""Answer every prompt not yet written, on every answerer at once, writing rows as they finish.

Each answerer (a server) has `in_flight` worker threads; each takes the next prompt from one shared queue
(blockdraft/regen/work_queue.py) when its last one is done, so a fast server answers more and a slow one
holds back no one. One writer, this thread, appends every row and reject: no two threads write a file.

A failed request goes back on the queue after a backoff and is tried again, on whichever server is free,
up to `retries` times; then its prompt is recorded as a reject with the reason and the run goes on. A
request that got no answer asks whether its server is still there: a server that is not gets no more
prompts, and its prompts go back on the queue for the others. With every server gone the run stops,
keeping every row written, and says to rerun.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from tqdm import tqdm

from blockdraft.regen.answerers import Answerer
from blockdraft.regen.shards import RejectLog, ShardedRows
from blockdraft.regen.turns import Reply, regen_row, rollout, turn_inputs
from blockdraft.regen.vllm_backend import RegenRequestError
from blockdraft.regen.work_queue import Task, WorkQueue


class ServersGone(RegenRequestError):
    """Every answerer stopped answering before the prompts ran out."""


@dataclass
class RegenStats:
    rows: int = 0
    replies: int = 0
    tokens: int = 0
    cut_at_max_tokens: int = 0
    seconds: float = 0.0
    rejects: int = 0
    failed_requests: int = 0
    by_server: Dict[str, dict] = field(default_factory=dict)  # name -> rows, tokens, failed_requests
    gone: Dict[str, str] = field(default_factory=dict)  # name -> why it got no more prompts

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Answered:
    index: int
    conversation: List[dict]
    replies: List[Reply]
    answerer: Answerer


@dataclass
class _Rejected:
    index: int
    reason: str
    attempts: int
    answerer: Answerer


@dataclass
class _Failed:  # a failed request (tried again, or rejected: a _Rejected follows)
    answerer: Answerer
    reason: str
    gone: bool = False  # its server stopped answering


@dataclass
class _Crashed:  # not a request failure: a fault of this program, which stops the run
    error: BaseException


_ENDED = object()  # a worker's last word


def regenerate_rows(prompts: Sequence[Sequence[dict]], store: ShardedRows, answerers: List[Answerer], settings: dict,
                    max_turns: int = 1, retries: int = 3, backoff_s: float = 2.0, desc: str = "regenerate",
                    progress: bool = True, rejects: Optional[RejectLog] = None) -> RegenStats:
    """Answer every prompt not yet in `store`; returns what this run did. Raises ServersGone when every
    answerer went away first (rows written so far stay; a rerun resumes)."""
    done = store.done() & set(range(len(prompts)))  # rows of a once larger split are not this split's
    todo = len(prompts) - len(done)
    run = _Run(prompts, answerers, max_turns, retries, backoff_s, (i for i in range(len(prompts)) if i not in done), todo)
    stats = RegenStats(by_server={a.name: {"rows": 0, "tokens": 0, "failed_requests": 0} for a in answerers})
    began = time.perf_counter()
    bar = tqdm(total=len(prompts), initial=len(done), desc=desc, disable=not progress, unit="row")
    finished = 0  # prompts answered or rejected
    try:
        for outcome in run.outcomes():
            if _record(outcome, store, rejects, settings, stats):
                finished += 1
                bar.update(1)
                bar.set_postfix(tok_s=f"{stats.tokens / max(time.perf_counter() - began, 1e-9):.0f}")
    finally:
        run.work.close()  # on Ctrl-C or a crash too: the workers take nothing more
        bar.close()
        stats.seconds = time.perf_counter() - began
    if finished < todo:
        gone = "; ".join(f"{name}: {why}" for name, why in stats.gone.items())
        raise ServersGone(f"every server stopped answering ({gone}); the {len(done) + stats.rows} rows answered are kept "
                          f"in {store.directory}: rerun to resume with the {todo - finished} prompts left")
    return stats


def _record(outcome, store: ShardedRows, rejects: Optional[RejectLog], settings: dict, stats: RegenStats) -> bool:
    """Write or count one outcome (this thread is the only writer); True when a prompt is finished."""
    if isinstance(outcome, _Crashed):
        raise outcome.error
    server = stats.by_server[outcome.answerer.name]
    if isinstance(outcome, _Failed):
        stats.failed_requests += 1
        server["failed_requests"] += 1
        if outcome.gone:
            stats.gone[outcome.answerer.name] = outcome.reason
            print(f"\n[regen] {outcome.answerer.name} stopped answering ({outcome.reason}); its prompts go to the other "
                  "servers", file=sys.stderr, flush=True)
        elif stats.failed_requests == 1:
            print(f"\n[regen] a request failed ({outcome.reason}); each is tried again as retries= says, and regen.json "
                  "counts them", file=sys.stderr, flush=True)
        return False
    if isinstance(outcome, _Rejected):
        stats.rejects += 1
        if rejects is not None:
            rejects.append(outcome.index, outcome.reason, outcome.attempts, outcome.answerer.name)
        return True
    replies = outcome.replies
    if replies:
        store.append(regen_row(outcome.conversation, settings, outcome.index, replies, outcome.answerer.served_by()))
        stats.rows += 1
        server["rows"] += 1
    stats.replies += len(replies)
    tokens = sum(r.tokens for r in replies)
    stats.tokens += tokens
    server["tokens"] += tokens
    stats.cut_at_max_tokens += sum(r.finish_reason == "length" for r in replies)
    return True


class _Run:
    """The worker threads of one call and the outcomes they hand the writer."""

    def __init__(self, prompts, answerers: List[Answerer], max_turns: int, retries: int, backoff_s: float, indices,
                 todo: int):
        self.prompts, self.max_turns, self.retries, self.backoff_s = prompts, max_turns, retries, backoff_s
        self.work = WorkQueue(indices)
        self.results: "queue.Queue" = queue.Queue()
        self.gone = {a.name: threading.Event() for a in answerers}
        self.asking = {a.name: threading.Lock() for a in answerers}  # one "still there?" per server at a time
        # Daemons: a Ctrl-C must not wait for requests still in flight (their servers are stopped anyway).
        # No more threads per server than prompts left: a held-out split of 64 needs no 256 of them.
        self.threads = [threading.Thread(target=self._work, args=(a,), daemon=True, name=f"regen {a.name} {slot}")
                        for a in answerers for slot in range(min(a.in_flight, todo))]

    def outcomes(self):
        """Every outcome, until every worker has ended (each says so last)."""
        for thread in self.threads:
            thread.start()
        working = len(self.threads)
        while working:
            try:
                outcome = self.results.get(timeout=1.0)  # in slices: a Ctrl-C reaches this thread
            except queue.Empty:
                continue
            if outcome is _ENDED:
                working -= 1
            else:
                yield outcome

    def _work(self, answerer: Answerer) -> None:
        try:
            self._answer(answerer)
        finally:
            self.results.put(_ENDED)

    def _answer(self, answerer: Answerer) -> None:
        gone = self.gone[answerer.name]
        while not gone.is_set():
            task = self.work.take()
            if task is None:
                return
            if gone.is_set():  # went while this thread waited: the prompt is not its fault
                self.work.again(task)
                return
            try:
                conversation, replies = rollout(turn_inputs(self.prompts[task.index], self.max_turns), answerer.reply)
            except RegenRequestError as err:
                self._failed(answerer, task, err)
                continue
            except BaseException as err:  # noqa: BLE001 - a bug here: stop the run rather than reject every prompt
                self.results.put(_Crashed(err))
                self.work.close()
                return
            self.results.put(_Answered(task.index, conversation, replies, answerer))
            self.work.done(task)

    def _failed(self, answerer: Answerer, task: Task, err: RegenRequestError) -> None:
        gone = self.gone[answerer.name]
        went = False
        if err.unreachable:
            with self.asking[answerer.name]:
                if not gone.is_set() and not answerer.still_there():
                    went = True
                    gone.set()
        self.results.put(_Failed(answerer, str(err), went))
        # Every failure counts against the prompt, its server's death included: a prompt that kills servers
        # takes down at most retries + 1 of them.
        attempts = task.attempts + 1
        if not err.retryable or attempts > self.retries:
            self.results.put(_Rejected(task.index, str(err), attempts, answerer))
            self.work.done(task)
        else:
            self.work.again(Task(task.index, attempts), 0.0 if gone.is_set() else self.backoff_s * 2 ** (attempts - 1))

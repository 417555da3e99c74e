"""The prompts still to answer, shared by every server: whichever is free takes the next one.

Prompt indices are drawn from their iterator only when a server asks, so a run of a million prompts
holds the requests in flight, not a million queued futures. A failed prompt comes back after its
backoff, ahead of fresh ones once due.
"""

from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple


@dataclass(frozen=True)
class Task:
    index: int  # the prompt's index within its split
    attempts: int = 0  # requests of it that failed so far


class WorkQueue:
    """`take()` the next task (None once nothing is left or the queue is closed); then exactly one of
    `done(task)` (answered or rejected) or `again(task, delay_s)` (back in the queue)."""

    def __init__(self, indices: Iterable[int]):
        self._fresh = iter(indices)
        self._due: List[Tuple[float, int, Task]] = []  # (due at, tie-break, task): retries waiting their backoff
        self._order = 0
        self._taken = 0  # tasks out with a server, not yet done or back
        self._closed = False
        self._fresh_left = True
        self._cond = threading.Condition()

    def take(self) -> Optional[Task]:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                if self._due and self._due[0][0] <= now:
                    return self._hand_out(heapq.heappop(self._due)[2])
                if self._fresh_left:
                    index = next(self._fresh, None)
                    if index is not None:
                        return self._hand_out(Task(index))
                    self._fresh_left = False
                if not self._due and not self._taken:
                    return None  # nothing left, and nothing out that could come back
                # Wait for a retry to fall due, or for a task out to come back (or finish).
                self._cond.wait(self._due[0][0] - now if self._due else None)
            return None

    def done(self, task: Task) -> None:
        with self._cond:
            self._taken -= 1
            self._cond.notify_all()

    def again(self, task: Task, delay_s: float = 0.0) -> None:
        with self._cond:
            self._taken -= 1
            self._order += 1
            heapq.heappush(self._due, (time.monotonic() + delay_s, self._order, task))
            self._cond.notify_all()

    def close(self) -> None:
        """No more tasks for anyone: the run is stopping."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _hand_out(self, task: Task) -> Task:
        self._taken += 1
        return task

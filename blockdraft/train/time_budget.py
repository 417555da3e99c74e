"""train.max_minutes: a training budget in minutes, as Lightning's `Trainer(max_time=...)`.

The budget counts the loop's own wall time (not the set-up before it), summed over resumes: the
time spent so far is saved in each checkpoint's trainer state, so a run stopped and continued
stops where an uninterrupted one would. Once the budget is spent the run stops at its next
checkpoint step (train.save_every; at once when it saves only at the end), validates and saves
as at max_steps, and records why it stopped.
"""

from __future__ import annotations

import time
from typing import Optional


class TimeBudget:
    def __init__(self, max_minutes: Optional[float], spent_before_s: float = 0.0):
        self.limit_s = None if max_minutes is None else float(max_minutes) * 60.0
        self.spent_before_s = spent_before_s
        self._began: Optional[float] = None

    def start(self) -> None:
        self._began = time.perf_counter()

    @property
    def spent_s(self) -> float:
        return self.spent_before_s + (time.perf_counter() - self._began if self._began is not None else 0.0)

    def exhausted(self) -> bool:
        return self.limit_s is not None and self.spent_s >= self.limit_s

    def stop_reason(self, step: int, max_steps: int) -> str:
        return (f"train.max_minutes={self.limit_s / 60:g} spent ({self.spent_s / 60:.2f} min of training) at step "
                f"{step} of train.max_steps={max_steps}")

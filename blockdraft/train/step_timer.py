"""How long a span of a step's work took on its device, measured without waiting for the device.

CUDA work runs after the call that launched it has returned: the host clock read then times the launch,
and waiting for the device before reading it (torch.cuda.synchronize) stalls the host, which stops queueing
the next work meanwhile. A CUDA event recorded in the stream marks the moment the device gets there; two of
them give the device's time between, read once the second has passed, at the end of the step, where the
step waits for its results anyway. On a CPU the work is done when its call returns: the host clock times it.
Both go through `Span`, so the CPU's tests run the code the GPU runs.
"""

from __future__ import annotations

import time
from typing import Dict, Iterable, Optional, Tuple

import torch


class Span:
    """From `Span(device)` to `.stop()`; `.seconds()` is the device's time between (it waits, on a GPU, for the
    device to reach the stop)."""

    def __init__(self, device: torch.device):
        self._device = torch.device(device)
        self._start = self._mark()
        self._stop = None

    def _mark(self):
        if self._device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))  # where the step's work is queued
        return event

    def stop(self) -> "Span":
        self._stop = self._mark()
        return self

    def seconds(self) -> float:
        if self._stop is None:
            raise RuntimeError("a Span is read before it was stopped; this is a bug in blockdraft")
        if self._device.type != "cuda":
            return self._stop - self._start
        self._stop.synchronize()
        return self._start.elapsed_time(self._stop) / 1000.0  # milliseconds


def step_times(micro_steps: Iterable[Tuple[Span, Optional[Span]]]) -> Dict[str, torch.Tensor]:
    """The step's time_target_s and time_draft_s (sums over its micro-steps) from each micro-step's whole span and
    its target's share of it (None: no target pass). The draft's share is the rest: its forward and backward."""
    whole = target = 0.0
    for step, target_span in micro_steps:
        whole += step.seconds()
        target += target_span.seconds() if target_span is not None else 0.0
    return {"time_target_s": torch.tensor(target), "time_draft_s": torch.tensor(whole - target)}

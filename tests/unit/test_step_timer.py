"""The step's time shares (train/step_timer.py): a span covers the work between its start and its stop, and a step's
time_target_s and time_draft_s are its micro-steps' target shares and the rest of them."""

import time

import pytest
import torch

from blockdraft.train.step_timer import Span, step_times


class Fixed:
    def __init__(self, seconds):
        self.value = seconds

    def seconds(self):
        return self.value


def test_a_step_splits_its_micro_steps_into_the_targets_share_and_the_drafts():
    times = step_times([(Fixed(0.5), Fixed(0.2)), (Fixed(0.25), Fixed(0.05)), (Fixed(0.125), None)])
    assert times["time_target_s"].item() == pytest.approx(0.25)
    assert times["time_draft_s"].item() == pytest.approx(0.875 - 0.25)


def test_a_span_on_the_cpu_covers_the_work_between_its_start_and_stop():
    before = time.perf_counter()
    span = Span(torch.device("cpu"))
    time.sleep(0.02)
    stopped = span.stop()
    after = time.perf_counter()
    time.sleep(0.02)  # after the stop: not counted
    assert stopped is span and 0.02 <= span.seconds() <= after - before


def test_a_span_read_before_its_stop_is_refused():
    with pytest.raises(RuntimeError, match="before it was stopped"):
        Span(torch.device("cpu")).seconds()

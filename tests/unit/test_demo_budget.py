"""The demo's preset on every CPU class it was measured on: its stages and probe fit 30 minutes, training
takes at least 35% of them and measuring (probe + serve) at most 35%, by the arithmetic of each class's
measured throughputs (blockdraft/demo_budget.py)."""

import pytest

from blockdraft import demo
from blockdraft.demo_budget import BUDGET_S, MAX_MEASURE_SHARE, MEASURED, MIN_TRAIN_SHARE, shares, stage_seconds, step_seconds


@pytest.mark.parametrize("cpu", sorted(MEASURED))
def test_the_preset_fits_the_budget_with_its_shares_on_every_cpu_class(cpu):
    seconds = stage_seconds(demo.SIZES[cpu], MEASURED[cpu])
    split = shares(seconds)
    assert split["total_s"] <= BUDGET_S, seconds
    assert split["train"] >= MIN_TRAIN_SHARE, seconds
    assert split["measure"] <= MAX_MEASURE_SHARE, seconds


@pytest.mark.parametrize("cpu", sorted(MEASURED))
def test_the_steps_are_what_the_minutes_buy_so_the_schedule_runs_its_course(cpu):
    size, speed = demo.SIZES[cpu], MEASURED[cpu]
    assert size["steps"] * step_seconds(size, speed) == pytest.approx(size["minutes"] * 60, rel=0.02)


def test_the_old_one_minute_size_fails_the_shares_on_the_slowest_class():
    # The check can fail: one minute of training on 100 rows left training 4% of the stages there.
    old = {"rows": 100, "minutes": 1.0, "steps": 285, "serve_prompts": 16, "warmup_prompts": 2}
    assert shares(stage_seconds(old, MEASURED["other"]))["train"] < MIN_TRAIN_SHARE


def test_each_cpu_class_gets_its_size_and_served_prompts():
    words = demo.preset({"amx": False, "avx512_bf16": False, "cpu_model": "x"})
    assert "regen.num_train=200" in words and "serve.num_prompts=6" in words and "train.max_minutes=10.8" in words
    assert "serve.rounds=1" in words
    # Soft labels where training passes over few rows many times; not where it was not measured to pay.
    assert "train.kl_weight=1.0" in words
    fast = demo.preset({"amx": True, "avx512_bf16": True, "cpu_model": "x"})
    assert "train.kl_weight=1.0" not in fast
    # One drafted token a round where a round's cost grows with the tokens verified; the trained block elsewhere.
    assert "serve.num_speculative_tokens=1" in words
    assert not any(w.startswith("serve.num_speculative_tokens=") for w in fast)


def test_soft_labels_cost_their_capture_and_steps_in_the_budget():
    size = dict(demo.SIZES["other"])
    with_labels = stage_seconds(size, MEASURED["other"])
    without = stage_seconds({**size, "soft_labels": False}, MEASURED["other"])
    assert with_labels["capture"] > without["capture"]
    assert step_seconds(size, MEASURED["other"]) > step_seconds({**size, "soft_labels": False}, MEASURED["other"])

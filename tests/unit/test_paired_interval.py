"""The paired interval over prompts: what a speedup and a round cost read from a few prompts can claim."""

import pytest

from blockdraft.serve.paired_interval import PromptPair, interval, round_cost, speedup


def pairs_of(ratios, tokens=100, base_s=10.0, drafts=50):
    """Prompts whose draft side is `ratio` times as fast as the baseline."""
    return [PromptPair(tokens, base_s, tokens, base_s / r, drafts) for r in ratios]


def test_the_point_figures_pool_tokens_and_seconds_over_prompts():
    pairs = [PromptPair(100, 10.0, 100, 5.0, 50), PromptPair(300, 30.0, 300, 30.0, 300)]
    assert speedup(pairs) == pytest.approx((400 / 35.0) / (400 / 40.0))
    # 35 s over 350 drafting rounds, against 40 s over 400 plain tokens: a round costs one step.
    assert round_cost(pairs) == pytest.approx(1.0)


def test_prompts_that_agree_give_a_narrow_interval_and_prompts_that_differ_a_wide_one():
    steady = interval(pairs_of([1.40, 1.41, 1.39, 1.40, 1.42, 1.38, 1.40, 1.41]), speedup)
    mixed = interval(pairs_of([0.9, 1.9, 1.1, 1.7, 1.0, 1.8, 1.2, 1.6]), speedup)
    assert steady[0] <= 1.40 <= steady[1] and steady[1] - steady[0] < 0.03
    assert mixed[1] - mixed[0] > 0.2 and mixed[0] < 1.4 < mixed[1]


def test_too_few_pairs_or_no_drafting_counts_give_no_interval():
    assert interval(pairs_of([1.4, 1.5, 1.3]), speedup) is None
    counted_per_phase = [PromptPair(100, 10.0, 100, 8.0, None) for _ in range(8)]
    assert interval(counted_per_phase, round_cost) is None


def test_the_interval_is_seeded():
    pairs = pairs_of([0.9, 1.9, 1.1, 1.7, 1.0, 1.8, 1.2, 1.6])
    assert interval(pairs, speedup) == interval(pairs, speedup)

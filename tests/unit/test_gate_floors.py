"""The gate's ceilings, what a perfect draft reaches on its sample, against counts that share no code
with them: training's own anchors, blocks and accept_len run on a draft that predicts every label, and
every schedule of accepted tokens a reply allows in serving."""

import itertools
from functools import lru_cache

import pytest
import torch

from blockdraft.gate.floors import drafted_tokens, serving_ceiling, training_ceiling
from blockdraft.train.anchors import build_blocks, sample_anchors, valid_anchor_mask
from blockdraft.train.metrics import accept_length


def perfect_accept_len(loss_mask, block_size):
    """Training's accept_len for a draft that predicts every label: training's code, every valid anchor drawn."""
    t = len(loss_mask)
    mask = torch.tensor([[bool(m) for m in loss_mask]])
    ids = torch.arange(100, 100 + t)[None]
    docs, real = torch.zeros(1, t, dtype=torch.long), torch.ones(1, t, dtype=torch.bool)
    valid = valid_anchor_mask(mask, real, docs, block_size)
    anchors, anchor_valid = sample_anchors(valid, t, torch.Generator().manual_seed(0))
    blocks = build_blocks(ids, torch.arange(t)[None], mask, docs, anchors, anchor_valid,
                          torch.ones_like(anchors), block_size, mask_token_id=1)
    total, count = accept_length(blocks.labels, blocks.labels, blocks.label_mask, blocks.prefix_len)
    return float(total) / int(count) if int(count) else None


MASKS = [
    [0] * 5 + [1] * 27,  # a 26-token reply and its end-of-turn token after a prompt
    [0] * 3 + [1] * 49,
    [0] * 4 + [1] * 3,
    [0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 1],  # two turns
    [0, 0, 1, 0, 1],  # no anchor has a loss token after it
]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_the_training_ceiling_is_what_training_measures_for_a_perfect_draft(mask, block_size):
    assert training_ceiling([bool(m) for m in mask], block_size - 1) == pytest.approx(perfect_accept_len(mask, block_size))


def test_random_loss_masks_agree_too():
    gen = torch.Generator().manual_seed(1)
    for _ in range(40):
        t = int(torch.randint(2, 40, (1,), generator=gen))
        mask = (torch.rand(t, generator=gen) < 0.7).tolist()
        block = int(torch.randint(2, 18, (1,), generator=gen))
        assert training_ceiling(mask, block - 1) == pytest.approx(perfect_accept_len(mask, block)), (mask, block)


def test_the_case_a_block_size_floor_failed():
    # The tiny target's 26-token reply at block 16: training reached 11.96 and vLLM 13.0, a perfect draft's
    # values; 0.9 x 16 = 14.4 is out of reach of either.
    assert training_ceiling([False] * 5 + [True] * 27, 15) == pytest.approx(11.96, abs=0.005)
    assert serving_ceiling(26, 15) == 13.0
    assert training_ceiling([False] * 5 + [True] * 49, 15) < 0.9 * 16  # the default max_tokens=48 at block 16


@lru_cache(maxsize=None)
def best_schedule(done: int, reply: int, drafted: int):
    """Every way serving can produce the rest of a `reply`-token reply from `done` tokens: the
    (rounds, accepted) pairs of each. A round accepts a of the drafted tokens (never past the reply's
    end) and the target adds one more, unless the accepted ones reached the end."""
    if done == reply:
        return {(0, 0)}
    out = set()
    for a in range(0, min(drafted, reply - done) + 1):
        after = done + a if done + a == reply else done + a + 1
        out |= {(rounds + 1, accepted + a) for rounds, accepted in best_schedule(after, reply, drafted)}
    return out


@pytest.mark.parametrize("reply,drafted", list(itertools.product(range(1, 40), [1, 3, 7, 15])))
def test_the_serving_ceiling_is_the_best_schedule_a_reply_allows(reply, drafted):
    schedules = best_schedule(1, reply, drafted)  # the first token comes with the prompt's forward pass
    best = max((1 + accepted / rounds for rounds, accepted in schedules if rounds), default=None)
    assert serving_ceiling(reply, drafted) == (None if best is None else pytest.approx(best))


def test_the_drafted_tokens_follow_the_kind():
    from blockdraft.models.resolve import DraftConfig

    assert drafted_tokens(DraftConfig(block_size=16)) == 15
    assert drafted_tokens(DraftConfig(kind="dspark", block_size=8)) == 8
    assert drafted_tokens(DraftConfig(kind="dspark", block_size=8, sample_from_anchor=False)) == 7

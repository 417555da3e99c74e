"""The walk of a reply as serving takes it, against the uniform mean over anchors."""

import pytest
import torch

from blockdraft.train.metrics import accept_length, walked_accept_length, walked_calibration


def blocks_of(correct_runs, block_size=4, first_anchor=5):
    """One row whose anchor first_anchor + i has its first correct_runs[i] drafted slots right."""
    a = len(correct_runs)
    labels = torch.arange(a * block_size).view(1, a, block_size) + 100
    pred = labels.clone()
    for i, run in enumerate(correct_runs):
        pred[0, i, 1 + run:] = -1  # slot 1 + run is the first wrong one
    mask = torch.ones(1, a, block_size, dtype=torch.bool)
    mask[..., 0] = False  # slot 0 shows the anchor
    anchors = torch.arange(a).view(1, a) + first_anchor
    return pred, labels, mask, anchors, torch.ones(1, a, dtype=torch.bool)


def test_the_walk_takes_the_next_round_where_the_last_one_ended():
    # Anchors 5..12. From 5: 3 right (L 4) -> 9: 0 right (L 1) -> 10: 1 right (L 2) -> 12: 3 right -> 16: none drawn.
    pred, labels, mask, anchors, valid = blocks_of([3, 0, 0, 2, 0, 1, 3, 3])
    tokens, rounds, per_slot = walked_accept_length(pred, labels, mask, anchors, valid)
    assert (tokens, rounds, per_slot) == (4 + 1 + 2 + 4, 4, [3, 2, 2])
    uniform_sum, blocks = accept_length(pred, labels, mask, torch.ones(1, 8, dtype=torch.long))
    assert uniform_sum.item() / blocks.item() == (4 + 1 + 1 + 3 + 1 + 2 + 4 + 4) / 8


def test_rows_walk_apart_and_invalid_anchors_end_a_walk():
    pred, labels, mask, anchors, valid = blocks_of([1, 0, 2, 0])
    valid[0, 2] = False  # anchor 7 was not drawn: the walk 5 -> 7 stops there
    two = [torch.cat([t, t]) for t in (pred, labels, mask, anchors, valid)]
    tokens, rounds, per_slot = walked_accept_length(*two)
    assert (tokens, rounds, per_slot) == (4, 2, [2, 0, 0])


def test_calibration_counts_the_slots_each_walked_round_reached():
    # The walk of the first test: rounds at anchors 5 (L 4), 9 (L 1), 10 (L 2), 12 (L 4).
    pred, labels, mask, anchors, valid = blocks_of([3, 0, 0, 2, 0, 1, 3, 3])
    confidence = torch.full(pred.shape, 0.5)
    confidence[0, 0, 1:] = torch.tensor([0.9, 0.8, 0.7])  # the first round's slots
    reached, accepted, predicted = walked_calibration(pred, labels, mask, anchors, valid, confidence)
    # Slot 1: all 4 rounds reach it, 3 accept it; slot 2: the rounds at 5, 10 (its slot 1 right), 12.
    assert reached == [4, 3, 2] and accepted == [3, 2, 2]
    assert predicted == pytest.approx([0.9 + 0.5 * 3, 0.8 + 0.5 * 2, 0.7 + 0.5])

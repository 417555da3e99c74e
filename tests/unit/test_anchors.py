"""Anchors and block layout against naive per-position loops."""

import pytest
import torch

from blockdraft.errors import ConfigError
from blockdraft.train.anchors import (
    build_blocks,
    sample_anchors,
    sample_prefix_lengths,
    valid_anchor_mask,
)

B = 4
MASK_ID = 99


def packed_batch(seed: int = 0):
    """Two rows: row 0 packs docs of 9 and 11 tokens; row 1 docs of 7 and 6, then pad."""
    g = torch.Generator().manual_seed(seed)
    n, t = 2, 20
    input_ids = torch.randint(0, 50, (n, t), generator=g)
    doc = torch.tensor([[0] * 9 + [1] * 11, [0] * 7 + [1] * 6 + [-1] * 7])  # [N, T]
    attention_mask = doc >= 0
    loss_mask = (torch.rand(n, t, generator=g) > 0.3) & attention_mask
    position_ids = torch.zeros(n, t, dtype=torch.long)
    for row in range(n):
        for i in range(t):
            same = i > 0 and doc[row, i] == doc[row, i - 1]
            position_ids[row, i] = position_ids[row, i - 1] + 1 if same else 0
    return dict(
        input_ids=input_ids, loss_mask=loss_mask, attention_mask=attention_mask,
        position_ids=position_ids, document_ids=doc,
    )


def naive_valid(batch, block_size):
    """An anchor is a loss token followed by a loss token of its own document."""
    n, t = batch["input_ids"].shape
    out = torch.zeros(n, t, dtype=torch.bool)
    for row in range(n):
        for a in range(t - 1):
            out[row, a] = bool(
                batch["loss_mask"][row, a] and batch["loss_mask"][row, a + 1]
                and batch["attention_mask"][row, a + 1]
                and batch["document_ids"][row, a + 1] == batch["document_ids"][row, a]
            )
    return out


@pytest.mark.parametrize("block_size", [2, 4, 7])
def test_valid_anchor_mask_matches_naive_rule(block_size):
    batch = packed_batch()
    valid = valid_anchor_mask(
        batch["loss_mask"], batch["attention_mask"], batch["document_ids"], block_size
    )
    assert torch.equal(valid, naive_valid(batch, block_size))


def test_block_size_below_two_is_a_config_error():
    batch = packed_batch()
    with pytest.raises(ConfigError, match="block_size"):
        valid_anchor_mask(batch["loss_mask"], batch["attention_mask"], batch["document_ids"], 1)


def test_anchors_only_on_valid_positions_and_their_first_slot_in_the_document():
    batch = packed_batch()
    valid = valid_anchor_mask(batch["loss_mask"], batch["attention_mask"], batch["document_ids"], B)
    for seed in range(20):
        anchors, anchor_valid = sample_anchors(valid, 4, torch.Generator().manual_seed(seed))
        for row in range(2):
            chosen = anchors[row][anchor_valid[row]].tolist()
            assert chosen == sorted(set(chosen))  # distinct and ascending
            doc = batch["document_ids"][row]
            for a in chosen:
                assert valid[row, a]
                assert a + 1 < 20 and doc[a + 1] == doc[a] and batch["loss_mask"][row, a + 1]
            # padding sits after the valid anchors, at position 0
            assert anchor_valid[row].tolist() == sorted(anchor_valid[row].tolist(), reverse=True)
            assert (anchors[row][~anchor_valid[row]] == 0).all()


def test_sample_anchors_pads_short_rows_and_more_anchors_than_tokens():
    valid = torch.zeros(2, 6, dtype=torch.bool)
    valid[0, [1, 4]] = True  # row 1 has no valid position at all
    anchors, anchor_valid = sample_anchors(valid, 8, torch.Generator().manual_seed(0))
    assert anchors.shape == anchor_valid.shape == (2, 8)
    assert anchors[0, :2].tolist() == [1, 4]
    assert anchor_valid[0].tolist() == [True] * 2 + [False] * 6
    assert not anchor_valid[1].any() and (anchors[1] == 0).all()


def test_sample_anchors_is_deterministic_for_a_generator():
    valid = torch.rand(3, 50, generator=torch.Generator().manual_seed(1)) > 0.5
    first = sample_anchors(valid, 5, torch.Generator().manual_seed(7))
    again = sample_anchors(valid, 5, torch.Generator().manual_seed(7))
    other = sample_anchors(valid, 5, torch.Generator().manual_seed(8))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])


def test_sample_anchors_is_uniform_over_valid_positions():
    valid = torch.zeros(4000, 8, dtype=torch.bool)
    valid[:, [0, 3, 5, 6]] = True  # each of 4000 rows draws 1 anchor among 4
    anchors, anchor_valid = sample_anchors(valid, 1, torch.Generator().manual_seed(0))
    assert anchor_valid.all()
    counts = torch.bincount(anchors[:, 0], minlength=8).float()
    assert counts[[1, 2, 4, 7]].sum() == 0
    assert torch.allclose(counts[[0, 3, 5, 6]] / 4000, torch.full((4,), 0.25), atol=0.03)


def test_prefix_lengths_plain_blocks_are_all_ones():
    anchor_valid = torch.tensor([[True, False, True]])
    lengths = sample_prefix_lengths(anchor_valid, B, "block", 0.5, torch.Generator())
    assert lengths.tolist() == [[1, 1, 1]] and lengths.dtype == torch.long


def test_variable_prefix_follows_the_truncated_geometric_prior():
    block_size, base = 5, 0.5
    anchor_valid = torch.ones(200, 50, dtype=torch.bool)
    anchor_valid[:, -1] = False
    lengths = sample_prefix_lengths(
        anchor_valid, block_size, "variable_prefix", base, torch.Generator().manual_seed(0)
    )
    assert (lengths[:, -1] == 1).all()  # invalid anchors: plain block
    drawn = lengths[:, :-1].flatten()
    assert drawn.min() >= 1 and drawn.max() <= block_size - 1
    prior = torch.tensor([base ** (l - 1) for l in range(1, block_size)])
    prior = prior / prior.sum()
    seen = torch.bincount(drawn, minlength=block_size)[1:].float() / drawn.numel()
    assert torch.allclose(seen, prior, atol=0.02)
    again = sample_prefix_lengths(
        anchor_valid, block_size, "variable_prefix", base, torch.Generator().manual_seed(0)
    )
    assert torch.equal(lengths, again)


def test_prefix_lengths_reject_bad_settings():
    anchor_valid = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ConfigError, match="loss_type"):
        sample_prefix_lengths(anchor_valid, B, "blocks", 0.5, None)
    with pytest.raises(ConfigError, match="prefix_weight_base"):
        sample_prefix_lengths(anchor_valid, B, "variable_prefix", 0.0, None)


def naive_blocks(batch, anchors, anchor_valid, prefix_len):
    """Slot by slot, straight from the conventions."""
    ids, pos, loss, doc = batch["input_ids"], batch["position_ids"], batch["loss_mask"], batch["document_ids"]
    n, t = ids.shape
    a_count = anchors.shape[1]
    out = {name: torch.zeros(n, a_count, B, dtype=torch.long)
           for name in ("block_ids", "block_pos", "labels", "pred", "offset")}
    out["label_mask"] = torch.zeros(n, a_count, B, dtype=torch.bool)
    for row in range(n):
        for j in range(a_count):
            a, ok, plen = int(anchors[row, j]), bool(anchor_valid[row, j]), int(prefix_len[row, j])
            for k in range(B):
                in_doc = a + k < t and doc[row, a + k] == doc[row, a]  # past the end: MASK, no label
                out["block_ids"][row, j, k] = ids[row, a + k] if k < plen and in_doc else MASK_ID
                out["block_pos"][row, j, k] = pos[row, a] + k
                out["offset"][row, j, k] = k - plen
                if ok and k >= 1 and in_doc:
                    out["labels"][row, j, k] = ids[row, a + k]
                    out["pred"][row, j, k] = ids[row, a + k - 1]
                    out["label_mask"][row, j, k] = k >= plen and bool(loss[row, a + k])
    return out


def test_build_blocks_matches_a_naive_loop():
    batch = packed_batch(seed=3)
    valid = valid_anchor_mask(batch["loss_mask"], batch["attention_mask"], batch["document_ids"], B)
    g = torch.Generator().manual_seed(0)
    anchors, anchor_valid = sample_anchors(valid, 5, g)
    assert anchor_valid.any() and not anchor_valid.all()  # covers padding blocks too
    prefix_len = sample_prefix_lengths(anchor_valid, B, "variable_prefix", 0.7, g)
    assert (prefix_len > 1).any()
    blocks = build_blocks(
        batch["input_ids"], batch["position_ids"], batch["loss_mask"], batch["document_ids"],
        anchors, anchor_valid, prefix_len, B, MASK_ID,
    )
    want = naive_blocks(batch, anchors, anchor_valid, prefix_len)
    n, a_count = anchors.shape
    assert torch.equal(blocks.block_ids, want["block_ids"].view(n, a_count * B))
    assert torch.equal(blocks.block_position_ids, want["block_pos"].view(n, a_count * B))
    assert torch.equal(blocks.labels, want["labels"])
    assert torch.equal(blocks.label_mask, want["label_mask"])
    assert torch.equal(blocks.predecessors, want["pred"])
    assert torch.equal(blocks.slot_weights_offset, want["offset"])
    assert blocks.label_mask.any()


def test_a_block_past_its_document_end_supervises_only_the_slots_inside_it():
    batch = packed_batch()
    batch["loss_mask"][:] = batch["attention_mask"]
    # Row 0: doc 0 is positions 0..8, doc 1 follows at 9. Anchor 7: slots 7, 8 in doc 0; 9, 10 in doc 1.
    anchors, anchor_valid = torch.tensor([[7], [11]]), torch.tensor([[True], [True]])
    assert valid_anchor_mask(batch["loss_mask"], batch["attention_mask"], batch["document_ids"], B)[0, 7]
    prefix_len = torch.tensor([[3], [1]])  # row 0 shows slots 1..2: slot 2 would be doc 1's token
    blocks = build_blocks(
        batch["input_ids"], batch["position_ids"], batch["loss_mask"], batch["document_ids"],
        anchors, anchor_valid, prefix_len, B, MASK_ID,
    )
    ids = batch["input_ids"]
    assert blocks.block_ids[0].tolist() == [int(ids[0, 7]), int(ids[0, 8]), MASK_ID, MASK_ID]
    assert not blocks.label_mask[0, 0].any()  # slots 3.. are past the end: nothing supervised
    # Row 1: doc 1 is positions 7..12, then padding. Anchor 11: slot 1 (12) inside, slots 2, 3 padding.
    assert blocks.label_mask[1, 0].tolist() == [False, True, False, False]
    assert blocks.labels[1, 0].tolist() == [0, int(ids[1, 12]), 0, 0]
    assert blocks.block_ids[1].tolist() == [int(ids[1, 11]), MASK_ID, MASK_ID, MASK_ID]


def test_build_blocks_clamps_gathers_of_invalid_anchors_near_the_end():
    batch = packed_batch()
    anchors = torch.tensor([[18, 2], [19, 0]])  # caller-built, would run past T
    anchor_valid = torch.tensor([[False, True], [False, False]])
    prefix_len = torch.ones(2, 2, dtype=torch.long)
    blocks = build_blocks(
        batch["input_ids"], batch["position_ids"], batch["loss_mask"], batch["document_ids"],
        anchors, anchor_valid, prefix_len, B, MASK_ID,
    )
    assert not blocks.label_mask[~anchor_valid].any()
    assert (blocks.labels[~anchor_valid] == 0).all()

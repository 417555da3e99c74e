"""Losses and training metrics against naive loops and hand-computed examples."""

import math

import pytest
import torch
import torch.nn.functional as F

from blockdraft.errors import ConfigError
from blockdraft.losses.block import (
    block_cross_entropy,
    chunked_block_cross_entropy,
    selector_cross_entropy,
    slot_weights,
    topk_candidates,
)
from blockdraft.train.anchors import (
    build_blocks,
    sample_anchors,
    sample_prefix_lengths,
    valid_anchor_mask,
)
from blockdraft.train.metrics import accept_length, slot_accuracy

B, V = 4, 11


def test_slot_weights_values():
    offset = torch.tensor([[0, 1, 2], [-1, 0, 3]])
    assert torch.equal(slot_weights(offset, None), torch.ones(2, 3))
    want = torch.tensor([[1.0, math.exp(-0.5), math.exp(-1.0)], [1.0, 1.0, math.exp(-1.5)]])
    assert torch.allclose(slot_weights(offset, 2.0), want)
    with pytest.raises(ConfigError, match="gamma"):
        slot_weights(offset, 0.0)


def random_blocks(loss_type, seed=0):
    g = torch.Generator().manual_seed(seed)
    n, t = 3, 24
    input_ids = torch.randint(0, V, (n, t), generator=g)
    doc = torch.zeros(n, t, dtype=torch.long)
    doc[:, 13:] = 1
    attention_mask = torch.ones(n, t, dtype=torch.bool)
    loss_mask = torch.rand(n, t, generator=g) > 0.2
    position_ids = torch.cat([torch.arange(13), torch.arange(11)]).repeat(n, 1)
    valid = valid_anchor_mask(loss_mask, attention_mask, doc, B)
    anchors, anchor_valid = sample_anchors(valid, 4, g)
    prefix_len = sample_prefix_lengths(anchor_valid, B, loss_type, 0.6, g)
    blocks = build_blocks(input_ids, position_ids, loss_mask, doc, anchors, anchor_valid,
                          prefix_len, B, V - 1)
    logits = torch.randn(n, 4, B, V, generator=g)  # [N, A, B, V]
    return input_ids, loss_mask, doc, blocks, logits


def naive_block_ce(input_ids, loss_mask, doc, blocks, logits, gamma):
    """Per block, per slot, from the definition."""
    num, den = 0.0, 0.0
    n, a_count = blocks.anchors.shape
    for row in range(n):
        for j in range(a_count):
            if not blocks.anchor_valid[row, j]:
                continue
            a, plen = int(blocks.anchors[row, j]), int(blocks.prefix_len[row, j])
            for k in range(plen, B):
                if a + k >= doc.shape[1] or doc[row, a + k] != doc[row, a] or not loss_mask[row, a + k]:
                    continue  # past the anchor's document, or not a reply token
                w = 1.0 if gamma is None else math.exp(-(k - plen) / gamma)
                ce = F.cross_entropy(logits[row, j, k], input_ids[row, a + k])
                num, den = num + w * float(ce), den + w
    return num / den


@pytest.mark.parametrize("loss_type", ["block", "variable_prefix"])
@pytest.mark.parametrize("gamma", [None, 1.5])
def test_block_cross_entropy_matches_a_naive_loop(loss_type, gamma):
    input_ids, loss_mask, doc, blocks, logits = random_blocks(loss_type)
    if loss_type == "variable_prefix":
        assert (blocks.prefix_len > 1).any()
    sup = blocks.label_mask  # [N, A, B]
    weights = slot_weights(blocks.slot_weights_offset, gamma)[sup]  # [M]
    loss = block_cross_entropy(logits[sup], blocks.labels[sup], weights)
    want = naive_block_ce(input_ids, loss_mask, doc, blocks, logits, gamma)
    assert loss.item() == pytest.approx(want, rel=1e-5)


def test_block_cross_entropy_is_zero_with_a_graph_when_nothing_is_supervised():
    logits = torch.randn(0, V, requires_grad=True)
    loss = block_cross_entropy(logits, torch.zeros(0, dtype=torch.long), torch.zeros(0))
    assert loss.item() == 0.0
    loss.backward()
    assert logits.grad is not None
    zero_weights = torch.randn(3, V, requires_grad=True)
    loss = block_cross_entropy(zero_weights, torch.zeros(3, dtype=torch.long), torch.zeros(3))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(zero_weights.grad, torch.zeros(3, V))


@pytest.mark.parametrize("transform", [None, lambda x: 3.0 * torch.tanh(x / 3.0)])
def test_chunked_equals_unchunked_in_value_and_gradient(transform):
    g = torch.Generator().manual_seed(0)
    m, h = 13, 6
    hidden = torch.randn(m, h, generator=g, requires_grad=True)
    head = torch.randn(V, h, generator=g, requires_grad=True)
    labels = torch.randint(0, V, (m,), generator=g)
    weights = slot_weights(torch.randint(0, 3, (m,), generator=g), 1.0)
    logits = hidden @ head.t()  # [M, V]
    want = block_cross_entropy(logits if transform is None else transform(logits), labels, weights)
    want_grads = torch.autograd.grad(want, (hidden, head))
    got = chunked_block_cross_entropy(hidden, head, labels, weights, 5, transform)
    got_grads = torch.autograd.grad(got, (hidden, head))
    assert torch.allclose(got, want, atol=1e-5)
    for got_g, want_g in zip(got_grads, want_grads):
        assert torch.allclose(got_g, want_g, atol=1e-5)


def test_chunked_with_no_rows_is_zero_and_backpropagates():
    hidden = torch.randn(0, 6, requires_grad=True)
    head = torch.randn(V, 6, requires_grad=True)
    loss = chunked_block_cross_entropy(hidden, head, torch.zeros(0, dtype=torch.long),
                                       torch.zeros(0), 4)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(head.grad, torch.zeros(V, 6))


def test_topk_candidates_are_the_best_logits_with_their_graph():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.0]], requires_grad=True)
    ids, values = topk_candidates(logits, 2)
    assert ids.tolist() == [[1, 3]] and values.tolist() == [[2.0, 1.0]]
    assert values.requires_grad
    with pytest.raises(ConfigError, match="selector_top_k"):
        topk_candidates(logits, 5)


def stand_in_scores(cand_logits, candidates, predecessors, hidden, codebooks):
    """score = candidate_logits + <A[pred] * (W h), B[cand]>, the DFlash2 selector form."""
    pred_book, succ_book, proj = codebooks
    query = pred_book[predecessors] * (hidden @ proj.t())  # [M, r]
    return cand_logits + torch.einsum("mr,mkr->mk", query, succ_book[candidates])  # [M, k]


def test_selector_with_k_equal_v_has_full_recall_and_block_ce_when_succ_is_zero():
    g = torch.Generator().manual_seed(0)
    m, h, r = 9, 5, 3
    logits = torch.randn(m, V, generator=g)
    labels = torch.randint(0, V, (m,), generator=g)
    weights = slot_weights(torch.randint(0, 3, (m,), generator=g), 2.0)
    ids, values = topk_candidates(logits, V)
    codebooks = (torch.randn(V, r, generator=g), torch.zeros(V, r), torch.randn(r, h, generator=g))
    preds = torch.randint(0, V, (m,), generator=g)
    scores = stand_in_scores(values, ids, preds, torch.randn(m, h, generator=g), codebooks)
    loss, recall = selector_cross_entropy(scores, ids, labels, weights)
    assert recall.item() == 1.0
    # Zero successor codebook: scores are the logits permuted, so the CE is the block CE.
    plain = block_cross_entropy(logits, labels, weights)
    assert loss.item() == pytest.approx(plain.item(), rel=1e-5)


def test_selector_counts_only_rows_whose_label_is_a_candidate():
    scores = torch.tensor([[2.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    candidates = torch.tensor([[4, 7], [3, 1], [0, 2]])
    labels = torch.tensor([7, 1, 9])  # rows 0 and 1 hit, row 2 misses
    weights = torch.tensor([1.0, 3.0, 100.0])
    loss, recall = selector_cross_entropy(scores, candidates, labels, weights)
    ce0 = -math.log(math.exp(0.0) / (math.exp(2.0) + 1.0))
    ce1 = -math.log(math.exp(1.0) / (1.0 + math.exp(1.0)))
    assert loss.item() == pytest.approx((1.0 * ce0 + 3.0 * ce1) / 4.0, rel=1e-6)
    assert recall.item() == pytest.approx(2 / 3)


@pytest.mark.parametrize("mode,denominator", [("weights", 4.0), ("tokens", 2.0), ("blocks", 1.0)])
def test_selector_follows_the_loss_normalization_of_the_block_ce(mode, denominator):
    scores = torch.tensor([[2.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    candidates = torch.tensor([[4, 7], [3, 1], [0, 2]])
    labels = torch.tensor([7, 1, 9])  # rows 0 and 1 hit (one block), row 2 misses (another block)
    weights, blocks = torch.tensor([1.0, 3.0, 100.0]), torch.tensor([0, 0, 1])
    loss, _ = selector_cross_entropy(scores, candidates, labels, weights, blocks, mode)
    ce0 = -math.log(math.exp(0.0) / (math.exp(2.0) + 1.0))
    ce1 = -math.log(math.exp(1.0) / (1.0 + math.exp(1.0)))
    assert loss.item() == pytest.approx((1.0 * ce0 + 3.0 * ce1) / denominator, rel=1e-6)


def test_selector_with_no_hit_is_zero_and_backpropagates():
    scores = torch.randn(2, 3, requires_grad=True)
    loss, recall = selector_cross_entropy(scores, torch.zeros(2, 3, dtype=torch.long),
                                          torch.tensor([5, 6]), torch.ones(2))
    loss.backward()
    assert loss.item() == 0.0 and recall.item() == 0.0
    assert torch.equal(scores.grad, torch.zeros(2, 3))


def test_slot_accuracy_per_slot_with_nan_where_unsupervised():
    labels = torch.tensor([[[0, 5, 6, 7], [0, 1, 2, 3]]])  # [N=1, A=2, B=4]
    pred = torch.tensor([[[9, 5, 0, 7], [9, 1, 2, 0]]])
    mask = torch.tensor([[[False, True, True, False], [False, True, False, True]]])
    acc = slot_accuracy(pred, labels, mask)
    assert acc[0].isnan() and acc[1] == 1.0 and acc[2] == 0.0 and acc[3] == 0.0


def test_accept_length_hand_computed():
    labels = torch.tensor([[[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 0, 0, 0]]])
    pred = torch.tensor([[[7, 1, 2, 3], [7, 1, 9, 3], [7, 9, 2, 3], [7, 1, 2, 3], [0, 0, 0, 0]]])
    mask = torch.tensor([[[False, True, True, True],    # all right: 3 + bonus = 4
                          [False, True, True, True],    # stops at slot 2: 1 + 1 = 2
                          [False, True, True, True],    # wrong at slot 1: 0 + 1 = 1
                          [False, True, False, True],   # unsupervised slot 2 stops it: 2
                          [False, False, False, False]]])  # padding block: not counted
    prefix_len = torch.ones(1, 5, dtype=torch.long)
    total, count = accept_length(pred, labels, mask, prefix_len)
    assert (total.item(), count.item()) == (4 + 2 + 1 + 2, 4)


def test_accept_length_starts_at_the_prefix():
    labels = torch.tensor([[[0, 1, 2, 3], [0, 1, 2, 3]]])
    pred = torch.tensor([[[0, 9, 2, 3], [0, 9, 9, 3]]])  # prefix slots' predictions ignored
    mask = torch.tensor([[[False, False, True, True], [False, False, False, True]]])
    prefix_len = torch.tensor([[2, 3]])
    total, count = accept_length(pred, labels, mask, prefix_len)
    assert (total.item(), count.item()) == ((2 + 1) + (1 + 1), 2)


def test_dpace_weights_match_a_direct_per_block_computation():
    from blockdraft.losses.block import dpace_weights

    g = torch.Generator().manual_seed(0)
    probs = torch.rand(5, 3, 7, generator=g)
    supervised = torch.rand(5, 3, 7, generator=g) > 0.3
    supervised[..., 0] = False  # the anchor slot
    alpha = 0.4
    got = dpace_weights(probs, supervised, alpha)
    for n in range(5):
        for a in range(3):
            slots = [k for k in range(7) if supervised[n, a, k]]
            smooth = {k: alpha + (1 - alpha) * float(probs[n, a, k]) for k in slots}
            reach = {k: math.prod(smooth[i] for i in slots if i <= k) for k in slots}  # P_k
            for k in range(7):
                want = sum(reach[j] for j in slots if j >= k) if k in slots else 0.0
                assert float(got[n, a, k]) == pytest.approx(want, rel=1e-5)
    # alpha = 1 ignores the draft: w_k = number of supervised slots from k on
    ones = dpace_weights(probs, supervised, 1.0)
    assert torch.equal(ones, supervised.flip(-1).cumsum(-1).flip(-1).float() * supervised)
    with pytest.raises(ConfigError, match="dpace_alpha"):
        dpace_weights(probs, supervised, 1.5)


# --- the objectives issue: a slot without a teacher, the normalisations, the full-distribution KL
def test_a_row_without_a_usable_candidate_gives_no_nan_and_no_gradient():
    from blockdraft.losses.block import forward_kl_rows, has_teacher, normalized_loss, teacher_log_probs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, V, generator=g, requires_grad=True)
    ids = torch.tensor([[1], [4], [7]])
    usable = torch.tensor([[True], [False], [True]])  # row 1: its only candidate lies outside the vocabulary
    logq = teacher_log_probs(torch.randn(3, 1, generator=g), usable, 1.0)
    assert not torch.isnan(logq).any()
    kl = forward_kl_rows(logits, ids, logq, 1.0)
    taught = has_teacher(usable)
    loss = normalized_loss(kl, taught.float(), torch.arange(3), "weights")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    assert torch.equal(logits.grad[1], torch.zeros(V))
    # The same as the loss over the two taught rows alone.
    alone = logits.detach()[[0, 2]].requires_grad_()
    want = forward_kl_rows(alone, ids[[0, 2]], logq[[0, 2]], 1.0).mean()
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(logits.grad[[0, 2]], alone.grad)


def test_normalisations_divide_the_weighted_sum_by_weights_blocks_or_tokens():
    from blockdraft.losses.block import normalized_loss

    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    weights = torch.tensor([2.0, 1.0, 0.5, 0.0, 0.25])  # row 3 left out (weight 0)
    blocks = torch.tensor([0, 0, 1, 2, 3])  # block 2 holds only the row left out
    total = 2 * 1 + 1 * 2 + 0.5 * 3 + 0.25 * 5
    assert float(normalized_loss(values, weights, blocks, "weights")) == pytest.approx(total / 3.75)
    assert float(normalized_loss(values, weights, blocks, "blocks")) == pytest.approx(total / 3)
    assert float(normalized_loss(values, weights, blocks, "tokens")) == pytest.approx(total / 4)
    for mode in ("weights", "blocks", "tokens"):
        empty = torch.zeros(0, requires_grad=True)
        zero = normalized_loss(empty, torch.zeros(0), torch.zeros(0, dtype=torch.long), mode)
        zero.backward()
        assert float(zero.detach()) == 0.0 and empty.grad is not None
    with pytest.raises(ConfigError, match="loss_normalization"):
        normalized_loss(values, weights, blocks, "mean")


@pytest.mark.parametrize("transform", [None, lambda x: 30.0 * torch.tanh(x / 30.0)])
def test_full_distribution_kl_equals_the_direct_one_in_value_and_gradient(transform):
    from blockdraft.losses.block import chunked_full_kl_rows

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(13, 8, generator=g, requires_grad=True)
    head = torch.randn(V, 8, generator=g, requires_grad=True)
    teacher_hidden, teacher_head = torch.randn(13, 6, generator=g), torch.randn(V, 6, generator=g)
    T = 1.7
    logits = hidden @ head.T
    logits = logits if transform is None else transform(logits)
    q = torch.softmax(teacher_hidden @ teacher_head.T / T, -1)
    want = (q * (q.log() - torch.log_softmax(logits / T, -1))).sum(-1) * T * T
    want.sum().backward()
    want_grads = hidden.grad.clone(), head.grad.clone()
    hidden.grad = head.grad = None
    got = chunked_full_kl_rows(hidden, head, teacher_hidden, teacher_head, T, 5, transform)
    got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hidden.grad, want_grads[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(head.grad, want_grads[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="chunk"):
        chunked_full_kl_rows(hidden, head, teacher_hidden, teacher_head, T, 0)


def test_full_distribution_kl_equals_the_top_k_kl_with_k_the_vocabulary():
    from blockdraft.losses.block import chunked_full_kl_rows, forward_kl_rows, teacher_log_probs

    g = torch.Generator().manual_seed(1)
    hidden, head = torch.randn(6, 8, generator=g), torch.randn(V, 8, generator=g)
    teacher_hidden, teacher_head = torch.randn(6, 8, generator=g), torch.randn(V, 8, generator=g)
    top = (teacher_hidden @ teacher_head.T).topk(V)
    logq = teacher_log_probs(top.values, torch.ones(6, V, dtype=torch.bool), 1.0)
    topk = forward_kl_rows(hidden @ head.T, top.indices, logq, 1.0)
    torch.testing.assert_close(chunked_full_kl_rows(hidden, head, teacher_hidden, teacher_head, 1.0, 4), topk,
                               rtol=1e-5, atol=1e-5)

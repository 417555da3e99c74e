"""LiLiCorr's objective: the block CE plus the path loss on the backbone's own top-k lattice."""

import dataclasses

import torch
import torch.nn.functional as F

from blockdraft.config.recipe import LoopConfig
from blockdraft.kinds.lilicorr.loss import path_targets
from blockdraft.kinds.lilicorr.model import walk
from blockdraft.losses.block import slot_weights
from blockdraft.train.step import draw_blocks, train_step
from tests.conftest import MASK_ID, make_draft
from tests.unit.test_step import _batch, _each_block, _naive_loss


FEW = 8  # the tokens of `_few_token_batch`


def _lilicorr(tiny_hf, **settings):
    """An untrained backbone ranks 4 of 268 random tokens by chance, so its candidates are lifted toward
    the batch's few tokens (about half of each slot's top-4 then holds the true token): the lattice is
    still the backbone's own top-k of its own log-softmax, over a vocabulary the batch can hit."""
    draft = make_draft(tiny_hf, "lilicorr", lilicorr_candidate_topk=4, **settings)
    torch.manual_seed(0)
    with torch.no_grad():  # off the zero init, so the slot and rank inputs of the head matter
        for name, param in draft.named_parameters():
            if name.startswith("lilicorr.") and "embedding" in name:
                param.normal_(0.0, 0.5)

    def candidates(hidden, lm_head_weight):
        logits = draft.logits(hidden, lm_head_weight).float()
        logits[..., :FEW] += 30.0
        return torch.log_softmax(logits, dim=-1).topk(draft.config.lilicorr_candidate_topk, dim=-1)

    draft.candidates = candidates
    return draft


def _few_token_batch(seed=0):
    batch = _batch(seed=seed)
    batch["input_ids"] = batch["input_ids"] % FEW
    return batch


def _naive_path_loss(draft, target, batch, cfg, blocks):
    """Each block alone, as serving sees it: the slot states and candidates of that block, the context
    state before its anchor; at slot s the score row of slot s-1's true token, over slot s's candidates."""
    feats = target.capture(batch["input_ids"])
    total, weight = 0.0, 0.0
    for row, j, hidden in _each_block(draft, target, batch, blocks):
        a = int(blocks.anchors[row, j])
        anchor = draft.project_context(feats[row:row + 1, a - 1])  # [1, H]
        slots = hidden[:, 1:]
        log_probs, ids = draft.candidates(slots, target.lm_head_weight)
        scores = draft.lilicorr(target.embed_tokens(ids), log_probs, slots, anchor, torch.tensor([a > 0]))[0]
        previous = 0
        for s in range(slots.shape[1]):
            label = blocks.labels[row, j, s + 1]
            hits = (ids[0, s] == label).nonzero()
            if not blocks.label_mask[row, j, s + 1] or previous is None or not len(hits):
                previous = int(hits[0]) if len(hits) and blocks.label_mask[row, j, s + 1] else None
                continue
            w = float(slot_weights(blocks.slot_weights_offset[row, j, s + 1], cfg.gamma))
            total = total + w * F.cross_entropy(scores[s, previous], hits[0, 0])
            weight += w
            previous = int(hits[0])
    return total / weight


def test_step_loss_is_the_block_ce_plus_the_naive_per_block_path_loss(tiny_hf, tiny_target):
    draft = _lilicorr(tiny_hf)
    cfg = LoopConfig(num_anchors=5, gamma=4.0, selector_loss_weight=0.5)
    batch = _few_token_batch()
    blocks = draw_blocks(batch, cfg, draft.config.block_size, MASK_ID, torch.Generator().manual_seed(3))
    result = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    want = _naive_loss(draft, tiny_target, batch, cfg, blocks) + 0.5 * _naive_path_loss(draft, tiny_target, batch, cfg, blocks)
    torch.testing.assert_close(result.loss, want, rtol=1e-5, atol=1e-5)
    assert 0 < result.sums["recall_hits"] < blocks.label_mask.sum()  # hits and misses both


def test_without_the_path_loss_the_step_is_the_backbones(tiny_hf, tiny_target):
    backbone, lilicorr = make_draft(tiny_hf, "dflash2"), _lilicorr(tiny_hf)
    lilicorr.load_state_dict(backbone.state_dict(), strict=False)
    cfg, batch = LoopConfig(num_anchors=5, gamma=4.0, selector_loss_weight=0.0), _batch()
    want = train_step(backbone, tiny_target, batch, dataclasses.replace(cfg, selector_loss_weight=0.0),
                      torch.Generator().manual_seed(5)).loss
    assert torch.equal(train_step(lilicorr, tiny_target, batch, cfg, torch.Generator().manual_seed(5)).loss, want)


def test_a_missed_slot_and_the_one_after_it_are_left_out():
    ids = torch.tensor([[[5, 6], [7, 8], [9, 10], [11, 12]]])  # [1, S=4, k=2]
    labels = torch.tensor([[6, 99, 10, 11]])  # slot 1's token is no candidate
    row, target, used = path_targets(ids, labels, torch.ones(1, 4, dtype=torch.bool))
    assert used.tolist() == [[True, False, False, True]]
    assert target[0, 0] == 1 and row[0, 0] == 0  # slot 0: the anchor's start row
    assert row[0, 3] == 1 and target[0, 3] == 0  # slot 3: the row of slot 2's token (index 1)


def test_the_walk_follows_the_row_of_the_previous_pick():
    scores = torch.zeros(1, 3, 2, 2)
    scores[0, 0, :, 1] = 1.0  # start: candidate 1
    scores[0, 1, 1, 0] = 1.0  # after candidate 1: candidate 0
    scores[0, 1, 0, 1] = 5.0  # (a row the walk never reads)
    scores[0, 2, 0, 1] = 1.0  # after candidate 0: candidate 1
    ids = torch.tensor([[[10, 11], [20, 21], [30, 31]]])
    tokens, probs = walk(scores, ids)
    assert tokens.tolist() == [[11, 20, 31]]
    assert probs.argmax(-1).tolist() == [[1, 0, 1]]


def test_training_the_head_walks_more_of_the_targets_tokens(tiny_hf, tiny_target):
    draft = _lilicorr(tiny_hf)
    cfg, batch = LoopConfig(num_anchors=6, gamma=4.0), _few_token_batch(seed=2)
    params = [p for n, p in draft.named_parameters() if n.startswith("lilicorr.")]
    opt = torch.optim.Adam(params, lr=3e-3)

    def path_loss_now():
        return float(train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(1)).sums["selector_loss_sum"])

    before = path_loss_now()
    for _ in range(15):
        opt.zero_grad()
        train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(1)).loss.backward()
        opt.step()
    assert path_loss_now() < 0.7 * before

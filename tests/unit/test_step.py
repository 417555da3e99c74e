"""The batched training step against a naive one-block-at-a-time computation."""

import dataclasses

import pytest
import torch

from blockdraft.config.recipe import LoopConfig
from blockdraft.losses.block import slot_weights
from blockdraft.train.step import draw_blocks, train_step
from tests.conftest import MASK_ID, make_draft


def _batch(n=2, t=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (n, t), generator=g)
    loss_mask = torch.zeros(n, t, dtype=torch.bool)
    loss_mask[:, 6:] = True
    attention = torch.ones(n, t, dtype=torch.bool)
    attention[1, 20:] = False  # a padded row
    loss_mask &= attention
    return {
        "input_ids": ids, "loss_mask": loss_mask, "attention_mask": attention,
        "position_ids": torch.arange(t).expand(n, -1).clone(),
        "document_ids": torch.where(attention, 0, -1),
    }


def _each_block(draft, target, batch, blocks):
    """(row, block, hidden [1, B, H]) of each valid block alone: its context is exactly the target
    features before its anchor."""
    b = draft.config.block_size
    feats = target.capture(batch["input_ids"])
    for row in range(batch["input_ids"].shape[0]):
        for j, (a, ok) in enumerate(zip(blocks.anchors[row].tolist(), blocks.anchor_valid[row].tolist())):
            if not ok:
                continue
            kv = draft.context_kv(feats[row:row + 1, :a], batch["position_ids"][row:row + 1, :a])
            ids = blocks.block_ids[row:row + 1, j * b:(j + 1) * b]
            pos = blocks.block_position_ids[row:row + 1, j * b:(j + 1) * b]
            yield row, j, draft(draft.embed(ids, target.embed_tokens), pos, kv)


def _naive_loss(draft, target, batch, cfg, blocks):
    total, weight = 0.0, 0.0
    for row, j, hidden in _each_block(draft, target, batch, blocks):
        logits = draft.logits(hidden, target.lm_head_weight)[0]  # [B, V]
        for k in range(1, draft.config.block_size):
            if blocks.label_mask[row, j, k]:
                w = float(slot_weights(blocks.slot_weights_offset[row, j, k], cfg.gamma))
                ce = torch.nn.functional.cross_entropy(logits[k], blocks.labels[row, j, k])
                total, weight = total + w * ce, weight + w
    return total / weight


@pytest.mark.parametrize("kind", ["dflash", "jetspec"])
def test_batched_step_equals_naive_per_block_loop(tiny_hf, tiny_target, kind):
    # The naive loop runs each block alone, as serving does (a JetSpec draft then builds its own
    # causal mask), so this also checks training's batched causal mask against serving's.
    draft = make_draft(tiny_hf, kind)
    cfg = LoopConfig(num_anchors=5, gamma=4.0)
    batch = _batch()
    blocks = draw_blocks(batch, cfg, draft.config.block_size, MASK_ID, torch.Generator().manual_seed(3))
    result = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    torch.testing.assert_close(result.loss, _naive_loss(draft, tiny_target, batch, cfg, blocks), rtol=1e-5, atol=1e-5)


def test_jetspec_trains_the_same_weights_as_dflash_under_another_mask(tiny_hf, tiny_target):
    jetspec, dflash = make_draft(tiny_hf, "jetspec"), make_draft(tiny_hf, "dflash")
    assert jetspec.state_dict().keys() == dflash.state_dict().keys()
    cfg, batch = LoopConfig(num_anchors=5, gamma=4.0), _batch()
    losses = [train_step(d, tiny_target, batch, cfg, torch.Generator().manual_seed(3)).loss for d in (jetspec, dflash)]
    assert not torch.allclose(losses[0], losses[1])  # same weights (same seed), different attention


def test_variable_prefix_step_equals_naive_loop(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "dflash", block_size=5)
    cfg = LoopConfig(num_anchors=4, gamma=3.0, loss_type="variable_prefix", prefix_weight_base=0.7)
    batch = _batch(seed=1)
    blocks = draw_blocks(batch, cfg, 5, MASK_ID, torch.Generator().manual_seed(4))
    assert (blocks.prefix_len > 1).any()
    result = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(4))
    torch.testing.assert_close(result.loss, _naive_loss(draft, tiny_target, batch, cfg, blocks), rtol=1e-5, atol=1e-5)


def test_dflash2_with_selector_weight_zero_equals_dflash(tiny_hf, tiny_target):
    d1 = make_draft(tiny_hf, "dflash")
    d2 = make_draft(tiny_hf, "dflash2", seed=9)
    d2.load_state_dict(d1.state_dict(), strict=False)
    cfg = LoopConfig(num_anchors=5, gamma=4.0, selector_loss_weight=0.0)
    batch = _batch()
    l1 = train_step(d1, tiny_target, batch, cfg, torch.Generator().manual_seed(5)).loss
    l2 = train_step(d2, tiny_target, batch, cfg, torch.Generator().manual_seed(5)).loss
    assert torch.equal(l1, l2)
    with_selector = train_step(d2, tiny_target, batch, dataclasses.replace(cfg, selector_loss_weight=1.0), torch.Generator().manual_seed(5)).loss
    assert with_selector > l2


def test_chunked_loss_step_equals_unchunked(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "dflash")
    batch = _batch()
    cfg = LoopConfig(num_anchors=5, gamma=4.0)
    full = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(6))
    chunked = train_step(draft, tiny_target, batch, dataclasses.replace(cfg, loss_chunk_size=7), torch.Generator().manual_seed(6))
    torch.testing.assert_close(full.loss, chunked.loss)
    torch.testing.assert_close(full.sums["accept_len_sum"], chunked.sums["accept_len_sum"])


def test_activation_checkpointing_gives_the_same_gradients(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "dflash2")
    batch = _batch()
    cfg = LoopConfig(num_anchors=5, gamma=4.0)
    grads = []
    for on in (False, True):
        draft.zero_grad()
        draft.activation_checkpointing = on
        train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(7)).loss.backward()
        grads.append({n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g)


def test_chunked_dflash2_step_equals_unchunked(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "dflash2")
    with torch.no_grad():
        draft.candidate_selector.successor_codebook.normal_()
    batch = _batch()
    cfg = LoopConfig(num_anchors=5, gamma=4.0)
    results, grads = [], []
    for chunk in (0, 7):
        draft.zero_grad()
        r = train_step(draft, tiny_target, batch, dataclasses.replace(cfg, loss_chunk_size=chunk), torch.Generator().manual_seed(8))
        r.loss.backward()
        results.append(r)
        grads.append({n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None})
    torch.testing.assert_close(results[0].loss, results[1].loss)
    torch.testing.assert_close(results[0].sums["selector_correct"], results[1].sums["selector_correct"])
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-6)


def _each_reduced_slot(draft, target, batch, blocks):
    """(row, block, slot, logits [V_draft]) of each supervised slot of a reduced draft, its block run alone."""
    for row, j, hidden in _each_block(draft, target, batch, blocks):
        logits = hidden[0] @ draft.lm_head.weight.T  # [B, V_draft]
        for k in range(1, draft.config.block_size):
            if blocks.label_mask[row, j, k]:
                yield row, j, k, logits[k]


def _naive_reduced_loss(draft, target, batch, cfg, blocks):
    """Per block, CE over the draft's own vocabulary; labels outside it are left out."""
    vocab = draft.draft_token_ids().tolist()
    total, weight, outside = 0.0, 0.0, 0
    for row, j, k, logits in _each_reduced_slot(draft, target, batch, blocks):
        label = int(blocks.labels[row, j, k])
        if label not in vocab:
            outside += 1
            continue
        w = float(slot_weights(blocks.slot_weights_offset[row, j, k], cfg.gamma))
        total = total + w * torch.nn.functional.cross_entropy(logits, torch.tensor(vocab.index(label)))
        weight += w
    return total / weight, outside


def test_reduced_vocabulary_step_equals_naive_loop_and_counts_outside_labels(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "dflash", draft_vocab_size=128)
    draft.set_draft_vocab(torch.arange(0, 256, 2), tiny_target.lm_head_weight)  # even ids only
    cfg = LoopConfig(num_anchors=5, gamma=4.0)
    batch = _batch()
    blocks = draw_blocks(batch, cfg, draft.config.block_size, MASK_ID, torch.Generator().manual_seed(3))
    result = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    want, outside = _naive_reduced_loss(draft, tiny_target, batch, cfg, blocks)
    assert outside > 0
    torch.testing.assert_close(result.loss, want, rtol=1e-5, atol=1e-5)
    assert int(result.sums["labels_outside_vocab"]) == outside
    chunked = train_step(draft, tiny_target, batch, dataclasses.replace(cfg, loss_chunk_size=7), torch.Generator().manual_seed(3))
    torch.testing.assert_close(chunked.loss, result.loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(chunked.sums["slot_correct"], result.sums["slot_correct"])


def test_feature_noise_changes_training_only_and_is_reproducible(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "dflash")
    batch = _batch()
    plain = LoopConfig(num_anchors=5, gamma=4.0)
    noisy = dataclasses.replace(plain, feature_noise_std=0.5)

    def loss(cfg, train):
        draft.train(train)
        return train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3)).loss

    assert not torch.equal(loss(noisy, True), loss(plain, True))
    torch.testing.assert_close(loss(noisy, True), loss(noisy, True))  # the micro-batch generator draws it
    torch.testing.assert_close(loss(noisy, False), loss(plain, False))  # validation sees clean features


def _naive_dpace_and_kl_loss(draft, target, batch, cfg, blocks):
    """Per block, from the definitions: D-PACE weights from the block's own label probabilities,
    and the forward KL against the target's top-k at the position before each slot."""
    b, alpha, T, k = draft.config.block_size, cfg.dpace_alpha, cfg.kl_temperature, cfg.teacher_top_k
    target_logits = target.model(input_ids=batch["input_ids"]).logits  # [N, T, V]
    ce_num = kl_num = den = 0.0
    tokens = blocks_counted = 0
    for row, j, hidden in _each_block(draft, target, batch, blocks):
        logits = draft.logits(hidden, target.lm_head_weight)[0]  # [B, V]
        slots = [s for s in range(1, b) if blocks.label_mask[row, j, s]]
        probs = {s: float(torch.softmax(logits[s].detach(), -1)[blocks.labels[row, j, s]]) for s in slots}
        for s in slots:
            reach, weight = 1.0, 0.0
            for i in slots:  # w_s = sum over supervised j >= s of prod_{supervised i <= j} s_i
                if i <= s:
                    reach *= alpha + (1 - alpha) * probs[i]
            tail = reach
            weight = tail
            for i in slots:
                if i > s:
                    tail *= alpha + (1 - alpha) * probs[i]
                    weight += tail
            ce = torch.nn.functional.cross_entropy(logits[s], blocks.labels[row, j, s])
            anchor = int(blocks.anchors[row, j])
            top = target_logits[row, anchor + s - 1].topk(k)
            q = torch.softmax(top.values / T, -1)
            logp = torch.log_softmax(logits[s] / T, -1)[top.indices]
            kl = (q * (q.log() - logp)).sum() * T * T
            ce_num, kl_num, den = ce_num + weight * ce, kl_num + weight * kl, den + weight
            tokens += 1
        blocks_counted += bool(slots)
    den = {"weights": den, "blocks": blocks_counted, "tokens": tokens}[cfg.loss_normalization]
    return cfg.ce_weight * ce_num / den + cfg.kl_weight * kl_num / den


@pytest.mark.parametrize("normalization", ["weights", "blocks", "tokens"])
def test_dpace_and_soft_label_step_equals_naive_per_block_loop(tiny_hf, tiny_target, normalization):
    draft = make_draft(tiny_hf, "dflash")
    cfg = LoopConfig(num_anchors=5, position_weighting="dpace", dpace_alpha=0.3, ce_weight=0.6, kl_weight=0.7,
                     teacher_top_k=9, kl_temperature=1.5, loss_normalization=normalization)
    batch = _batch()
    blocks = draw_blocks(batch, cfg, draft.config.block_size, MASK_ID, torch.Generator().manual_seed(3))
    result = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    torch.testing.assert_close(result.loss, _naive_dpace_and_kl_loss(draft, tiny_target, batch, cfg, blocks), rtol=1e-5, atol=1e-5)
    assert float(result.sums["kl_sum"]) > 0
    chunked = train_step(draft, tiny_target, batch, dataclasses.replace(cfg, loss_chunk_size=7), torch.Generator().manual_seed(3))
    torch.testing.assert_close(chunked.loss, result.loss, rtol=1e-5, atol=1e-6)


def test_soft_labels_from_stored_top_k_equal_the_online_ones(tiny_hf, tiny_target):
    from blockdraft.models.features import batch_features_and_final
    from blockdraft.models.teacher import teacher_topk_rows

    draft = make_draft(tiny_hf, "dflash")
    cfg = LoopConfig(num_anchors=5, kl_weight=1.0, teacher_top_k=6)
    batch = _batch()
    features, final = batch_features_and_final(tiny_target, batch)
    rows = [teacher_topk_rows(final[r], batch["loss_mask"][r], tiny_target.lm_head_weight, 8) for r in range(2)]
    stored = {**batch, "features": features, "teacher_ids": torch.stack([r[0] for r in rows]).long(),
              "teacher_logits": torch.stack([r[1] for r in rows])}
    online = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    from_store = train_step(draft, tiny_target, stored, cfg, torch.Generator().manual_seed(3))
    torch.testing.assert_close(from_store.loss, online.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(from_store.sums["kl_sum"], online.sums["kl_sum"], rtol=1e-5, atol=1e-6)
    # The full distribution asked of a store takes all the store kept (the trainer says so at start).
    all_kept = train_step(draft, tiny_target, stored, dataclasses.replace(cfg, teacher_top_k=8), torch.Generator().manual_seed(3))
    full = train_step(draft, tiny_target, stored, dataclasses.replace(cfg, teacher_top_k=None), torch.Generator().manual_seed(3))
    torch.testing.assert_close(full.loss, all_kept.loss)


def test_soft_labels_outside_a_reduced_vocabulary_are_dropped_and_renormalised(tiny_hf, tiny_target):
    """A draft whose logits are the target's own, restricted to its vocabulary, has KL 0 against the
    teacher renormalised over that vocabulary (candidates outside it dropped); any other draft has more."""
    from blockdraft.losses.block import forward_kl_rows, teacher_log_probs

    g = torch.Generator().manual_seed(0)
    full = torch.randn(3, 10, generator=g)
    vocab = torch.tensor([0, 2, 4, 6, 8])
    top = full.topk(10)
    usable = torch.isin(top.indices, vocab)
    draft_ids = torch.searchsorted(vocab, top.indices).clamp(max=4)
    logq = teacher_log_probs(top.values, usable, 1.0)
    kl = forward_kl_rows(full[:, vocab], draft_ids, logq, 1.0)
    torch.testing.assert_close(kl, torch.zeros(3), atol=1e-6, rtol=0)
    other = full[:, vocab] + torch.randn(3, 5, generator=g)
    assert (forward_kl_rows(other, draft_ids, logq, 1.0) > 0).all()


def test_dpace_defaults_to_its_measured_normalisation_and_decay_to_the_weighted_mean():
    from blockdraft.train.step import DEFAULT_NORMALIZATION, loss_normalization

    assert loss_normalization(LoopConfig(position_weighting="decay")) == "weights"
    assert loss_normalization(LoopConfig(position_weighting="dpace")) == DEFAULT_NORMALIZATION["dpace"]
    assert loss_normalization(LoopConfig(position_weighting="dpace", loss_normalization="tokens")) == "tokens"


def _grads(draft):
    return {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}


def test_a_slot_whose_teacher_lies_outside_the_vocabulary_is_left_out_with_finite_gradients(tiny_hf, tiny_target):
    """JetSpec's KL, a reduced vocabulary of even ids and the target's top 1: every slot whose top token
    is odd has no teacher. The step equals the KL over the other slots alone, in value and gradient."""
    draft = make_draft(tiny_hf, "jetspec", draft_vocab_size=128)
    vocab = torch.arange(0, 256, 2)
    draft.set_draft_vocab(vocab, tiny_target.lm_head_weight)
    cfg = LoopConfig(num_anchors=5, gamma=None, ce_weight=0.0, kl_weight=1.0, teacher_top_k=1)
    batch = _batch()
    blocks = draw_blocks(batch, cfg, draft.config.block_size, MASK_ID, torch.Generator().manual_seed(3))
    result = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    result.loss.backward()
    got = _grads(draft)
    assert torch.isfinite(result.loss) and all(torch.isfinite(g).all() for g in got.values())

    draft.zero_grad(set_to_none=True)
    target_logits = tiny_target.model(input_ids=batch["input_ids"]).logits  # [N, T, V]
    total, taught, untaught = 0.0, 0, 0
    for row, j, k, logits in _each_reduced_slot(draft, tiny_target, batch, blocks):
        best = int(target_logits[row, int(blocks.anchors[row, j]) + k - 1].argmax())
        if best % 2:
            untaught += 1
            continue
        total = total - torch.log_softmax(logits, -1)[best // 2]  # KL to a one-hot teacher
        taught += 1
    assert taught > 0 and untaught > 0
    want = total / taught
    want.backward()
    assert int(result.sums["kl_rows_without_teacher"]) == untaught
    torch.testing.assert_close(result.loss, want, rtol=1e-5, atol=1e-6)
    for name, g in _grads(draft).items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6)


def test_full_distribution_soft_labels_equal_the_top_k_ones_with_k_the_vocabulary(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "jetspec")
    cfg = LoopConfig(num_anchors=5, gamma=None, kl_weight=1.0, teacher_top_k=tiny_target.lm_head_weight.shape[0])
    batch = _batch()
    top_k = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    full = train_step(draft, tiny_target, batch, dataclasses.replace(cfg, teacher_top_k=None, loss_chunk_size=7),
                      torch.Generator().manual_seed(3))
    torch.testing.assert_close(full.loss, top_k.loss, rtol=1e-5, atol=1e-5)
    assert int(full.sums["kl_rows_without_teacher"]) == 0


def test_full_distribution_soft_labels_of_a_reduced_draft_are_the_targets_over_its_vocabulary(tiny_hf, tiny_target):
    """The top-k path with k the whole vocabulary renormalises the target over the draft's tokens; the
    full path must give the same, also once the draft's own head has moved away from the target's rows."""
    draft = make_draft(tiny_hf, "dflash", draft_vocab_size=128)
    draft.set_draft_vocab(torch.arange(0, 256, 2), tiny_target.lm_head_weight)
    with torch.no_grad():
        draft.lm_head.weight.mul_(3.0)  # a trained head is no longer the target's rows
    cfg = LoopConfig(num_anchors=5, gamma=None, ce_weight=0.0, kl_weight=1.0, teacher_top_k=tiny_target.lm_head_weight.shape[0])
    batch = _batch()
    top_k = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    full = train_step(draft, tiny_target, batch, dataclasses.replace(cfg, teacher_top_k=None), torch.Generator().manual_seed(3))
    torch.testing.assert_close(full.loss, top_k.loss, rtol=1e-5, atol=1e-5)

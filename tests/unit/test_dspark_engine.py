"""The reference engine decodes a DSpark draft as vLLM's DSpark speculator does: both block layouts,
the serial Markov head (dense, top-k, reduced vocabulary), losslessly; and the confidence head's
calibration record."""

import pytest
import torch
import torch.nn.functional as F

from blockdraft.engine.decoder import DecodeStats, DraftContext, SpeculativeEngine
from blockdraft.engine.sampling import SamplingParams, probabilities
from blockdraft.engine.target_state import TargetState
from blockdraft.models.target import TargetModel
from tests.conftest import make_draft
from tests.unit.test_engine import _make_predictable, _silence_layers
from tests.unit.test_engine_sampling import N_DECODES, PROMPT, VOCAB, _chi_square_passes, _tiny

VARIANTS = {
    "anchor_first": dict(),
    "fill_in": dict(sample_from_anchor=False),
    "topk": dict(dspark_draft_topk=5),
    "reduced_vocab": dict(draft_vocab_size=64),
    "reduced_vocab_topk_fill_in": dict(draft_vocab_size=64, dspark_draft_topk=3, sample_from_anchor=False),
}


def _dspark(hf, target, markov_std=0.5, **overrides):
    """A DSpark draft whose Markov head is switched on (a fresh one computes its DFlash backbone)."""
    draft = make_draft(hf, "dspark", markov_rank=8, **overrides)
    if draft.reduced_vocab:
        draft.set_draft_vocab(torch.arange(0, 256, 4), target.lm_head_weight)  # draft_vocab_size=64
    with torch.no_grad():
        torch.nn.init.normal_(draft.markov_head.markov_w2.weight, std=markov_std, generator=torch.Generator().manual_seed(2))
    return draft.eval()


def _forced_logits(draft, hidden, previous, lm_head_weight):
    """Teacher forcing: [h ; e(previous)] through [W | markov_w2], each slot fed its previous token."""
    return F.linear(draft.joint_hidden(hidden, previous), draft.joint_head(draft.head_weight(lm_head_weight)))


# --- (a) lossless -----------------------------------------------------------------------------

@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_equals_target_greedy(tiny_hf, tiny_target, variant):
    engine = SpeculativeEngine(tiny_target, _dspark(tiny_hf, tiny_target, **VARIANTS[variant]))
    for seed in range(2):
        prompt = torch.randint(0, 256, (7,), generator=torch.Generator().manual_seed(seed)).tolist()
        result = engine.generate(prompt, 16)
        assert result.tokens == engine.target_generate(prompt, 16).tokens
        assert result.stats.num_drafts > 0


@pytest.mark.parametrize("sample_from_anchor", [True, False])
def test_hand_set_draft_is_fully_accepted(sample_from_anchor):
    """Every slot of either layout predicts the target's next token: K accepted per step."""
    from blockdraft.models.tiny_target import build_tiny_model

    hf = build_tiny_model("qwen3", seed=3)
    _make_predictable(hf, token=42)
    target = TargetModel(hf, [1, 3])
    draft = make_draft(hf, "dspark", markov_rank=8, sample_from_anchor=sample_from_anchor).eval()
    _silence_layers(draft)
    engine = SpeculativeEngine(target, draft)
    k = engine.k
    result = engine.generate([5, 6, 7, 8], 1 + 3 * (k + 1))
    assert result.tokens == [42] * (1 + 3 * (k + 1))
    assert result.stats.accepted_per_step == [k] * 3


@pytest.mark.parametrize("overrides", [
    # 15-35 s each (make test-slow): test_sampled_proposals_come_with_the_distribution_they_were_drawn_from
    # checks in seconds, in make test, that each slot's q is what its token was drawn from, and the
    # rejection sampling after it is the DFlash engine's, whose sampled test runs in make test.
    pytest.param(dict(draft_vocab_size=4, dspark_draft_topk=3), id="anchor_first_reduced_topk",  # never drafts 1 or 5
                 marks=pytest.mark.slow),
    pytest.param(dict(sample_from_anchor=False), id="fill_in", marks=pytest.mark.slow),
])
def test_sampled_output_follows_target_distribution(overrides):
    """Three tokens, so the second drafted slot (Markov-corrected by the first's draw) decides one."""
    hf = _tiny()
    target = TargetModel(hf, [0, 1])
    draft = make_draft(hf, "dspark", mask_token_id=VOCAB - 1, target_layer_ids=[0, 1], block_size=3, markov_rank=4,
                       num_layers=1, **overrides)  # one draft layer keeps 1000 decodes cheap
    if draft.reduced_vocab:
        draft.set_draft_vocab(torch.tensor([0, 2, 3, 4]), target.lm_head_weight)
    with torch.no_grad():  # soften the draft (it shares the sharpened head) so its Markov head moves its slots
        draft.norm.weight.mul_(0.1)
        torch.nn.init.normal_(draft.markov_head.markov_w2.weight, std=1.0, generator=torch.Generator().manual_seed(2))
    engine = SpeculativeEngine(target, draft.eval())
    params = SamplingParams(temperature=1.0)
    counts, drafts, accepted = {}, 0, 0
    for seed in range(N_DECODES):
        result = engine.generate(PROMPT, 3, params, seed=seed)
        counts[tuple(result.tokens)] = counts.get(tuple(result.tokens), 0) + 1
        drafts, accepted = drafts + result.stats.num_drafts, accepted + result.stats.num_accepted
    assert 0 < accepted < drafts * engine.k  # both acceptances and rejections were exercised
    ok, stat, bound = _chi_square_passes(counts, _exact_triple_distribution(hf, params), N_DECODES)
    assert ok, f"chi2={stat:.1f} >= {bound:.1f}"


def _exact_triple_distribution(hf, params):
    """P(t1, t2, t3) of the target's sampling, by enumeration."""
    def next_p(prefix):
        return probabilities(hf(torch.tensor([PROMPT + prefix])).logits[0, -1], params)

    out = {}
    with torch.no_grad():
        p1 = next_p([])
        for t1 in range(VOCAB):
            p2 = next_p([t1])
            for t2 in range(VOCAB):
                p3 = next_p([t1, t2])
                for t3 in range(VOCAB):
                    out[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sampled_proposals_come_with_the_distribution_they_were_drawn_from(tiny_hf, tiny_target, variant):
    """q_i, scattered into the target's vocabulary, is the Markov-corrected distribution given the
    tokens drawn before slot i: what rejection sampling needs to stay lossless."""
    draft = _dspark(tiny_hf, tiny_target, markov_std=2.0, **VARIANTS[variant])
    engine, params = SpeculativeEngine(tiny_target, draft), SamplingParams(temperature=1.0)
    _, feats = TargetState(tiny_target).run(torch.tensor([[5, 6, 7, 8, 9]]), torch.arange(5)[None])
    ctx = DraftContext(draft)
    ctx.extend(feats, torch.arange(5)[None])
    proposals, q, confidence = engine._propose(ctx, 11, 5, params, torch.Generator().manual_seed(0))
    assert proposals.shape == (engine.k,) and q.shape == (engine.k, draft.config.vocab_size) and confidence.shape == (engine.k,)
    # The same backbone pass, teacher-forced on the drawn tokens.
    n_slots = engine.k if draft.config.anchor_predicts else engine.k + 1
    block = torch.tensor([[11] + [draft.config.mask_token_id] * (n_slots - 1)])
    positions = torch.arange(5, 5 + n_slots)[None]
    hidden = draft(draft.embed(block, tiny_target.embed_tokens), positions, ctx.kv)[:, n_slots - engine.k:]
    previous = torch.cat([torch.tensor([[11]]), proposals[None, :-1]], 1)
    forced = _forced_logits(draft, hidden, previous, tiny_target.lm_head_weight)[0]  # [K, V_draft]
    if draft.config.dspark_draft_topk:
        keep = draft.draft_logits(hidden, tiny_target.lm_head_weight)[0].topk(draft.config.dspark_draft_topk, -1).indices
        forced = torch.full_like(forced, float("-inf")).scatter_(1, keep, forced.gather(1, keep))
    expected = probabilities(forced, params)
    if draft.reduced_vocab:
        expected = torch.zeros_like(q).index_copy_(1, draft.draft_token_ids(), expected)
    torch.testing.assert_close(q, expected, rtol=1e-4, atol=1e-6)
    assert torch.all(q[torch.arange(engine.k), proposals] > 0)


# --- (b) serial decoding equals teacher forcing on its own tokens ------------------------------

@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decode_equals_teacher_forcing_on_its_own_tokens(tiny_hf, tiny_target, variant):
    draft = _dspark(tiny_hf, tiny_target, markov_std=2.0, **VARIANTS[variant])
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, draft.config.num_speculative_tokens, draft.config.hidden_size, generator=g)
    anchors = torch.randint(0, 256, (3,), generator=g)
    seen = []

    def pick(slot_logits):
        seen.append(slot_logits)
        return slot_logits.argmax(-1), torch.softmax(slot_logits, -1)

    tokens, _, confidence = draft.decode(hidden, anchors, tiny_target.lm_head_weight, pick)
    previous = torch.cat([anchors[:, None], tokens[:, :-1]], 1)
    forced = _forced_logits(draft, hidden, previous, tiny_target.lm_head_weight)
    used = torch.stack(seen, 1)
    finite = used.isfinite()  # everything, or the backbone's top-k candidates
    assert finite.sum(-1).eq(draft.config.dspark_draft_topk or used.shape[-1]).all()
    torch.testing.assert_close(used[finite], forced[finite], rtol=1e-5, atol=1e-5)
    assert torch.equal(draft.to_target_ids(used.argmax(-1)), tokens)
    if not draft.config.dspark_draft_topk:
        assert torch.equal(draft.to_target_ids(forced.argmax(-1)), tokens)
    joint = draft.joint_hidden(hidden, previous)
    torch.testing.assert_close(confidence, draft.confidence_logits(joint).sigmoid())


# --- (c) the number of drafted tokens ----------------------------------------------------------

@pytest.mark.parametrize("sample_from_anchor,k", [(True, 4), (False, 3)])
def test_anchor_first_drafts_block_size_tokens_and_fill_in_one_fewer(tiny_hf, tiny_target, sample_from_anchor, k):
    draft = _dspark(tiny_hf, tiny_target, sample_from_anchor=sample_from_anchor)
    engine = SpeculativeEngine(tiny_target, draft)
    assert draft.config.block_size == 4 and engine.k == k
    result = engine.generate([5, 6, 7, 8], 10)
    assert result.stats.num_speculative_tokens == k
    assert all(len(slots) == k for slots in result.stats.confidence)
    assert SpeculativeEngine(tiny_target, make_draft(tiny_hf, "dflash")).k == 3


# --- (d) calibration ---------------------------------------------------------------------------

def test_calibration_record_has_one_confidence_per_drafted_slot(tiny_hf, tiny_target):
    engine = SpeculativeEngine(tiny_target, _dspark(tiny_hf, tiny_target))
    stats = engine.generate([5, 6, 7, 8, 9], 24).stats
    assert len(stats.confidence) == stats.num_drafts
    assert all(len(slots) == engine.k and all(0 < c < 1 for c in slots) for slots in stats.confidence)
    summary = stats.calibration()
    assert [row.position for row in summary] == list(range(1, engine.k + 1))
    assert summary[0].reached == stats.num_drafts
    assert all(a.reached >= b.reached for a, b in zip(summary, summary[1:]))
    assert all(row.accepted <= row.reached for row in summary)
    assert [row.accepted for row in summary[:-1]] == [row.reached for row in summary[1:]]
    assert [row.accepted for row in summary] == stats.accepted_per_position()
    for row in summary:
        assert row.reached == 0 or 0 < row.mean_confidence < 1


def test_calibration_counts_each_position_over_the_steps_that_reached_it():
    stats = DecodeStats(3, accepted_per_step=[0, 2, 3, 1], confidence=[[0.9, 0.8, 0.7], [0.6, 0.5, 0.4], [0.3, 0.2, 0.1], [1.0]])
    rows = stats.calibration()  # the last step ended at an accepted end-of-sequence draft in slot 1
    assert [(r.reached, r.accepted) for r in rows] == [(4, 3), (2, 2), (2, 1)]
    assert rows[0].mean_confidence == pytest.approx((0.9 + 0.6 + 0.3 + 1.0) / 4)
    assert rows[2].mean_confidence == pytest.approx((0.4 + 0.1) / 2) and rows[2].acceptance_rate == 0.5
    assert DecodeStats(3, [1, 2]).calibration() == []
    with pytest.raises(ValueError, match="2 confidence records for 1 steps"):
        DecodeStats(3, [1], [[0.5] * 3, [0.5] * 3]).calibration()


def test_a_step_ended_by_an_accepted_eos_draft_keeps_the_confidences_up_to_it(tiny_hf, tiny_target):
    engine = SpeculativeEngine(tiny_target, _dspark(tiny_hf, tiny_target))
    k, prompt = engine.k, [5, 6, 7, 8]
    truth = engine.target_generate(prompt, 12).tokens
    eos = next(i for i in range(2, 12) if truth[i] not in truth[:i] and (i - 1) % (k + 1) < k - 1)
    engine.eos = {truth[eos]}

    def oracle(ctx, anchor, anchor_pos, params, gen):  # an always-right draft, confidence 0.1, 0.2, ...
        nxt = truth[anchor_pos - len(prompt) + 1:][:k]
        proposals = torch.tensor(nxt + [0] * (k - len(nxt)))
        return proposals, F.one_hot(proposals, tiny_hf.config.vocab_size).float(), torch.arange(1, k + 1) / 10

    engine._propose = oracle
    stats = engine.generate(prompt, 12).stats
    j = (eos - 1) % (k + 1)  # the EOS is the step's (j+1)-th draft, j + 1 < k
    assert stats.accepted_per_step[-1] == j + 1 and len(stats.confidence[-1]) == j + 1
    assert [row.reached for row in stats.calibration()][j + 1] == len(stats.accepted_per_step) - 1

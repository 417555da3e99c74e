"""Sampled speculative output must follow the target's own (truncated) distribution exactly."""

import math

import pytest
import torch

from blockdraft.engine.decoder import SpeculativeEngine
from blockdraft.engine.sampling import SamplingParams, draw, probabilities
from blockdraft.models.target import TargetModel
from blockdraft.models.tiny_target import build_tiny_model
from tests.conftest import make_draft

VOCAB = 6
PROMPT = [1, 2, 3]
N_DECODES = 1000  # the negative control below shows a sampler 2% off still fails at this size


def _exact_pair_distribution(hf, params):
    """P(t1, t2) of the target's truncated sampling, by enumeration."""
    out = {}
    with torch.no_grad():
        p1 = probabilities(hf(torch.tensor([PROMPT])).logits[0, -1], params)
        for t1 in range(VOCAB):
            if p1[t1] == 0:
                continue
            p2 = probabilities(hf(torch.tensor([PROMPT + [t1]])).logits[0, -1], params)
            for t2 in range(VOCAB):
                out[(t1, t2)] = float(p1[t1] * p2[t2])
    return out


def _chi_square_passes(counts, expected_p, n):
    """Chi-square goodness of fit at p ~ 0.001 (Wilson-Hilferty), bins with expected < 5 merged."""
    stat, df, rest_obs, rest_exp = 0.0, -1, 0, 0.0
    for key, p in expected_p.items():
        e, o = p * n, counts.get(key, 0)
        if e < 5:
            rest_obs, rest_exp = rest_obs + o, rest_exp + e
            continue
        stat, df = stat + (o - e) ** 2 / e, df + 1
    if rest_exp > 0:
        stat, df = stat + (rest_obs - rest_exp) ** 2 / rest_exp, df + 1
    z = 3.1
    bound = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat < bound, stat, bound


def _tiny():
    # Three layers, the fewest that leave layers 0 and 1 to capture (the last is never a draft's input): each
    # of the thousand decodes costs a target forward per layer.
    hf = build_tiny_model("qwen3", seed=4, vocab_size=VOCAB, num_layers=3)
    with torch.no_grad():  # sharpen the target a little so its distribution is far from uniform
        hf.get_output_embeddings().weight.mul_(40)
    return hf


# Every registered kind, with top-k and top-p truncation, is checked by tests/integration/test_kind_conformance.py.
@pytest.mark.parametrize("kind,params", [("dflash", SamplingParams(temperature=1.0))])
def test_sampled_output_follows_target_distribution(kind, params):
    hf = _tiny()
    target = TargetModel(hf, [0, 1])
    draft = make_draft(hf, kind, mask_token_id=VOCAB - 1, target_layer_ids=[0, 1], block_size=3, selector_top_k=3)
    with torch.no_grad():  # a draft far from the target, so rejections happen
        draft.fc.weight.mul_(50)
    assert_sampling_follows_target(hf, SpeculativeEngine(target, draft), params)


def assert_sampling_follows_target(hf, engine, params) -> None:
    """N_DECODES sampled decodes of two tokens from PROMPT, their pairs against the target's exact distribution;
    the draft must be far enough from the target that both acceptances and rejections happen."""
    counts = {}
    drafts = accepted = 0
    for seed in range(N_DECODES):
        res = engine.generate(PROMPT, 2, params, seed=seed)
        key = tuple(res.tokens)
        counts[key] = counts.get(key, 0) + 1
        drafts += res.stats.num_drafts
        accepted += res.stats.num_accepted
    assert 0 < accepted < drafts * engine.k  # both acceptances and rejections were exercised
    ok, stat, bound = _chi_square_passes(counts, _exact_pair_distribution(hf, params), N_DECODES)
    assert ok, f"chi2={stat:.1f} >= {bound:.1f}"


def test_chi_square_rejects_a_wrong_sampler():
    """Negative control: a sampler 2% off the target's distribution fails the same test."""
    hf = _tiny()
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    exact = _exact_pair_distribution(hf, params)
    keys = list(exact)
    probs = torch.tensor([exact[k] for k in keys])
    probs = (probs + 0.02) / (probs + 0.02).sum()
    picks = draw(probs.expand(N_DECODES, -1), gen).tolist()
    counts = {}
    for i in picks:
        counts[keys[i]] = counts.get(keys[i], 0) + 1
    ok, _, _ = _chi_square_passes(counts, exact, N_DECODES)
    assert not ok

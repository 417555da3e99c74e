import pytest
import torch

from blockdraft.engine.decoder import SpeculativeEngine
from blockdraft.engine.sampling import SamplingParams
from tests.conftest import make_draft


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "jetspec"])
def test_greedy_equals_target_greedy_random_draft(tiny_hf, tiny_target, kind):
    draft = make_draft(tiny_hf, kind)
    engine = SpeculativeEngine(tiny_target, draft)
    for seed in range(3):
        prompt = torch.randint(0, 256, (7,), generator=torch.Generator().manual_seed(seed)).tolist()
        ref = engine.target_generate(prompt, 20).tokens
        res = engine.generate(prompt, 20)
        assert res.tokens == ref
        assert res.stats.num_drafts > 0


def _make_predictable(hf_model, token: int):
    """Hand-set weights so that every position's next token is `token` (embeddings dominate)."""
    with torch.no_grad():
        emb = hf_model.get_input_embeddings().weight
        emb[:, 0] = 5.0
        head = hf_model.get_output_embeddings().weight
        head.normal_(0, 0.02)
        head[token].zero_()
        head[token, 0] = 10.0


def _silence_layers(draft):
    """Draft layers become identity, so each slot's logits follow its own embedding."""
    with torch.no_grad():
        for layer in draft.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "jetspec"])
def test_hand_set_draft_is_fully_accepted(kind):
    from blockdraft.models.target import TargetModel
    from blockdraft.models.tiny_target import build_tiny_model

    hf = build_tiny_model("qwen3", seed=3)
    _make_predictable(hf, token=42)
    target = TargetModel(hf, [1, 3])
    draft = make_draft(hf, kind)
    _silence_layers(draft)
    engine = SpeculativeEngine(target, draft)
    prompt = [5, 6, 7, 8]
    res = engine.generate(prompt, 13)
    assert res.tokens == engine.target_generate(prompt, 13).tokens == [42] * 13
    # 13 tokens = 1 from prefill + 3 steps of (K=3 accepted + 1 bonus).
    assert res.stats.accepted_per_step == [3, 3, 3]
    assert res.stats.mean_acceptance_length == 4.0
    assert res.stats.accepted_per_position() == [3, 3, 3]


def test_reduced_vocabulary_draft_is_lossless_and_drafts_only_its_tokens(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "dflash", draft_vocab_size=64)
    vocab = torch.arange(0, 256, 4)
    draft.set_draft_vocab(vocab, tiny_target.lm_head_weight)
    engine = SpeculativeEngine(tiny_target, draft)
    prompt = [5, 6, 7, 8, 9]
    res = engine.generate(prompt, 20)
    assert res.tokens == engine.target_generate(prompt, 20).tokens
    assert res.stats.num_drafts > 0
    logits = draft.logits(torch.randn(3, draft.config.hidden_size), tiny_target.lm_head_weight)
    assert set(logits.argmax(-1).tolist()) <= set(vocab.tolist())


def test_hand_set_reduced_vocabulary_draft_is_fully_accepted():
    from blockdraft.models.target import TargetModel
    from blockdraft.models.tiny_target import build_tiny_model

    hf = build_tiny_model("qwen3", seed=3)
    _make_predictable(hf, token=42)
    target = TargetModel(hf, [1, 3])
    draft = make_draft(hf, "dflash", draft_vocab_size=16)
    draft.set_draft_vocab(torch.arange(30, 46), target.lm_head_weight)  # 42 is draft id 12
    _silence_layers(draft)
    res = SpeculativeEngine(target, draft).generate([5, 6, 7, 8], 13)
    assert res.tokens == [42] * 13
    assert res.stats.mean_acceptance_length == 4.0


def test_an_accepted_eos_inside_a_block_ends_the_request(tiny_hf, tiny_target):
    """An always-right draft: the request stops at the EOS it drafted, with no bonus token after it."""
    engine = SpeculativeEngine(tiny_target, make_draft(tiny_hf, "dflash"))
    k, prompt = engine.k, [5, 6, 7, 8]
    truth = engine.target_generate(prompt, 24).tokens  # s0 s1 ... (no EOS set yet)
    # An index whose token is new and lands on a drafted slot (not the bonus) of its step.
    eos = next(i for i in range(k + 2, 24) if truth[i] not in truth[:i] and (i - 1) % (k + 1) < k)
    engine.eos = {truth[eos]}

    def oracle(ctx, anchor, anchor_pos, params, gen):
        nxt = truth[anchor_pos - len(prompt) + 1:][:k]
        proposals = torch.tensor(nxt + [0] * (k - len(nxt)))
        return proposals, torch.nn.functional.one_hot(proposals, tiny_hf.config.vocab_size).float(), None

    engine._propose = oracle
    res = engine.generate(prompt, 24)
    assert res.tokens == truth[: eos + 1]
    # Prefill gives s0; each step then adds K accepted drafts and a bonus, until the step that
    # accepts the EOS as its (j+1)-th draft and ends there.
    full_steps, j = divmod(eos - 1, k + 1)
    assert res.stats.accepted_per_step == [k] * full_steps + [j + 1]


@pytest.mark.parametrize("arch", ["qwen3_5", "nemotron_h"])
def test_a_recurrent_target_is_decoded_losslessly_by_re_reading_it(arch):
    """Its Mamba / linear-attention state cannot be cropped after a rejection: the engine re-reads
    the kept tokens, and both decodes equal the model's own cached greedy generation."""
    from blockdraft.models.target import TargetModel
    from blockdraft.models.tiny_target import build_tiny_model

    hf = build_tiny_model(arch, num_layers=4)
    target = TargetModel(hf, [1, 2])
    assert target.family.recurrent
    engine = SpeculativeEngine(target, make_draft(hf, target_layer_ids=[1, 2]))
    prompt = torch.randint(0, 256, (7,), generator=torch.Generator().manual_seed(0)).tolist()
    own = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12)[0, 7:].tolist()
    assert engine.target_generate(prompt, 12).tokens == own
    result = engine.generate(prompt, 12)
    assert result.tokens == own and result.stats.num_drafts > 0

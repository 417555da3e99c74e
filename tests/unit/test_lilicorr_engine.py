"""The reference engine decodes a LiLiCorr draft losslessly, walking its lattice as vLLM's speculator does."""

import torch

from blockdraft.engine.decoder import DraftContext, SpeculativeEngine
from blockdraft.engine.sampling import SamplingParams
from blockdraft.engine.target_state import TargetState
from blockdraft.models.target import TargetModel
from tests.conftest import make_draft
from tests.unit.test_engine_sampling import VOCAB, _tiny, assert_sampling_follows_target


def _off_init(draft):
    """Every head parameter off its zero init, so the walk often leaves the backbone's top-1."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name.startswith("lilicorr."):
                param.normal_(0.0, 0.5)
    return draft


def test_greedy_equals_target_greedy(tiny_hf, tiny_target):
    draft = _off_init(make_draft(tiny_hf, "lilicorr", lilicorr_candidate_topk=4))
    engine = SpeculativeEngine(tiny_target, draft)
    for seed in range(3):
        prompt = torch.randint(0, 256, (7,), generator=torch.Generator().manual_seed(seed)).tolist()
        res = engine.generate(prompt, 20)
        assert res.tokens == engine.target_generate(prompt, 20).tokens
        assert res.stats.num_drafts > 0


def test_the_drafts_are_the_walks_not_the_backbones_argmax(tiny_hf, tiny_target):
    draft = _off_init(make_draft(tiny_hf, "lilicorr", lilicorr_candidate_topk=4))
    engine, k = SpeculativeEngine(tiny_target, draft), draft.config.num_speculative_tokens
    _, feats = TargetState(tiny_target).run(torch.tensor([[5, 6, 7, 8, 9]]), torch.arange(5)[None])
    ctx = DraftContext(draft)
    ctx.extend(feats, torch.arange(5)[None])
    off_top1 = 0
    for anchor in range(8):
        tokens, q, _ = engine._propose(ctx, anchor, 5, SamplingParams(), None)
        assert torch.equal(q.argmax(-1), tokens) and torch.equal(q.sum(-1), torch.ones(k))  # greedy: one-hot
        block = torch.tensor([[anchor] + [draft.config.mask_token_id] * k])
        hidden = draft(draft.embed(block, tiny_target.embed_tokens), torch.arange(5, 6 + k)[None], ctx.kv)
        off_top1 += int((tokens != draft.logits(hidden[0, 1:], tiny_target.lm_head_weight).argmax(-1)).any())
    assert off_top1 > 0


def test_sampled_output_follows_target_distribution():
    hf = _tiny()
    target = TargetModel(hf, [0, 1])
    # A one-layer, narrow head: the walk is the same, and a thousand decodes stay cheap.
    draft = make_draft(hf, "lilicorr", mask_token_id=VOCAB - 1, target_layer_ids=[0, 1], block_size=3,
                       lilicorr_candidate_topk=4, lilicorr_num_layers=1, lilicorr_hidden_size=16, lilicorr_factor_dim=8)
    _off_init(draft)
    with torch.no_grad():  # a draft far from the target, so rejections happen
        draft.fc.weight.mul_(50)
    assert_sampling_follows_target(hf, SpeculativeEngine(target, draft), SamplingParams(temperature=0.8, top_k=4, top_p=0.9))


def test_training_walks_each_block_as_the_engine_drafts_it(tiny_hf, tiny_target):
    """The step's predictions (its greedy walk) equal the engine's proposals for the same block and context:
    the same slot states, anchor state and candidates on both sides."""
    from blockdraft.config.recipe import LoopConfig
    from blockdraft.train.step import train_step
    from tests.unit.test_step import _batch

    draft = _off_init(make_draft(tiny_hf, "lilicorr", lilicorr_candidate_topk=4)).eval()
    engine, batch = SpeculativeEngine(tiny_target, draft), _batch()
    with torch.no_grad():
        res = train_step(draft, tiny_target, batch, LoopConfig(num_anchors=5), torch.Generator().manual_seed(3))
    feats, compared = tiny_target.capture(batch["input_ids"]), 0
    for row, j in res.blocks.anchor_valid.nonzero().tolist():
        a, sup = int(res.blocks.anchors[row, j]), res.blocks.label_mask[row, j, 1:]
        ctx = DraftContext(draft)
        ctx.extend(feats[row:row + 1, :a], batch["position_ids"][row:row + 1, :a])
        tokens, _, _ = engine._propose(ctx, int(batch["input_ids"][row, a]), a, SamplingParams(), None)
        assert torch.equal(tokens[sup], res.pred[row, j, 1:][sup])
        compared += int(sup.sum())
    assert compared > 0

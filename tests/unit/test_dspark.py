"""The DSpark draft in training: its two block layouts, its teacher-forced Markov head and its
confidence loss against a naive one-block-at-a-time computation, and the option values it refuses."""

import pytest
import torch
import torch.nn.functional as F

from blockdraft.config.recipe import LoopConfig
from blockdraft.errors import ConfigError
from blockdraft.losses.block import slot_weights
from blockdraft.train.step import draw_blocks, train_step
from tests.conftest import MASK_ID, make_draft
from tests.unit.test_step import _batch


def _dspark(tiny_hf, **overrides):
    draft = make_draft(tiny_hf, "dspark", markov_rank=8, **overrides)
    with torch.no_grad():  # a fresh Markov head adds nothing: move it so the test sees it
        draft.markov_head.markov_w2.weight.normal_(0.0, 0.5)
    return draft


def _naive_loss(draft, target, batch, cfg, blocks):
    """Each block alone, fed as vLLM's DSpark speculator feeds it: [anchor, MASK x (B-1)] at positions
    a..a+B-1 whose slot q predicts the token at a+q+1 (sample_from_anchor), or DFlash's block whose
    slot k predicts its own token. The Markov head reads the true previous token."""
    c = draft.config
    b_fed, shift = (c.block_size, 1) if c.sample_from_anchor else (c.block_size, 0)
    feats = target.capture(batch["input_ids"])
    ce_sum = conf_sum = weight = 0.0
    for row in range(batch["input_ids"].shape[0]):
        for j, (a, ok) in enumerate(zip(blocks.anchors[row].tolist(), blocks.anchor_valid[row].tolist())):
            if not ok:
                continue
            kv = draft.context_kv(feats[row:row + 1, :a], batch["position_ids"][row:row + 1, :a])
            ids = torch.tensor([[batch["input_ids"][row, a].item()] + [MASK_ID] * (b_fed - 1)])
            hidden = draft(draft.embed(ids, target.embed_tokens), torch.arange(a, a + b_fed)[None], kv)[0]
            for k in range(1, c.num_speculative_tokens + 1):  # label slot k: the token at a + k
                if not blocks.label_mask[row, j, k]:
                    continue
                h = hidden[k - shift]
                previous = batch["input_ids"][row, a + k - 1]
                logits = draft.corrected_logits(h, previous, target.lm_head_weight)
                label = batch["input_ids"][row, a + k]
                w = float(slot_weights(torch.tensor(k - 1), cfg.gamma))
                accepted = float(logits.argmax() == label)
                confidence = draft.confidence_logits(draft.joint_hidden(h, previous))
                ce_sum += w * F.cross_entropy(logits, label)
                conf_sum += w * F.binary_cross_entropy_with_logits(confidence, torch.tensor(accepted))
                weight += w
    return (ce_sum + cfg.confidence_weight * conf_sum) / weight


@pytest.mark.parametrize("sample_from_anchor", [True, False])
def test_batched_step_equals_naive_per_block_loop(tiny_hf, tiny_target, sample_from_anchor):
    draft = _dspark(tiny_hf, sample_from_anchor=sample_from_anchor)
    cfg = LoopConfig(num_anchors=5, gamma=4.0, confidence_weight=0.5)
    batch = _batch()
    labels_block = draft.config.num_speculative_tokens + 1
    blocks = draw_blocks(batch, cfg, labels_block, MASK_ID, torch.Generator().manual_seed(3))
    result = train_step(draft, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    torch.testing.assert_close(result.loss, _naive_loss(draft, tiny_target, batch, cfg, blocks), rtol=1e-5, atol=1e-5)
    # Every drafted token is a label slot: block_size of them when the anchor predicts.
    assert result.pred.shape[-1] == labels_block == draft.config.block_size + (1 if sample_from_anchor else 0)
    assert {"confidence_loss_sum", "correction_base_correct"} <= set(result.sums)


def test_the_markov_head_is_trained_and_a_fresh_one_adds_nothing(tiny_hf, tiny_target):
    fresh = make_draft(tiny_hf, "dspark", markov_rank=8)
    dflash = make_draft(tiny_hf, "dflash")
    hidden, previous = torch.randn(3, 64), torch.tensor([1, 2, 3])
    # Equal up to the GEMM's summation order: [h ; e] against [W ; 0] takes another kernel blocking than h
    # against W on some CPUs (AVX-512), so exact equality would test the BLAS, not the head.
    torch.testing.assert_close(fresh.corrected_logits(hidden, previous, tiny_target.lm_head_weight),
                               dflash.draft_logits(hidden, tiny_target.lm_head_weight), rtol=0, atol=1e-5)
    cfg = LoopConfig(num_anchors=5)
    train_step(fresh, tiny_target, _batch(), cfg, torch.Generator().manual_seed(0)).loss.backward()
    assert fresh.markov_head.markov_w2.weight.grad.abs().sum() > 0
    assert fresh.confidence_head.proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("overrides,message", [
    (dict(markov_rank=0), "draft.markov_rank=0"),
    (dict(markov_head_type="gated"), "implements only ['vanilla']"),
    (dict(train_mask_embedding=True), "ignores a mask embedding"),
    (dict(dspark_draft_topk=0), "draft.dspark_draft_topk=0 must be in"),
    (dict(dspark_draft_topk=10_000), "draft.dspark_draft_topk=10000 must be in"),
])
def test_option_values_vllm_cannot_serve_are_refused(tiny_hf, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make_draft(tiny_hf, "dspark", **overrides)


def test_without_the_confidence_head_it_reads_no_markov_input(tiny_hf):
    draft = make_draft(tiny_hf, "dspark", markov_rank=8, enable_confidence_head=False)
    assert draft.confidence_head is None and not draft.config.confidence_head_with_markov


def test_a_dspark_config_without_dflash_config_reads_as_vllm_reads_it():
    """DSpark's own configs keep the backbone's keys at the top level (dspark_* or plain names), which
    vLLM reads when there is no dflash_config; the importer reads them the same way."""
    from blockdraft.draft_format.config_reader import draft_config_from_vllm_config
    from blockdraft.export.vllm_config import vllm_config
    from tests.unit.export_helpers import draft_config

    written = vllm_config(draft_config("dspark", markov_rank=8))
    native = {k: v for k, v in written.items() if k not in ("dflash_config", "target_layer_ids", "mask_token_id", "block_size")}
    native.update(dspark_target_layer_ids=[1, 3], dspark_noise_token_id=262, dspark_block_size=4)
    read = draft_config_from_vllm_config(native)
    assert (read.target_layer_ids, read.mask_token_id, read.block_size, read.markov_rank) == ([1, 3], 262, 4, 8)


def test_the_backbones_own_accuracy_is_counted_in_target_ids_with_a_reduced_vocabulary(tiny_hf, tiny_target):
    """`base_acc` (correction_base_correct): the backbone's argmax, a draft id, is compared with the label as the
    target id it stands for. A fresh Markov head adds nothing, so the backbone is right exactly where the draft is."""
    draft = make_draft(tiny_hf, "dspark", markov_rank=8, draft_vocab_size=64)
    draft.set_draft_vocab(torch.arange(64) * 3 % tiny_hf.config.vocab_size, tiny_target.lm_head_weight)
    cfg = LoopConfig(num_anchors=5, gamma=4.0)
    result = train_step(draft, tiny_target, _batch(), cfg, torch.Generator().manual_seed(3))
    sup = result.blocks.label_mask
    correct = (result.pred[sup] == result.blocks.labels[sup]).sum().float()
    assert correct > 0
    assert result.sums["correction_base_correct"] == correct

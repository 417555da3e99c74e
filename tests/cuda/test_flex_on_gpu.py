"""FlexAttention on the GPU: the compiled block masks are the dense SDPA masks, and training
steps through either backend agree."""

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_mask

from blockdraft.config.recipe import LoopConfig
from blockdraft.models.layers import attend
from blockdraft.models.target import TargetModel
from blockdraft.models.tiny_target import build_tiny_model
from blockdraft.train.masks import block_mask_mod, dense_block_mask, flex_block_mask
from blockdraft.train.step import draw_blocks, train_step
from tests.conftest import make_draft
from tests.cuda.gpu_helpers import assert_grads_close, grads_of, needs_cuda, packed_batch

pytestmark = needs_cuda
CFG = LoopConfig(num_anchors=8, gamma=4.0)


@pytest.fixture(scope="module")
def gpu_target():
    return TargetModel(build_tiny_model("qwen3", seed=0).cuda(), [1, 3])


def _mask_inputs(batch, block_size=4, seed=3):
    blocks = draw_blocks(batch, CFG, block_size, 262, torch.Generator().manual_seed(seed))
    return (blocks.anchors, blocks.anchor_valid, batch["attention_mask"], batch["document_ids"],
            batch["position_ids"], blocks.block_position_ids, block_size)


@pytest.mark.parametrize("window", [None, 8])
def test_flex_mask_rule_equals_the_dense_mask_on_gpu(window):
    args = _mask_inputs(packed_batch())
    dense = dense_block_mask(*args, sliding_window=window)  # [N, 1, Q, KV]
    n, _, q, kv = dense.shape
    from_mod = create_mask(block_mask_mod(*args, sliding_window=window), n, 1, q, kv, device="cuda")
    assert torch.equal(from_mod, dense)


@pytest.mark.parametrize("window", [None, 8])
def test_compiled_flex_attention_equals_sdpa_in_bf16(window):
    args = _mask_inputs(packed_batch(t=160))
    dense = dense_block_mask(*args, sliding_window=window)
    block = flex_block_mask(*args, sliding_window=window)
    n, _, q_len, kv_len = dense.shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(n, 8, q_len, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(n, 2, kv_len, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(n, 2, kv_len, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    flex = attend(q, k, v, block)  # compiled on CUDA
    sdpa = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=dense, enable_gqa=True)
    torch.testing.assert_close(flex.float(), sdpa, rtol=2e-2, atol=2e-2)


def _step(draft, target, batch, backend, cfg=CFG, seed=5):
    draft.zero_grad(set_to_none=True)
    result = train_step(draft, target, batch, cfg, torch.Generator().manual_seed(seed), backend)
    result.loss.backward()
    return result, grads_of(draft)


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_flex_and_sdpa_training_steps_agree(gpu_target, kind):
    draft = make_draft(gpu_target.model, kind).cuda()
    batch = packed_batch()
    flex, flex_grads = _step(draft, gpu_target, batch, "flex")
    sdpa, sdpa_grads = _step(draft, gpu_target, batch, "sdpa")
    torch.testing.assert_close(flex.loss, sdpa.loss, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(flex.sums["accept_len_sum"], sdpa.sums["accept_len_sum"])
    assert_grads_close(flex_grads, sdpa_grads, rtol=1e-3, atol=1e-5)


def test_flex_compiles_once_more_when_row_lengths_change(gpu_target):
    """Rows differ in length every step: after the first change the kernel is dynamic, so no
    recompile per length, and flex never falls back to its unfused path."""
    from torch._dynamo.utils import counters

    draft = make_draft(gpu_target.model, "dflash").cuda()
    _step(draft, gpu_target, packed_batch(t=96), "flex")  # compiled for the first length
    before = counters["stats"]["unique_graphs"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for t in (112, 136, 200, 248):
            result, _ = _step(draft, gpu_target, packed_batch(t=t, seed=t), "flex")
            assert torch.isfinite(result.loss)
    assert not [w for w in seen if "without torch.compile" in str(w.message)]
    assert counters["stats"]["unique_graphs"] - before <= 2


def test_activation_checkpointing_gives_the_same_gradients_with_flex(gpu_target):
    draft = make_draft(gpu_target.model, "dflash2").cuda()
    batch = packed_batch()
    _, plain = _step(draft, gpu_target, batch, "flex")
    draft.activation_checkpointing = True
    _, recomputed = _step(draft, gpu_target, batch, "flex")
    assert_grads_close(recomputed, plain, rtol=1e-4, atol=1e-6)


def test_sliding_window_flex_step_equals_sdpa(gpu_target):
    draft = make_draft(gpu_target.model, "dflash", sliding_window=16).cuda()
    batch = packed_batch(t=128)
    flex, flex_grads = _step(draft, gpu_target, batch, "flex", dataclasses.replace(CFG, num_anchors=12))
    sdpa, sdpa_grads = _step(draft, gpu_target, batch, "sdpa", dataclasses.replace(CFG, num_anchors=12))
    torch.testing.assert_close(flex.loss, sdpa.loss, rtol=1e-4, atol=1e-5)
    assert_grads_close(flex_grads, sdpa_grads, rtol=1e-3, atol=1e-5)

"""Block attention masks: a naive rule, dense vs flex, and leak checks."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from blockdraft.errors import ConfigError
from blockdraft.train.anchors import build_blocks, sample_anchors, valid_anchor_mask
from blockdraft.train.masks import block_mask_mod, dense_block_mask, flex_block_mask

B, A, T = 4, 5, 20

# Eager flex_attention on CPU materialises the scores; fine for these tiny checks.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def make_inputs():
    """Row 0: docs of 9 and 11 tokens. Row 1: docs of 7 and 6, pad, and 2 padding blocks."""
    g = torch.Generator().manual_seed(0)
    doc = torch.tensor([[0] * 9 + [1] * 11, [0] * 7 + [1] * 6 + [-1] * 7])  # [N, T]
    attention_mask = doc >= 0
    position_ids = torch.tensor([list(range(9)) + list(range(11)),
                                 list(range(7)) + list(range(6)) + [0] * 7])
    loss_mask = attention_mask.clone()
    valid = valid_anchor_mask(loss_mask, attention_mask, doc, B)
    anchors, anchor_valid = sample_anchors(valid, A, g)
    anchors[1, 3:] = 0  # force two padding blocks in row 1
    anchor_valid[1, 3:] = False
    input_ids = torch.randint(0, 30, (2, T), generator=g)
    blocks = build_blocks(input_ids, position_ids, loss_mask, doc, anchors, anchor_valid,
                          torch.ones_like(anchors), B, 31)
    return dict(anchors=anchors, anchor_valid=anchor_valid, attention_mask=attention_mask,
                document_ids=doc, position_ids=position_ids,
                block_position_ids=blocks.block_position_ids, block_size=B)


@pytest.fixture(scope="module")
def inputs():
    return make_inputs()


@pytest.fixture(scope="module")
def flex_masks(inputs):
    """Built once: the first BlockMask pays torch's one-off compiler-stack import."""
    return {window: flex_block_mask(**inputs, sliding_window=window) for window in (None, 3)}


def naive_mask(x, sliding_window=None):
    """The rule, one (query, key) pair at a time."""
    n = x["anchors"].shape[0]
    out = torch.zeros(n, A * B, T + A * B, dtype=torch.bool)
    for row in range(n):
        for q in range(A * B):
            j = q // B
            a, ok = int(x["anchors"][row, j]), bool(x["anchor_valid"][row, j])
            q_pos = x["block_position_ids"][row, q]
            for key in range(T + A * B):
                if key < T:
                    seen = (ok and key < a and bool(x["attention_mask"][row, key])
                            and x["document_ids"][row, key] == x["document_ids"][row, a])
                    k_pos = x["position_ids"][row, key]
                else:
                    seen = (key - T) // B == j
                    k_pos = x["block_position_ids"][row, key - T]
                if sliding_window is not None:
                    seen = seen and bool(k_pos > q_pos - sliding_window)
                out[row, q, key] = seen
    return out


def mask_mod_grid(x, sliding_window=None):
    """Evaluate the flex mask_mod on every (b, q, kv) by broadcasting its indices."""
    mod = block_mask_mod(**x, sliding_window=sliding_window)
    n = x["anchors"].shape[0]
    b = torch.arange(n).view(n, 1, 1)
    q = torch.arange(A * B).view(1, -1, 1)
    kv = torch.arange(T + A * B).view(1, 1, -1)
    return mod(b, torch.zeros(()), q, kv).expand(n, A * B, T + A * B)


@pytest.mark.parametrize("window", [None, 3])
def test_dense_and_mask_mod_equal_the_naive_rule(inputs, window):
    want = naive_mask(inputs, window)
    assert torch.equal(dense_block_mask(**inputs, sliding_window=window)[:, 0], want)
    assert torch.equal(mask_mod_grid(inputs, window), want)


@pytest.mark.parametrize("window", [None, 3])
def test_flex_attention_equals_sdpa_with_the_dense_mask(inputs, flex_masks, window):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, A * B, 8, generator=g)  # [N, heads, A*B, D]
    k, v = torch.randn(2, 2, 2, T + A * B, 8, generator=g)  # [N, heads, T+A*B, D] each
    dense = dense_block_mask(**inputs, sliding_window=window)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    flex = flex_attention(q, k, v, block_mask=flex_masks[window])
    assert torch.allclose(sdpa, flex, atol=1e-5)


def test_no_query_sees_its_anchor_or_later_context_or_another_block(inputs):
    mask = dense_block_mask(**inputs)[:, 0]  # [N, A*B, T+A*B]
    for row in range(2):
        for j in range(A):
            rows = mask[row, j * B:(j + 1) * B]  # [B, T+A*B]
            a = int(inputs["anchors"][row, j])
            assert not rows[:, a:T].any()
            others = torch.ones(A * B, dtype=torch.bool)
            others[j * B:(j + 1) * B] = False
            assert not rows[:, T:][:, others].any()
            assert rows[:, T + j * B:T + (j + 1) * B].all()  # whole own block, both ways


def test_document_boundaries_and_padding_are_respected(inputs):
    mask = dense_block_mask(**inputs)[:, 0]
    doc = inputs["document_ids"]
    for row in range(2):
        for j in range(A):
            a = int(inputs["anchors"][row, j])
            seen = mask[row, j * B, :T]  # [T]
            assert (doc[row][seen] == doc[row, a]).all()
            assert inputs["attention_mask"][row][seen].all()
            if inputs["anchor_valid"][row, j]:
                same_doc_before = (doc[row, :a] == doc[row, a]).sum()
                assert seen.sum() == same_doc_before  # everything allowed is seen


def attend(mask, ctx_feats, block_feats):
    """One attention layer: queries from blocks, keys/values from [context | blocks]."""
    q = block_feats.unsqueeze(1)  # [N, 1, A*B, D]
    kv = torch.cat([ctx_feats, block_feats], dim=1).unsqueeze(1)  # [N, 1, T+A*B, D]
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)[:, 0]
    return flex_attention(q, kv, kv, block_mask=mask)[:, 0]


@pytest.mark.parametrize("use_flex", [False, True])
def test_perturbing_later_context_or_other_blocks_leaves_a_block_unchanged(
    inputs, flex_masks, use_flex
):
    mask = flex_masks[None] if use_flex else dense_block_mask(**inputs)
    g = torch.Generator().manual_seed(2)
    ctx = torch.randn(2, T, 8, generator=g)  # [N, T, D]
    blocks = torch.randn(2, A * B, 8, generator=g)  # [N, A*B, D]
    base = attend(mask, ctx, blocks)  # [N, A*B, D]
    for j in range(A):
        ctx_p, blocks_p = ctx.clone(), blocks.clone()
        for row in range(2):
            a = int(inputs["anchors"][row, j])
            ctx_p[row, a:] += 5.0
            if not inputs["anchor_valid"][row, j]:
                ctx_p[row] += 5.0  # a padding block sees no context at all
        blocks_p[:, :j * B] += 5.0
        blocks_p[:, (j + 1) * B:] += 5.0
        out = attend(mask, ctx_p, blocks_p)
        assert torch.allclose(out[:, j * B:(j + 1) * B], base[:, j * B:(j + 1) * B], atol=1e-6)


def test_padding_blocks_produce_no_nan(inputs):
    x = dict(inputs, anchor_valid=torch.zeros_like(inputs["anchor_valid"]))
    g = torch.Generator().manual_seed(3)
    mask = dense_block_mask(**x)
    out = attend(mask, torch.randn(2, T, 8, generator=g), torch.randn(2, A * B, 8, generator=g))
    assert not out.isnan().any()
    assert mask.any(dim=-1).all()  # no empty softmax row


def test_sliding_window_compares_position_ids(inputs):
    window = 3
    mask = dense_block_mask(**inputs, sliding_window=window)[:, 0]
    key_pos = torch.cat([inputs["position_ids"], inputs["block_position_ids"]], dim=1)
    q_pos = inputs["block_position_ids"]
    for row in range(2):
        for q in range(A * B):
            seen_pos = key_pos[row][mask[row, q]]
            assert (seen_pos > q_pos[row, q] - window).all()
            assert mask[row, q, T + q]  # a slot always sees itself


def test_a_window_below_one_is_a_config_error(inputs):
    with pytest.raises(ConfigError, match="sliding_window"):
        dense_block_mask(**inputs, sliding_window=0)
    with pytest.raises(ConfigError, match="sliding_window"):
        block_mask_mod(**inputs, sliding_window=0)


def test_a_causal_slot_sees_its_context_and_the_slots_up_to_its_own(inputs):
    # JetSpec: the context rule is DFlash's; inside its block slot k sees slots 0..k only.
    full, causal = dense_block_mask(**inputs)[:, 0], dense_block_mask(**inputs, causal=True)[:, 0]
    assert torch.equal(causal[:, :, :T], full[:, :, :T])
    slot = torch.arange(A * B)
    own = full[:, :, T:] & (slot[None, :] <= slot[:, None])
    assert torch.equal(causal[:, :, T:], own)
    assert torch.equal(mask_mod_grid_causal(inputs), causal)


def mask_mod_grid_causal(x):
    mod = block_mask_mod(**x, causal=True)
    b = torch.arange(2).view(2, 1, 1)
    return mod(b, torch.zeros(()), torch.arange(A * B).view(1, -1, 1), torch.arange(T + A * B).view(1, 1, -1)).expand(2, A * B, T + A * B)


def test_causal_flex_attention_equals_sdpa_with_the_dense_mask(inputs):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 2, A * B, 8, generator=g)
    k, v = torch.randn(2, 2, 2, T + A * B, 8, generator=g)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_block_mask(**inputs, causal=True))
    flex = flex_attention(q, k, v, block_mask=flex_block_mask(**inputs, causal=True))
    assert torch.allclose(sdpa, flex, atol=1e-5)

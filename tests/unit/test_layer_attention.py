"""A draft whose layers attend differently (speculators' sliding layers causal inside the block beside
bidirectional full ones): training's many-block masks, one per layer, give each block what the
reference engine's one-block forward gives it, and the layer types change the outcome."""

import pytest
import torch

from blockdraft.models.layers import per_layer_masks
from blockdraft.train.anchors import build_blocks
from blockdraft.train.masks import dense_block_mask
from tests.unit.export_helpers import make_draft

T = 20
MIXED = ["sliding_attention", "full_attention"]


def trained_blocks(draft, embed, anchors, features, input_ids):
    """Every block at once, as the training step computes them: [A, B, H]."""
    cfg = draft.config
    b = cfg.block_size
    positions = torch.arange(T)[None]
    ones = torch.ones(1, T, dtype=torch.bool)
    doc = torch.zeros(1, T, dtype=torch.long)
    valid = torch.ones_like(anchors, dtype=torch.bool)
    blocks = build_blocks(input_ids, positions, ones, doc, anchors, valid, torch.ones_like(anchors), b, cfg.mask_token_id)
    masks = per_layer_masks(cfg.layer_attention(), lambda window, causal: dense_block_mask(
        anchors, valid, ones, doc, positions, blocks.block_position_ids, b, window, causal))
    embeds = draft.embed(blocks.block_ids, embed)
    hidden = draft(embeds, blocks.block_position_ids, draft.context_kv(features, positions), masks, b)
    return hidden.view(anchors.shape[1], b, -1)


def served_block(draft, embed, anchor, features, input_ids):
    """One block over the context before its anchor, as the reference engine drafts it: [B, H]."""
    b = draft.config.block_size
    block = torch.full((1, b), draft.config.mask_token_id)
    block[0, 0] = input_ids[0, anchor]
    kv = draft.context_kv(features[:, :anchor], torch.arange(anchor)[None])
    return draft(draft.embed(block, embed), torch.arange(anchor, anchor + b)[None], kv)[0]


def inputs(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    features = torch.randn(1, T, len(cfg.target_layer_ids) * cfg.target_hidden_size, generator=g)
    return embed, features, torch.randint(0, cfg.vocab_size, (1, T), generator=g)


@pytest.mark.parametrize("layer_types, sliding_causal", [(MIXED, True), (MIXED, False), (None, True)])
def test_training_s_masks_give_each_block_what_serving_gives_it(layer_types, sliding_causal):
    draft = make_draft("dflash", num_layers=2, sliding_window=6, layer_types=layer_types, sliding_causal=sliding_causal)
    embed, features, input_ids = inputs(draft.config, 0)
    anchors = torch.tensor([[3, 8, 14]])  # contexts shorter and longer than the window
    with torch.no_grad():
        trained = trained_blocks(draft, embed, anchors, features, input_ids)
        for j, anchor in enumerate(anchors[0].tolist()):
            torch.testing.assert_close(trained[j], served_block(draft, embed, anchor, features, input_ids), atol=1e-5, rtol=0)


def test_each_layer_keeps_its_own_attention():
    draft = make_draft("dflash", num_layers=2, sliding_window=6, layer_types=MIXED, sliding_causal=True)
    assert draft.config.layer_attention() == [(6, True), (None, False)]
    embed, features, input_ids = inputs(draft.config, 1)
    with torch.no_grad():
        mixed = served_block(draft, embed, 14, features, input_ids)
        for layer_types, causal in ((None, True), (MIXED, False), (["full_attention"] * 2, False)):
            draft.config.layer_types, draft.config.sliding_causal = layer_types, causal
            assert not torch.allclose(served_block(draft, embed, 14, features, input_ids), mixed, atol=1e-4), (layer_types, causal)

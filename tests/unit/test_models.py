import pytest
import torch

from blockdraft.kinds.dflash2.model import DynamicBlockConv
from tests.conftest import make_draft


def _inputs(draft, tiny_target, n_blocks=3, ctx_len=10):
    cfg = draft.config
    feats = torch.randn(2, ctx_len, len(cfg.target_layer_ids) * cfg.target_hidden_size)
    ctx_pos = torch.arange(ctx_len).expand(2, -1)
    ids = torch.randint(0, 256, (2, n_blocks * cfg.block_size))
    pos = torch.arange(ids.shape[1]).expand(2, -1) + ctx_len
    return feats, ctx_pos, draft.embed(ids, tiny_target.embed_tokens), pos


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_forward_shapes(tiny_hf, tiny_target, kind):
    draft = make_draft(tiny_hf, kind)
    feats, ctx_pos, embeds, pos = _inputs(draft, tiny_target)
    kv = draft.context_kv(feats, ctx_pos)
    assert kv[0][0].shape == (2, draft.config.num_key_value_heads, 10, draft.config.head_dim)
    hidden = draft(embeds, pos, kv, None, draft.config.block_size)
    assert hidden.shape == embeds.shape
    logits = draft.logits(hidden, tiny_target.lm_head_weight)
    assert logits.shape == (2, embeds.shape[1], tiny_target.vocab_size)


def test_draft_attention_shape_may_differ_from_target(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "dflash", hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48)
    feats, ctx_pos, _, pos = _inputs(draft, tiny_target)
    embeds = torch.randn(2, pos.shape[1], 32)
    assert draft(embeds, pos, draft.context_kv(feats, ctx_pos)).shape == (2, pos.shape[1], 32)
    assert draft.fc.weight.shape == (32, 2 * 64)


def test_fresh_dflash2_equals_dflash_on_shared_weights(tiny_hf, tiny_target):
    d1 = make_draft(tiny_hf, "dflash")
    d2 = make_draft(tiny_hf, "dflash2", seed=7)
    missing, unexpected = d2.load_state_dict(d1.state_dict(), strict=False)
    assert not unexpected
    assert all(".attention_conv." in k or ".mlp_conv." in k or k.startswith("candidate_selector.") for k in missing)
    feats, ctx_pos, embeds, pos = _inputs(d1, tiny_target)
    h1 = d1(embeds, pos, d1.context_kv(feats, ctx_pos), None, 4)
    h2 = d2(embeds, pos, d2.context_kv(feats, ctx_pos), None, 4)
    assert torch.equal(h1, h2)
    # A fresh selector's greedy walk picks each slot's argmax, exactly as DFlash does.
    logits = d2.logits(h2, tiny_target.lm_head_weight)
    tokens, _ = d2.candidate_selector.walk(h2[:, 1:4], logits[:, 1:4], torch.tensor([3, 4]), 8)
    assert torch.equal(tokens, logits[:, 1:4].argmax(-1))


def test_conv_never_crosses_a_block_boundary():
    torch.manual_seed(0)
    conv = DynamicBlockConv(hidden_size=8, taps=3, group_size=2)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x = torch.randn(1, 12, 8)  # 3 blocks of 4
    coef = conv.coefficients(x)
    out = conv(x, coef, 0, 4)
    x2 = x.clone()
    x2[:, 4:8] += 100.0  # change block 1 only
    out2 = conv(x2, coef, 0, 4)
    assert torch.equal(out[:, :4], out2[:, :4]) and torch.equal(out[:, 8:], out2[:, 8:])
    # Inside a block, position 0 sees only itself: tap 0.
    expected0 = (conv.base_kernel[0, 0] + coef[0, 0, 0, 0].repeat_interleave(2)) * x[0, 0]
    torch.testing.assert_close(out[0, 0], expected0)


def test_conv_formula_against_naive_loop():
    torch.manual_seed(1)
    h, taps, g, block = 6, 2, 3, 3
    conv = DynamicBlockConv(h, taps, g)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x = torch.randn(1, 6, h)
    coef = conv.coefficients(x)
    out = conv(x, coef, 1, block)
    naive = torch.zeros_like(x)
    for t in range(6):
        for c in range(h):
            for s in range(taps):
                if t % block >= s:
                    naive[0, t, c] += (conv.base_kernel[1, s, c] + coef[0, t, 1, s, c // g]) * x[0, t - s, c]
    torch.testing.assert_close(out, naive)


def test_init_from_target_copies_the_last_layers(tiny_hf):
    from blockdraft.models.init_from_target import init_draft_from_target

    draft = make_draft(tiny_hf, "dflash2", num_layers=2)
    copied = init_draft_from_target(draft, tiny_hf)
    last = tiny_hf.model.layers[-1]
    assert torch.equal(draft.layers[1].mlp.down_proj.weight, last.mlp.down_proj.weight)
    assert torch.equal(draft.layers[0].self_attn.q_norm.weight, tiny_hf.model.layers[-2].self_attn.q_norm.weight)
    assert torch.equal(draft.norm.weight, tiny_hf.model.norm.weight)
    feats = torch.randn(1, 3, 128)
    torch.testing.assert_close(draft.fc(feats), feats[..., 64:])  # passes the deepest feature through
    assert "layers.1.self_attn.o_proj.weight" in copied
    assert not any("attention_conv" in name or "candidate_selector" in name for name in copied)


def test_init_from_target_reads_the_same_weights_from_safetensors(tiny_hf, tmp_path):
    """From a feature store the target's layers are never built: the copy reads them from its files."""
    from blockdraft.models.init_from_target import init_draft_from_safetensors, init_draft_from_target

    tiny_hf.save_pretrained(tmp_path, safe_serialization=True)
    from_model, from_files = make_draft(tiny_hf, "dflash", num_layers=2), make_draft(tiny_hf, "dflash", num_layers=2, seed=5)
    copied = init_draft_from_target(from_model, tiny_hf)
    assert init_draft_from_safetensors(from_files, tmp_path) == copied
    for (name, a), (_, b) in zip(from_model.state_dict().items(), from_files.state_dict().items()):
        assert torch.equal(a, b), name


def test_init_from_target_names_a_target_without_layer_tensors(tiny_hf, tmp_path):
    from safetensors.torch import save_file

    from blockdraft.errors import ConfigError
    from blockdraft.models.init_from_target import init_draft_from_safetensors

    tiny_hf.config.save_pretrained(tmp_path)
    save_file({"model.embed_tokens.weight": tiny_hf.model.embed_tokens.weight.detach().clone()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match="no decoder layer tensors"):
        init_draft_from_safetensors(make_draft(tiny_hf, "dflash"), tmp_path)

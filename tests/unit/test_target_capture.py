import torch

from blockdraft.models.target import TargetModel
from blockdraft.models.tiny_target import build_tiny_model


def test_capture_equals_hidden_states_offset(tiny_hf):
    ids = torch.randint(0, 256, (2, 12))
    target = TargetModel(tiny_hf, [0, 2, 4])
    feats = target.capture(ids)
    hs = tiny_hf(ids, output_hidden_states=True).hidden_states
    expected = torch.cat([hs[1], hs[3], hs[5]], dim=-1)  # layer i = hidden_states[i + 1]
    torch.testing.assert_close(feats, expected)


def test_capture_stops_after_last_needed_layer(tiny_hf):
    target = TargetModel(tiny_hf, [1, 2])
    ran = []
    handles = [layer.register_forward_pre_hook(lambda m, a, i=i: ran.append(i)) for i, layer in enumerate(target.decoder_layers)]
    try:
        target.capture(torch.randint(0, 256, (1, 8)))
    finally:
        for h in handles:
            h.remove()
    assert ran == [0, 1, 2]


def test_full_forward_returns_logits_and_same_features(tiny_hf):
    target = TargetModel(tiny_hf, [1, 3])
    ids = torch.randint(0, 256, (1, 10))
    logits, feats = target.forward(ids)
    torch.testing.assert_close(logits, tiny_hf(ids).logits)
    torch.testing.assert_close(feats, target.capture(ids))


def test_moe_target_capture():
    moe = build_tiny_model("qwen3_moe", seed=0)
    ids = torch.randint(0, 256, (1, 9))
    feats = TargetModel(moe, [1]).capture(ids)
    torch.testing.assert_close(feats, moe(ids, output_hidden_states=True).hidden_states[2])

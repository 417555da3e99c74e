"""A draft built on the meta device and materialised by replaying its construction (models/meta_build.py) has,
for one seed, the very weights of a host build, for every kind in configs/draft/, and leaves the CPU generator
where a host build leaves it; the host never holds more than the tensors being initialised; a construction that
cannot replay falls back to the host build, said, with the same weights."""

import logging
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from blockdraft.models import build_draft
from blockdraft.models.draft_config import DraftModelConfig
from blockdraft.models.meta_build import Plan, build_draft_on, record
from blockdraft.models.resolve import DraftConfig, resolve_draft_config
from tests.conftest import MASK_ID

DRAFT_FILES = sorted((Path(__file__).resolve().parents[2] / "configs" / "draft").glob("*.yaml"))
# Beyond each kind's file: the draft's own reduced head (a buffer, d2t) and a trained mask embedding.
VARIANTS = {"dflash": [{"draft_vocab_size": 64, "train_mask_embedding": True}],
            "jetspec": [{"draft_vocab_size": 64}],
            "dspark": [{"enable_confidence_head": False}],
            "lilicorr": [{"conv_kernel_size": 0, "conv_group_size": 0}]}


def kind_configs(hf_config):
    for path in DRAFT_FILES:
        settings = yaml.safe_load(path.read_text())
        settings.update(num_layers=2, block_size=4, mask_token_id=MASK_ID, target_layer_ids=[1, 3])
        if settings.get("conv_group_size"):
            settings["conv_group_size"] = 8  # the tiny target's width is 64
        for extra in [{}, *VARIANTS.get(settings["kind"], [])]:
            yield f"{path.stem}{extra or ''}", resolve_draft_config(DraftConfig(**{**settings, **extra}), hf_config)


def snapshot(model):
    params = {n: (p.detach().clone(), p.dtype, p.requires_grad, dict(vars(p))) for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    return params, buffers


@pytest.mark.parametrize("seed", [0, 7])
def test_every_kind_gets_the_host_builds_weights_and_generator_state(tiny_hf, caplog, seed):
    built = list(kind_configs(tiny_hf.config))
    assert {cfg.kind for _, cfg in built} == {p.stem for p in DRAFT_FILES} == {
        "dflash", "dflash2", "jetspec", "domino", "dspark", "lilicorr"}
    for name, cfg in built:
        torch.manual_seed(seed)
        host = build_draft(cfg)
        host_rng = torch.get_rng_state()
        torch.manual_seed(seed)
        with caplog.at_level(logging.WARNING, logger="blockdraft.models.meta_build"):
            replayed = build_draft_on(cfg, "cpu")
        assert not caplog.records, f"{name} fell back to the host build: {caplog.text}"
        assert torch.equal(torch.get_rng_state(), host_rng), f"{name}: the generator was left elsewhere"
        (want_p, want_b), (got_p, got_b) = snapshot(host), snapshot(replayed)
        assert list(got_p) == list(want_p) and list(got_b) == list(want_b), name
        for key, (value, dtype, grad, attrs) in want_p.items():
            got = got_p[key]
            assert torch.equal(got[0], value) and (got[1], got[2], got[3]) == (dtype, grad, attrs), f"{name}: {key}"
        for key, value in want_b.items():
            assert got_b[key].dtype == value.dtype and torch.equal(got_b[key], value), f"{name}: buffer {key}"
        assert all(p.device.type == "cpu" for p in replayed.parameters())


def mid_sized(kind: str) -> DraftModelConfig:
    return DraftModelConfig(kind=kind, hidden_size=256, intermediate_size=768, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=64, vocab_size=4096, target_hidden_size=256,
                            num_target_layers=8, target_layer_ids=[1, 3, 6], mask_token_id=5, block_size=4,
                            conv_group_size=16 if kind in ("dflash2", "lilicorr") else 1, correction_hidden_size=256)


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "domino", "dspark", "lilicorr"])
def test_the_host_holds_the_tensors_being_initialised_not_the_draft(kind):
    torch.manual_seed(0)
    plan = Plan(*record(lambda: build_draft(mid_sized(kind))))
    model = plan.materialise(lambda t: t.clone())
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    # DFlash2's selector codebook is drawn, then scaled into a second tensor: two of the largest at most.
    assert plan.peak_host_bytes <= 2 * max(sizes) and plan.peak_host_bytes < sum(sizes) / 2


def test_what_goes_to_the_device_is_each_final_value_once():
    torch.manual_seed(0)
    plan = Plan(*record(lambda: build_draft(mid_sized("dflash"))))
    placed = []
    model = plan.materialise(lambda t: placed.append(t.shape) or t.clone())
    assert len(placed) == len(list(model.parameters())) + len(list(model.buffers()))


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = self.a  # one module (one set of parameters) under two names


def test_a_parameter_registered_twice_stays_one_parameter():
    torch.manual_seed(1)
    host = _Tied()
    torch.manual_seed(1)
    replayed = build_draft_on(None, "cpu", build=_Tied)
    assert replayed.a.weight is replayed.b.weight
    assert torch.equal(replayed.a.weight, host.a.weight) and torch.equal(replayed.a.bias, host.a.bias)


class _ReadsValues(nn.Module):
    """A construction that reads a value it drew: nothing on the meta device has one."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3))
        self.scale = float(self.w.abs().max().item())
        self.v = nn.Parameter(torch.randn(3) * self.scale)


def test_a_construction_that_cannot_replay_is_built_on_the_host_and_said(caplog):
    torch.manual_seed(2)
    host = _ReadsValues()
    rng = torch.get_rng_state()
    torch.manual_seed(2)
    with caplog.at_level(logging.WARNING, logger="blockdraft.models.meta_build"):
        built = build_draft_on(None, "cpu", build=_ReadsValues)
    assert "built on the host" in caplog.text and "does not replay from the meta device" in caplog.text
    assert torch.equal(built.w, host.w) and torch.equal(built.v, host.v) and torch.equal(torch.get_rng_state(), rng)

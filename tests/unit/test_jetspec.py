"""JetSpec: DFlash with causal attention inside the block, exported as vLLM's causal DFlash, never
served otherwise."""

import json

import pytest
import torch

from blockdraft.config import compose, register_schema
from blockdraft.draft_format.causality import kind_and_sliding_causal, vllm_layer_causality
from blockdraft.draft_format.importer import import_draft
from blockdraft.errors import ConfigError
from blockdraft.export.reload_check import make_probe, run_probe
from blockdraft.export.writer import export_draft
from blockdraft.serve.preflight import read_draft
from tests.conftest import make_draft
from blockdraft.config.recipe import TrainAppConfig
from tests.unit.export_helpers import make_run

register_schema("train_schema", TrainAppConfig)


def test_a_slot_never_sees_later_slots_of_its_block(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "jetspec").eval()
    b, h = draft.config.block_size, draft.config.hidden_size
    kv = draft.context_kv(torch.randn(1, 6, 2 * h), torch.arange(6)[None])
    embeds, positions = torch.randn(1, b, h), torch.arange(6, 6 + b)[None]
    base = draft(embeds, positions, kv)
    later = embeds.clone()
    later[:, 2:] += 3.0  # change slots 2.. only
    moved = draft(later, positions, kv)
    assert torch.allclose(moved[:, :2], base[:, :2], atol=1e-6)
    assert not torch.allclose(moved[:, 2:], base[:, 2:])
    # The same weights as DFlash see the whole block: slot 0 then depends on the later slots.
    dflash = make_draft(tiny_hf, "dflash").eval()
    assert not torch.allclose(dflash(later, positions, kv)[:, :1], dflash(embeds, positions, kv)[:, :1])


def test_the_recipe_trains_by_forward_kl():
    for overrides in (["draft=jetspec"], ["experiment=tiny_cpu", "draft=jetspec"]):
        cfg = compose("train", [*overrides, "run_dir=/tmp/x"])
        assert cfg.draft.kind == "jetspec" and cfg.train.kl_weight == 1.0 and cfg.train.ce_weight == 0.0


def test_export_is_vllm_s_causal_dflash_and_reads_back_as_jetspec(tmp_path):
    _, draft = make_run(tmp_path / "run", "jetspec")
    out = export_draft(tmp_path / "run", tmp_path / "out", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["is_causal"] is True
    assert vllm_layer_causality(config) == [True, True]
    assert json.loads((out / "blockdraft_export.json").read_text())["draft_kind"] == "jetspec"
    reloaded, cfg = import_draft(out)
    assert cfg.kind == "jetspec"
    probe = make_probe(cfg, seed=3)
    assert torch.equal(run_probe(reloaded, probe), run_probe(draft, probe))
    assert read_draft(out).kind == "jetspec"


def test_vllm_s_causality_rule_is_followed():
    # is_causal first, then dflash_config.causal, then causal exactly where layer_types slides.
    assert vllm_layer_causality({"num_hidden_layers": 2, "is_causal": False, "dflash_config": {"causal": True}}) == [False] * 2
    assert vllm_layer_causality({"num_hidden_layers": 2, "dflash_config": {"causal": True}}) == [True] * 2
    assert vllm_layer_causality({"num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2}) == [True] * 2
    assert vllm_layer_causality({"num_hidden_layers": 2}) == [False] * 2
    # Causal in the sliding layers only: a draft with causal sliding layers (speculators' default), of any kind.
    mixed = {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}
    assert kind_and_sliding_causal("dflash", mixed, "config.json") == ("dflash", True)
    assert kind_and_sliding_causal("dspark", mixed, "config.json") == ("dspark", True)
    # Causal everywhere is JetSpec for DFlash; for another kind its full layers are refused.
    assert kind_and_sliding_causal("dflash", {**mixed, "is_causal": True}, "config.json") == ("jetspec", False)
    with pytest.raises(ConfigError, match="is_causal"):
        kind_and_sliding_causal("dspark", {**mixed, "is_causal": True}, "config.json")


@pytest.mark.parametrize("kind, flipped", [("jetspec", False), ("dflash", True)])
def test_preflight_refuses_an_export_edited_to_attend_otherwise_than_trained(tmp_path, kind, flipped):
    make_run(tmp_path / "run", kind)
    out = export_draft(tmp_path / "run", tmp_path / "out", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    config["is_causal"] = flipped
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=f"trained as {kind}"):
        read_draft(out)

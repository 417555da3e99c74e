"""LiLiCorr: its config refusals, its weights against vLLM's names, its export and the way back."""

import json

import pytest
import torch
from omegaconf import OmegaConf

from blockdraft.draft_format.contract import expected_shapes
from blockdraft.draft_format.importer import import_draft, tensor_headers
from blockdraft.errors import ConfigError
from blockdraft.export.writer import export_draft
from blockdraft.kinds.lilicorr.export import LILICORR_KEYS
from blockdraft.models import build_draft
from blockdraft.models.io import save_draft
from tests.unit.export_helpers import draft_config, make_run


def _build(**settings):
    return build_draft(draft_config("lilicorr", **settings))


@pytest.mark.parametrize("settings, says", [
    (dict(conv_kernel_size=0), "both > 0, or both to 0"),
    (dict(conv_kernel_size=2, conv_group_size=0), "both > 0, or both to 0"),
    (dict(lilicorr_candidate_topk=6), "power of two <= 16"),
    (dict(lilicorr_candidate_topk=32), "power of two <= 16"),
    (dict(draft_vocab_size=40), "keep the full vocabulary"),
    (dict(lilicorr_num_heads=3), "pick a divisor"),
    (dict(lilicorr_hidden_size=48, lilicorr_num_heads=5), "pick a divisor"),
])
def test_what_vllm_refuses_is_refused_at_config_time_with_the_fix(settings, says):
    with pytest.raises(ConfigError, match=says):
        draft_config("lilicorr", **settings)


def test_a_reduced_vocabulary_is_refused_before_the_target_loads():
    from types import SimpleNamespace

    from blockdraft.train.setup import check_draft_vocab

    cfg = SimpleNamespace(draft=SimpleNamespace(kind="lilicorr", draft_vocab_size=4096))
    with pytest.raises(ConfigError, match="LiLiCorr scores candidates from the target's full head"):
        check_draft_vocab(cfg)


def test_convolution_both_or_neither():
    assert draft_config("lilicorr", conv_kernel_size=0, conv_group_size=0).conv_kernel_size == 0
    assert draft_config("lilicorr", conv_kernel_size=2, conv_group_size=8).conv_group_size == 8


@pytest.mark.parametrize("settings", [dict(), dict(conv_kernel_size=0, conv_group_size=0, lilicorr_hidden_size=32)])
def test_the_models_weights_are_vllms_names_and_shapes(settings):
    draft = _build(**settings)
    state = {k: tuple(v.shape) for k, v in draft.state_dict().items()}
    assert state == expected_shapes(draft.config)
    assert ("lilicorr.token_proj.weight" in state) == bool(settings.get("lilicorr_hidden_size"))
    assert any(".attention_conv." in k for k in state) == ("conv_kernel_size" not in settings)


def test_scores_are_a_walkable_lattice():
    draft = _build(lilicorr_candidate_topk=4)
    cfg, g = draft.config, torch.Generator().manual_seed(0)
    head = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
    embed = torch.nn.Embedding.from_pretrained(torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g))
    hidden = torch.randn(2, cfg.block_size - 1, cfg.hidden_size, generator=g)
    ids, scores = draft.lattice_scores(hidden, head, embed, torch.randn(2, cfg.hidden_size, generator=g))
    assert ids.shape == (2, cfg.block_size - 1, 4) and scores.shape == (2, cfg.block_size - 1, 4, 4)
    assert torch.equal(ids, (hidden @ head.T).topk(4, dim=-1).indices)
    # Slot 0 has no predecessor among the candidates: every row is the anchor's start scores.
    assert torch.equal(scores[:, 0], scores[:, 0, :1].expand_as(scores[:, 0]))
    assert scores.abs().max() <= cfg.lilicorr_logit_scale + 1e-5  # scaled cosines


@pytest.mark.parametrize("settings", [dict(), dict(conv_kernel_size=0, conv_group_size=0, lilicorr_hidden_size=32)])
def test_export_writes_what_vllm_reads_and_reads_back_the_same_scores(tmp_path, settings):
    step_dir, draft = make_run(tmp_path / "run", "lilicorr", **settings)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name.startswith("lilicorr."):
                param.normal_(0.0, 0.3)
    save_draft(step_dir, draft)
    out = export_draft(step_dir, tmp_path / "out", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LiLiCorrDraftModel"]
    dflash = config["dflash_config"]
    # vLLM reads every lilicorr_* key by subscript: a missing one is a KeyError at load.
    assert set(LILICORR_KEYS) <= set(dflash) and dflash["lilicorr_enabled"] is True
    assert dflash["lilicorr_hidden_size"] == (settings.get("lilicorr_hidden_size") or 0)
    assert (dflash["conv_kernel_size"], dflash["conv_group_size"]) == (draft.config.conv_kernel_size, draft.config.conv_group_size)
    assert "selector_top_k" not in dflash  # DFlash2's selector is not LiLiCorr's
    assert {k: s for k, (s, _) in tensor_headers(out).items()} == expected_shapes(draft.config)
    back, cfg = import_draft(out)
    assert cfg.kind == "lilicorr" and all(getattr(cfg, k) == getattr(draft.config, k) for k in LILICORR_KEYS)
    g = torch.Generator().manual_seed(2)
    h, slots, k = cfg.hidden_size, cfg.block_size - 1, cfg.lilicorr_candidate_topk
    inputs = (torch.randn(2, slots, k, h, generator=g), -torch.rand(2, slots, k, generator=g).sort(-1).values,
              torch.randn(2, slots, h, generator=g), torch.randn(2, h, generator=g), torch.tensor([True, True]))
    with torch.no_grad():
        assert torch.equal(back.lilicorr(*inputs), draft.lilicorr(*inputs))


def test_an_export_missing_a_lilicorr_key_is_refused_with_the_fix(tmp_path):
    step_dir, _ = make_run(tmp_path / "run", "lilicorr")
    out = export_draft(step_dir, tmp_path / "out", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    del config["dflash_config"]["lilicorr_num_heads"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="lilicorr_num_heads.*re-export"):
        import_draft(out)


def test_draft_lilicorr_composes_with_its_objective_and_resolves_on_the_tiny_recipe():
    from blockdraft.config import compose, register_schema
    from blockdraft.config.recipe import TrainAppConfig

    register_schema("train_schema", TrainAppConfig)
    cfg = compose("train", ["experiment=tiny_cpu", "draft=lilicorr", "run_dir=/tmp/x"])
    assert cfg.draft.kind == "lilicorr" and cfg.draft.lilicorr_candidate_topk == 8 and cfg.train.selector_loss_weight > 0
    settings = {k: v for k, v in OmegaConf.to_container(cfg.draft).items() if k != "mask_embedding_init"}
    resolved = draft_config(**settings)
    assert resolved.kind == "lilicorr" and resolved.conv_group_size == 8 and resolved.lilicorr_width == resolved.hidden_size


def test_the_exports_reload_check_compares_the_lattice_head(tmp_path):
    from blockdraft.export.reload_check import reload_check

    step_dir, draft = make_run(tmp_path / "run", "lilicorr")
    out = export_draft(step_dir, tmp_path / "out", dtype="float32")
    assert reload_check(out, draft, "float32").ok
    with torch.no_grad():
        draft.lilicorr.in_head.weight.add_(0.1)  # the base logits never read it
    assert not reload_check(out, draft, "float32").ok


def test_resuming_with_another_lattice_or_convolution_is_noticed():
    from blockdraft.train.checkpoint import identity_diffs

    base = draft_config("lilicorr")
    assert identity_diffs(base, draft_config("lilicorr")) == []
    assert [d.split(":")[0] for d in identity_diffs(base, draft_config("lilicorr", lilicorr_num_layers=3))] == ["lilicorr_num_layers"]
    no_conv = draft_config("lilicorr", conv_kernel_size=0, conv_group_size=0)
    assert [d.split(":")[0] for d in identity_diffs(base, no_conv)] == ["conv_kernel_size", "conv_group_size"]


def test_pipeline_keys_hold_the_lattice_settings_for_lilicorr_only():
    from blockdraft.config import compose, register_schema
    from blockdraft.config.recipe import TrainAppConfig
    from blockdraft.pipeline.keys import gate_other_kinds, train_neutral

    register_schema("train_schema", TrainAppConfig)
    keys = {f"draft.{k}" for k in LILICORR_KEYS}
    for kind, left_out in (("lilicorr", False), ("dflash2", True)):
        cfg = OmegaConf.to_object(compose("train", ["experiment=tiny_cpu", f"draft={kind}", "run_dir=/tmp/x"]))
        assert (keys <= set(train_neutral(cfg))) == left_out
        assert (keys <= set(gate_other_kinds(cfg))) == left_out

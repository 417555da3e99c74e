"""A DSpark draft saved by speculators (config.json + model.safetensors as its save_pretrained writes
them) imports as the same draft: every tensor, the same outputs; what is not the draft's is dropped;
what vLLM 0.32 cannot serve is refused in one line."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3Config

from blockdraft.draft_format.causality import vllm_layer_causality
from blockdraft.draft_format.config_reader import draft_config_from_vllm_config
from blockdraft.draft_format.importer import import_draft
from blockdraft.draft_format.speculators import vllm_style_config
from blockdraft.errors import ConfigError
from blockdraft.export.inspect import describe
from blockdraft.export.speculators_serving import vllm_reading_notes
from tests.unit.export_helpers import make_draft

REPO = Path(__file__).resolve().parents[2]
VLLM_ALGOS = REPO / ".venv-serve/lib/python3.11/site-packages/vllm/transformers_utils/configs/speculators/algos.py"


def speculators_dir(directory, draft, verifier="/nonexistent/Qwen3-tiny", omit=(), **config_overrides):
    """`draft` saved as speculators saves a DSparkDraftModel: the Qwen3 layer config as transformers'
    diff dict, aux ids = target layers + 1, the DSpark keys at the top level, bfloat16 weights under the
    module's own names plus the verifier's embedding and head (and t2d/d2t for a reduced vocabulary)."""
    cfg = draft.config
    layer = Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
                        rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_position_embeddings)
    tokens = cfg.num_speculative_tokens
    config = {
        "architectures": ["DSparkSpeculator"],
        "speculators_model_type": "dspark",
        "speculators_version": "0.5.0",
        "transformers_version": "5.19.0",
        "dtype": "bfloat16",
        "transformer_layer_config": layer.to_diff_dict(),
        "draft_vocab_size": cfg.draft_vocab_size or cfg.vocab_size,
        "block_size": cfg.block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        "mask_token_id": cfg.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": cfg.sample_from_anchor,
        "markov_rank": cfg.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": cfg.enable_confidence_head,
        "confidence_head_with_markov": cfg.confidence_head_with_markov,
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": str(verifier), "architectures": ["Qwen3ForCausalLM"]},
        },
        **config_overrides,
    }
    for key in omit:
        config.pop(key)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(5)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
    state = {name: t for name, t in draft.state_dict().items() if name not in ("lm_head.weight", "d2t")}
    state["embed_tokens.weight"] = embed
    if draft.reduced_vocab:
        state["lm_head.weight"] = draft.lm_head.weight
        state["d2t"] = draft.d2t
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[draft.draft_token_ids()] = True
        state["t2d"] = t2d
    else:
        state["lm_head.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)  # the verifier's head
    save_file({k: (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous() for k, t in state.items()},
              str(directory / "model.safetensors"))
    return directory


def dspark_draft(reduced=False, **overrides):
    draft = make_draft("dspark", markov_rank=8, **({"draft_vocab_size": 40} if reduced else {}), **overrides)
    if reduced:
        head = torch.randn(draft.config.vocab_size, draft.config.hidden_size, generator=torch.Generator().manual_seed(2))
        draft.set_draft_vocab(torch.randperm(draft.config.vocab_size, generator=torch.Generator().manual_seed(0))[:40].sort().values, head)
    return draft


def bf16(draft):
    """The source draft's weights as speculators stored them (bfloat16), back in float32."""
    return {k: (v.to(torch.bfloat16).float() if v.is_floating_point() else v) for k, v in draft.state_dict().items()}


CASES = {
    "anchor_first": dict(),
    "reduced_fill_in_confidence_on_h": dict(reduced=True, sample_from_anchor=False, confidence_head_with_markov=False),
    "no_confidence_head": dict(enable_confidence_head=False),
}


@pytest.mark.parametrize("case", CASES)
def test_a_speculators_dspark_checkpoint_imports_as_the_same_draft(tmp_path, case):
    source = dspark_draft(**CASES[case])
    spec = speculators_dir(tmp_path / "spec", source)
    imported, cfg = import_draft(spec)
    assert "weights vs the vLLM contract: ok" in describe(spec) and "a speculators DSpark checkpoint" in describe(spec)
    want = source.config
    assert cfg.kind == "dspark" and cfg.target_layer_ids == want.target_layer_ids == [1, 3]
    for key in ("markov_rank", "sample_from_anchor", "enable_confidence_head", "confidence_head_with_markov",
                "block_size", "draft_vocab_size", "head_dim", "num_key_value_heads", "rope_theta", "mask_token_id"):
        assert getattr(cfg, key) == getattr(want, key), key
    expected = bf16(source)
    assert set(imported.state_dict()) == set(expected)  # every tensor loaded; embed_tokens, t2d, a full head dropped
    for name, tensor in expected.items():
        assert torch.equal(imported.state_dict()[name], tensor), name
    source.load_state_dict(expected)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 5, want.hidden_size, generator=g)
    previous = torch.randint(0, want.vocab_size, (2, 5), generator=g)
    head = torch.randn(want.vocab_size, want.hidden_size, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(imported.corrected_logits(hidden, previous, head),
                                   source.corrected_logits(hidden, previous, head), rtol=0, atol=0)
        if want.enable_confidence_head:
            joint = source.joint_hidden(hidden, previous)
            torch.testing.assert_close(imported.confidence_logits(joint), source.confidence_logits(joint), rtol=0, atol=0)


def test_absent_sample_from_anchor_is_read_as_vllm_serves_it(tmp_path):
    """speculators' own default is true, vLLM's converter reads an absent key as false: vLLM decides."""
    source = dspark_draft(sample_from_anchor=False)
    _, cfg = import_draft(speculators_dir(tmp_path / "spec", source, omit=("sample_from_anchor",)))
    assert cfg.sample_from_anchor is False and cfg.num_speculative_tokens == cfg.block_size - 1


def test_the_verifier_directory_gives_the_target_layer_count(tmp_path):
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    (verifier / "config.json").write_text(json.dumps({"num_hidden_layers": 6}))
    spec = speculators_dir(tmp_path / "spec", dspark_draft(), verifier=verifier)
    assert import_draft(spec)[1].num_target_layers == 6
    # A Hub id (or a path not here): the smallest target the layer ids fit, as for other stacks' configs.
    assert import_draft(speculators_dir(tmp_path / "hub", dspark_draft()))[1].num_target_layers == 5


@pytest.mark.parametrize("change,message", [
    (dict(markov_head_type="gated"), "markov_head_type='gated': vLLM 0.32 serves only the ['vanilla'] Markov head"),
    (dict(markov_rank=0), "retrain with --markov-rank >= 1"),
    (dict(speculators_model_type="eagle3"), "['dflash', 'dflash2', 'dspark'] are read here"),
    (dict(aux_hidden_state_layer_ids=[0, 2]), "every id must be >= 1"),
    (dict(transformer_layer_config={"model_type": "llama", "hidden_size": 64}), "model_type='llama'"),
])
def test_what_vllm_cannot_serve_is_refused_in_one_line(tmp_path, change, message):
    spec = speculators_dir(tmp_path / "spec", dspark_draft(), **change)
    with pytest.raises(ConfigError) as err:
        import_draft(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def sliding_config(tmp_path, **overrides):
    """A speculators DSpark config.json whose layer 0 slides (window 16) and layer 1 attends fully."""
    config = json.loads((speculators_dir(tmp_path / "spec", dspark_draft()) / "config.json").read_text())
    config["transformer_layer_config"].update(use_sliding_window=True, sliding_window=16,
                                              layer_types=["sliding_attention", "full_attention"])
    config.update(overrides)
    return config


@pytest.mark.parametrize("non_causal, causal", [(False, True), (True, False)])
def test_sliding_window_layers_are_read_as_speculators_trained_them(tmp_path, non_causal, causal):
    cfg = draft_config_from_vllm_config(sliding_config(tmp_path, sliding_window_non_causal=non_causal))
    assert cfg.layer_types == ["sliding_attention", "full_attention"] and cfg.sliding_window == 16
    # The sliding layer causal inside the block unless sliding_window_non_causal; the full layer never.
    assert cfg.layer_attention() == [(16, causal), (None, False)]


def test_a_layer_config_without_use_sliding_window_has_no_window(tmp_path):
    """transformers' Qwen3Config drops the window unless use_sliding_window, and speculators masks such a layer fully."""
    config = sliding_config(tmp_path)
    config["transformer_layer_config"]["use_sliding_window"] = False
    assert draft_config_from_vllm_config(config).layer_attention() == [(None, False), (None, False)]


@pytest.mark.skipif(not VLLM_ALGOS.is_file(), reason="no serving env (.venv-serve) with vLLM's speculators converter")
def test_we_read_the_keys_vllm_serves_from(tmp_path):
    """vLLM's own converter (pure Python, loaded from its file) on the same config.json: the keys it
    serves with are the ones this import reads."""
    spec = importlib.util.spec_from_file_location("vllm_speculators_algos", VLLM_ALGOS)
    algos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(algos)
    for omit in ((), ("sample_from_anchor", "enable_confidence_head", "confidence_head_with_markov")):
        source = dspark_draft(reduced=True)
        config = json.loads((speculators_dir(tmp_path / f"spec{len(omit)}", source, omit=omit) / "config.json").read_text())
        served = dict(config["transformer_layer_config"])
        algos.SUPPORTED_SPECULATORS_TYPES["dspark"](config_dict=config, pre_trained_config=served)
        ours = vllm_style_config(config)
        cfg = draft_config_from_vllm_config(config)
        assert served["architectures"] == ours["architectures"] == ["Qwen3DSparkModel"]
        assert served["target_layer_ids"] == ours["target_layer_ids"] == cfg.target_layer_ids
        assert served["sample_from_anchor"] == cfg.sample_from_anchor
        for key, default in (("enable_confidence_head", False), ("confidence_head_with_markov", False)):
            assert served.get(key, default) == getattr(cfg, key), key
        for key in ("markov_rank", "block_size", "mask_token_id", "draft_vocab_size", "head_dim", "num_key_value_heads"):
            assert served[key] == getattr(cfg, key), key


@pytest.mark.skipif(not VLLM_ALGOS.is_file(), reason="no serving env (.venv-serve) with vLLM's speculators converter")
def test_where_vllm_s_own_reading_of_a_speculators_config_differs_we_say_so(tmp_path):
    """vLLM's converter sets dflash_config.causal for every layer of a DFlash draft: with causal sliding layers
    its full layer turns causal. The import keeps each layer as trained and the notes name the one vLLM would not."""
    spec = importlib.util.spec_from_file_location("vllm_speculators_algos", VLLM_ALGOS)
    algos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(algos)
    config = sliding_config(tmp_path, speculators_model_type="dflash", sliding_window_non_causal=False,
                            sample_from_anchor=False)
    served = dict(config["transformer_layer_config"])
    algos.SUPPORTED_SPECULATORS_TYPES["dflash"](config_dict=config, pre_trained_config=served)
    assert vllm_layer_causality(served) == [True, True]  # vLLM's reading: both layers causal
    cfg = draft_config_from_vllm_config(config)
    assert cfg.kind == "dflash" and [c for _, c in cfg.layer_attention()] == [True, False]
    notes = vllm_reading_notes(config)
    assert notes[0].startswith("layer 1 (full_attention): vLLM would attend causally inside the block")
    assert "sliding window 16" in notes[1]
    # DSpark: vLLM resolves each layer from layer_types, as trained; only the window rule is left to say.
    assert len(vllm_reading_notes(sliding_config(tmp_path / "d", sliding_window_non_causal=False))) == 1

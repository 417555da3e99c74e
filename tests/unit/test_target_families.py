"""Each target family: capture equals its own `output_hidden_states` at the pinned offset, the
offset is what the serving vLLM records, and the draft's borrowed pieces come from the right place."""

import json
import re
from pathlib import Path

import pytest
import torch

from blockdraft.errors import ConfigError
from blockdraft.models.target import TargetModel, load_causal_lm
from blockdraft.models.target_families import FAMILIES, SUPPORTED_ARCHITECTURES, family_of, num_layers_in
from blockdraft.models.target_heads import TargetHeads
from blockdraft.models.tiny_target import TINY_ARCHS, build_tiny_model, save_tiny_target

REPO = Path(__file__).resolve().parents[2]
NEW_FAMILIES = ["qwen3_5", "qwen3_5_moe", "qwen3_5_vl", "nemotron_h", "nemotron_h_moe", "qwen3_vl"]
LAYERS = [0, 2, 4]


@pytest.fixture(scope="module", params=NEW_FAMILIES)
def tiny(request):
    return request.param, build_tiny_model(request.param, num_layers=6)


def test_every_tiny_family_is_supported():
    assert set(NEW_FAMILIES) <= set(TINY_ARCHS)
    for arch in TINY_ARCHS:
        assert family_of(build_tiny_model(arch, num_layers=2).config.architectures)


def test_capture_equals_the_familys_own_hidden_states_at_layer_plus_one(tiny):
    name, model = tiny
    target = TargetModel(model, LAYERS)
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0  # a right-padded row, as batches are
    hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(hidden) == 7  # the embeddings, then one entry per decoder layer
    expected = torch.cat([hidden[i + 1] for i in LAYERS], dim=-1)
    valid = mask.bool()
    for captured in (target.capture(ids, mask), target.capture_with_final(ids, mask)[0], target.forward(ids, attention_mask=mask)[1]):
        assert captured.shape == expected.shape
        torch.testing.assert_close(captured[valid], expected[valid], rtol=0, atol=0)


def test_the_early_stop_skips_the_layers_after_the_last_one_needed(tiny):
    _name, model = tiny
    target = TargetModel(model, [1])
    ran = []
    handles = [layer.register_forward_pre_hook(lambda m, i, k=k: ran.append(k)) for k, layer in enumerate(target.decoder_layers)]
    target.capture(torch.tensor([[5, 6, 7]]))
    for handle in handles:
        handle.remove()
    assert ran == [0, 1]


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_the_draft_borrows_the_language_models_embeddings_and_head(name, tmp_path):
    directory = save_tiny_target(tmp_path / name, name, num_layers=2)
    heads = TargetHeads.load(directory)  # straight from the safetensors, as training from a store does
    loaded = TargetModel(load_causal_lm(str(directory)), [0])  # as the class its config names
    assert type(loaded.model).__name__ == json.loads((directory / "config.json").read_text())["architectures"][0]
    assert torch.equal(heads.embed_tokens.weight, loaded.embed_tokens.weight)
    assert torch.equal(heads.lm_head_weight, loaded.lm_head_weight)
    assert not torch.equal(heads.embed_tokens.weight, heads.lm_head_weight)  # untied: each read from its own tensor
    config = json.loads((directory / "config.json").read_text())
    assert num_layers_in(config.get("text_config") or config) == 2


def _vllm_models_dir() -> Path:
    found = sorted((REPO / ".venv-serve").glob("lib/python*/site-packages/vllm/model_executor/models"))
    if not found:
        pytest.skip("no vLLM serving environment: run `make setup-serve`")
    return found[0]


PINNED_VLLM = "0.32.0"  # the version whose lines `vllm_capture` cites (`make setup-serve` on a CPU)
RECORDS_LAYER_PLUS_ONE = r"aux_hidden_states, (layer_)?idx \+ 1, hidden_states, residual"


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_pinned_offset_is_what_the_serving_vllm_records(family):
    """vLLM records layer i's output as aux layer i + 1, and adds 1 to each target_layer_id."""
    models = _vllm_models_dir()
    file, line = family.vllm_capture.split(":")
    lines = (models / file).read_text().splitlines()
    if any(models.parents[2].glob(f"vllm*-{PINNED_VLLM}.dist-info")):
        call, recorded = lines[int(line) - 2], lines[int(line) - 1]
        assert "_maybe_add_hidden_state(" in call
        assert re.search(RECORDS_LAYER_PLUS_ONE, recorded)
    else:  # another vLLM (a GPU machine's): the lines move, the rule must not
        assert any(re.search(RECORDS_LAYER_PLUS_ONE, text) for text in lines)
    runner = (models.parents[1] / "v1" / "worker" / "gpu_model_runner.py").read_text()
    assert re.search(r"i \+ 1 for i in \(?dflash_config\.get\(\"target_layer_ids\"\)", runner)


def test_an_unsupported_architecture_is_refused_naming_the_supported_ones():
    with pytest.raises(ConfigError, match="'GPT2LMHeadModel' cannot expose") as err:
        family_of(["GPT2LMHeadModel"])
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in str(err.value)
    assert "NemotronHForCausalLM" in SUPPORTED_ARCHITECTURES and "Qwen3VLForConditionalGeneration" in SUPPORTED_ARCHITECTURES

"""`init_from=<exported draft>`: a run starts from the export's weights (each kind's export carries only its own keys)."""

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.export.writer import export_draft
from tests.integration.conftest import train_tiny


@pytest.mark.parametrize("run_fixture", ["tiny_dflash_run", "tiny_dflash2_run"])
def test_a_run_starts_from_an_exported_draft(run_fixture, request, tmp_path):
    export = export_draft(request.getfixturevalue(run_fixture), tmp_path / "export", dtype="float32")
    kind = ["draft=dflash2"] if run_fixture == "tiny_dflash2_run" else []
    # lr 1e-12: one step moves no weight measurably, so the saved step equals where the run started.
    run = train_tiny(tmp_path / "run", *kind, f"init_from={export}", "train.max_steps=1", "optim.lr=1e-12",
                     "optim.weight_decay=0.0", "data.val=null", "train.save_every=1")
    exported = load_file(str(next(export.glob("*.safetensors"))))
    started = load_file(str(run / "checkpoints" / "step_1" / "model.safetensors"))
    shared = [k for k in exported if k in started and exported[k].shape == started[k].shape]
    assert len(shared) >= len(exported) // 2, (sorted(exported)[:5], sorted(started)[:5])
    for k in shared:
        torch.testing.assert_close(started[k], exported[k], rtol=0, atol=1e-6, msg=k)


def test_a_run_starts_from_a_speculators_dspark_checkpoint(tmp_path):
    """speculators' own save of a DSpark draft (tests/unit/test_speculators_import.py writes it as
    speculators does) is an init_from source like an export: the run starts from its weights."""
    from tests.integration.conftest import REPO
    from tests.unit.export_helpers import make_draft
    from tests.unit.test_speculators_import import speculators_dir

    source = make_draft("dspark", num_layers=1, markov_rank=8)  # the tiny_cpu recipe's draft, as draft=dspark
    spec = speculators_dir(tmp_path / "speculators", source, verifier=REPO / ".cache" / "targets" / "tiny-qwen3")
    run = train_tiny(tmp_path / "run", "draft=dspark", "draft.markov_rank=8", f"init_from={spec}", "train.max_steps=1",
                     "optim.lr=1e-12", "optim.weight_decay=0.0", "data.val=null", "train.save_every=1")
    started = load_file(str(run / "checkpoints" / "step_1" / "model.safetensors"))
    assert set(started) == set(source.state_dict())
    for k, tensor in source.state_dict().items():
        torch.testing.assert_close(started[k], tensor.to(torch.bfloat16).float(), rtol=0, atol=1e-6, msg=k)


def test_a_run_starts_from_a_speculators_dflash_checkpoint_with_mixed_layers_and_exports_as_it_trained(tmp_path):
    """speculators' DFlash with a causal sliding layer and a bidirectional full one (its trainer's
    --full-attention-indices): the run trains with each layer's own mask, and its export keeps both."""
    import json

    from blockdraft.draft_format.causality import vllm_layer_causality
    from tests.integration.conftest import REPO
    from tests.unit.export_helpers import make_draft
    from tests.unit.test_speculators_import import speculators_dir

    layers = ["sliding_attention", "full_attention"]
    source = make_draft("dflash", num_layers=2, sliding_window=16, layer_types=layers, sliding_causal=True)
    spec = speculators_dir(tmp_path / "speculators", source, verifier=REPO / ".cache" / "targets" / "tiny-qwen3",
                           speculators_model_type="dflash", architectures=["DFlashDraftModel"], sample_from_anchor=False,
                           sliding_window_non_causal=False)
    config = json.loads((spec / "config.json").read_text())
    config["transformer_layer_config"].update(use_sliding_window=True, sliding_window=16, layer_types=layers)
    (spec / "config.json").write_text(json.dumps(config))
    run = train_tiny(tmp_path / "run", "draft.num_layers=2", "draft.sliding_window=16",
                     "draft.layer_types=[sliding_attention,full_attention]", "draft.sliding_causal=true",
                     f"init_from={spec}", "train.max_steps=1", "optim.lr=1e-12", "optim.weight_decay=0.0",
                     "data.val=null", "train.save_every=1")
    started = load_file(str(run / "checkpoints" / "step_1" / "model.safetensors"))
    for k, tensor in source.state_dict().items():
        torch.testing.assert_close(started[k], tensor.to(torch.bfloat16).float(), rtol=0, atol=1e-6, msg=k)
    export = export_draft(run, tmp_path / "export", dtype="float32")
    exported = json.loads((export / "config.json").read_text())
    assert exported["layer_types"] == layers and "is_causal" not in exported
    assert vllm_layer_causality(exported) == [True, False]

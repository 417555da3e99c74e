"""Every registered draft kind passes the same checks: the tiny recipe trains it, export writes and reloads it,
the export's config.json reads back as the same kind with the same settings, the deploy line is the one its
registry entry says, and the reference engine decodes with it losslessly, greedy token for token and sampled
in distribution. A kind gets every check by registering (blockdraft/kinds/, docs/adding-a-kind.md): the toy
kind of tests/integration/toy_kind.py, registered from the tests alone, is checked beside the built-in ones.

Where vLLM serves a kind, vLLM's own loader and modules are checked per kind elsewhere (test_vllm_weight_load.py,
test_vllm_dspark_contract.py, test_vllm_lilicorr_contract.py, test_mask_embedding_serve.py)."""

import json

import pytest
import torch

from blockdraft import kinds
from blockdraft.export.deploy_line import export_deploy_line
from blockdraft.draft_format.importer import import_draft
from blockdraft.draft_format.config_reader import draft_config_from_vllm_config
from blockdraft.models.io import load_draft_config
from blockdraft.models.target import TargetModel
from blockdraft.engine.decoder import SpeculativeEngine
from blockdraft.engine.sampling import SamplingParams
from tests.conftest import make_draft
from tests.integration import toy_kind
from tests.integration.conftest import REPO, decode_heldout_losslessly, export_here, train_tiny
from tests.integration.test_vllm_weight_load import SERVE_PYTHON, check_weights
from tests.unit.test_engine_sampling import VOCAB, _tiny, assert_sampling_follows_target

toy_kind.register_toy()
KINDS = kinds.kind_names()
assert toy_kind.NAME in KINDS and len(KINDS) > len(kinds.registry.BUILTIN)
# The settings every kind shares and an export carries (its dflash_config and its shape keys).
SHARED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim", "vocab_size", "target_hidden_size", "target_layer_ids", "mask_token_id", "block_size",
          "sliding_window", "layer_types", "sliding_causal", "draft_vocab_size")


def draft_overrides(kind: str) -> list:
    """The kind's own config group where it has one (configs/draft/<kind>.yaml), else DFlash's with its name."""
    if (REPO / "configs" / "draft" / f"{kind}.yaml").is_file():
        return [f"draft={kind}"]
    return ["draft=dflash", f"draft.kind={kind}"]


@pytest.fixture(scope="module", params=KINDS)
def trained(request, tmp_path_factory):
    """(kind, its checkpoint, its export) after a few steps of the tiny recipe."""
    kind = request.param
    work = tmp_path_factory.mktemp(f"conformance_{kind}")
    run = train_tiny(work / "run", *draft_overrides(kind), "train.max_steps=4", "train.save_every=4",
                     "train.log_every=2", "train.val_every=0")
    checkpoint = run / "checkpoints" / "step_4"
    return kind, checkpoint, export_here(checkpoint, work / "export")


def test_it_trains_and_its_export_reads_back_as_the_same_kind_and_settings(trained):
    kind, checkpoint, export = trained
    spec = kinds.get(kind)
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == [spec.architecture]
    back, want = draft_config_from_vllm_config(config), load_draft_config(checkpoint)
    assert want.kind == back.kind == kind
    for key in SHARED + spec.settings:
        assert getattr(back, key) == getattr(want, key), key
    draft, cfg = import_draft(export)
    assert type(draft) is spec.model_class() and cfg.kind == kind


def test_its_deploy_line_is_the_one_its_entry_says(trained):
    kind, _, export = trained
    spec = kinds.get(kind)
    line = export_deploy_line(export)
    assert line.vllm == (spec.reference_only is None)
    if spec.reference_only:
        assert line.command.startswith("python -m blockdraft.serve") and "engine=reference" in line.command
        return
    assert f'"method": "{spec.vllm_method}"' in line.command
    assert line.command.startswith("VLLM_USE_V2_MODEL_RUNNER=1 ") == bool(spec.v2_runner)


@pytest.mark.serve
@pytest.mark.skipif(not SERVE_PYTHON.is_file(), reason=f"no serving env at {SERVE_PYTHON}; run `make setup-serve`")
def test_vllm_loads_every_weight_where_it_serves_the_kind_here(trained):
    kind, _, export = trained
    spec = kinds.get(kind)
    if not spec.vllm_method or spec.v2_runner:
        pytest.skip(f"{kind}: {spec.reference_only or 'vLLM serves it on its V2 GPU runner only'}")
    proc = check_weights(export)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "0 missing, 0 unexpected" in proc.stdout


def test_the_reference_engine_decodes_with_it_losslessly(trained):
    _, _, export = trained
    _, stats = decode_heldout_losslessly(export, num_prompts=2)
    assert stats.num_drafts > 0


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_output_follows_the_target_distribution(kind):
    """The engine's rejection sampling with this kind's drafting (its own q) keeps the target's distribution."""
    hf = _tiny()
    target = TargetModel(hf, [0, 1])
    settings = dict(mask_token_id=VOCAB - 1, target_layer_ids=[0, 1], block_size=3, selector_top_k=3,
                    lilicorr_candidate_topk=2, markov_rank=4)
    draft = make_draft(hf, kind, **settings)
    with torch.no_grad():  # a draft far from the target, so rejections happen
        draft.fc.weight.mul_(50)
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.9)  # truncation too: q and p must agree after it
    assert_sampling_follows_target(hf, SpeculativeEngine(target, draft), params)


def test_the_toy_kind_trains_with_its_own_loss(tmp_path):
    """The registered hook is what trains the toy kind: its first step's loss is CE_SCALE times DFlash's on the
    same batch from the same initial weights (no stage's file knows the toy kind)."""
    from blockdraft.train.logger import read_metrics

    first = {}
    for kind in ("dflash", toy_kind.NAME):
        run = train_tiny(tmp_path / kind, "draft=dflash", f"draft.kind={kind}", "train.max_steps=1", "train.log_every=1")
        first[kind] = next(r["loss"] for r in read_metrics(run) if "loss" in r and "split" not in r)
    assert first[toy_kind.NAME] == pytest.approx(toy_kind.CE_SCALE * first["dflash"], rel=1e-5)

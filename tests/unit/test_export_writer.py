import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blockdraft

from blockdraft.draft_format.contract import expected_shapes
from blockdraft.draft_format.importer import INDEX_NAME, import_draft, tensor_headers
from blockdraft.errors import ConfigError
from blockdraft.export.inspect import describe
from blockdraft.export.reload_check import make_probe, rounded_copy, run_probe
from blockdraft.export.writer import ExportCheckError, export_draft
from blockdraft.models.io import save_draft
from blockdraft.models.tiny_target import save_tiny_target
from tests.unit.export_helpers import TINY_VOCAB, make_run

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_export_reloads_with_the_trained_logits(tmp_path, kind, dtype):
    _, draft = make_run(tmp_path / "run", kind)
    out = export_draft(tmp_path / "run", tmp_path / "out", dtype=dtype)
    reloaded, cfg = import_draft(out)
    assert cfg.kind == kind
    probe = make_probe(cfg, seed=3)
    # Same weights (rounded to the export dtype), same config: the same numbers, selector included.
    want = run_probe(rounded_copy(draft, dtype), probe)
    assert torch.allclose(run_probe(reloaded, probe), want, atol=1e-6, rtol=0)
    if dtype == "float32":
        assert torch.allclose(run_probe(reloaded, probe), run_probe(draft, probe), atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_names_and_shapes_are_the_contracts(tmp_path, kind):
    _, draft = make_run(tmp_path / "run", kind)
    out = export_draft(tmp_path / "run", tmp_path / "out")
    stored = tensor_headers(out)
    assert {k: shape for k, (shape, _) in stored.items()} == expected_shapes(draft.config)
    assert {dtype for _, dtype in stored.values()} == {"BF16"}


def test_config_json_says_what_vllm_reads(tmp_path):
    _, draft = make_run(tmp_path / "run", "dflash2")
    config = json.loads((export_draft(tmp_path / "run", tmp_path / "out") / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["model_type"] == "qwen3"
    assert config["head_dim"] == 32 and config["is_causal"] is False and config["tie_word_embeddings"] is False
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0} == {"rope_type": "default", "rope_theta": config["rope_theta"]}
    assert config["dflash_config"] == {
        "mask_token_id": 262, "target_layer_ids": [1, 3], "block_size": 4,
        "conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 64, "selector_top_k": 8,
    }
    assert not {"eagle_aux_hidden_state_layer_ids", "eagle_config", "layer_types", "sliding_window"} & set(config)


def test_sliding_window_draft_writes_the_window_keys(tmp_path):
    make_run(tmp_path / "run", "dflash", sliding_window=8)
    config = json.loads((export_draft(tmp_path / "run", tmp_path / "out") / "config.json").read_text())
    assert config["use_sliding_window"] is True and config["sliding_window"] == 8
    assert config["layer_types"] == ["sliding_attention"] * 2 and config["is_causal"] is False


def test_sharded_export_writes_an_index_and_reloads(tmp_path):
    _, draft = make_run(tmp_path / "run", "dflash2")
    out = export_draft(tmp_path / "run", tmp_path / "out", dtype="float32", shard_size_bytes=64 * 1024)
    index = json.loads((out / INDEX_NAME).read_text())
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 2 and not (out / "model.safetensors").exists()
    assert sorted(set(index["weight_map"].values())) == shards
    assert set(index["weight_map"]) == set(expected_shapes(draft.config))
    reloaded, _ = import_draft(out)
    for name, tensor in draft.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_run_dir_means_its_latest_complete_checkpoint(tmp_path):
    make_run(tmp_path / "run", "dflash", step=10)
    make_run(tmp_path / "other", "dflash", step=20)
    (tmp_path / "other/checkpoints/step_20").rename(tmp_path / "run/checkpoints/step_20")
    (tmp_path / "run/checkpoints/step_30.tmp").mkdir()  # a save in progress never counts
    out = export_draft(tmp_path / "run", tmp_path / "out")
    info = json.loads((out / "blockdraft_export.json").read_text())
    assert info["step"] == 20 and info["dtype"] == "bfloat16"
    assert info["source_checkpoint"] == str((tmp_path / "run/checkpoints/step_20").absolute())


def test_model_card_records_training_and_the_serve_command(tmp_path):
    make_run(tmp_path / "run", "dflash", target_path="/models/Qwen3-8B")
    card = (export_draft(tmp_path / "run", tmp_path / "out") / "README.md").read_text()
    # No model card at the target: a license is still stated, with the line that says to choose one.
    assert "\nlicense: other\n" in card and "choose one before publishing" in card
    assert "Qwen3-8B" in card and "data/train.jsonl" in card and "steps: 10" in card
    assert "training accept_len (step 10): 1.500" in card and "validation accept_len (step 10): 1.750" in card
    spec = json.dumps({"method": "dflash", "model": str((tmp_path / "out").absolute()), "num_speculative_tokens": 3})
    assert f"vllm serve /models/Qwen3-8B --speculative-config '{spec}'" in card


def test_a_fresh_export_names_the_blockdraft_that_wrote_it_its_license_and_references(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "README.md").write_text("---\nlicense: apache-2.0\nlanguage: [en]\n---\n# A target\n")
    make_run(tmp_path / "run", "dspark", target_path=str(target))
    out = export_draft(tmp_path / "run", tmp_path / "out")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = json.loads((out / "blockdraft_export.json").read_text())
    assert info["blockdraft_version"] == blockdraft.__version__
    assert info["blockdraft_commit"].removesuffix("-dirty") == commit
    card = (out / "README.md").read_text()
    assert f"blockdraft {blockdraft.__version__}, commit {info['blockdraft_commit']}" in card
    assert "\nlicense: apache-2.0\n" in card  # the target's, from its own model card
    references = card.split("## References\n", 1)[1]
    assert "arXiv 2607.05147" in references and "qwen3_dspark.py" in references


def test_non_empty_out_is_refused_and_left_alone(tmp_path):
    make_run(tmp_path / "run")
    (tmp_path / "out").mkdir()
    (tmp_path / "out/keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty.*overwrite=true"):
        export_draft(tmp_path / "run", tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
    # overwrite=true replaces an export, never a directory of anything else: refused, nothing deleted.
    with pytest.raises(ConfigError, match="holds files no export wrote.*nothing was deleted"):
        export_draft(tmp_path / "run", tmp_path / "out", overwrite=True)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
    export_draft(tmp_path / "run", tmp_path / "new")
    export_draft(tmp_path / "run", tmp_path / "new", overwrite=True)  # an export: replaced
    assert (tmp_path / "new/config.json").exists() and not (tmp_path / "new.tmp").exists()
    assert not (tmp_path / "new" / ".blockdraft_export_staging").exists()
    # A staging directory the exporter did not make is not deleted either.
    (tmp_path / "other.tmp").mkdir()
    (tmp_path / "other.tmp/notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="other.tmp exists and holds files no export wrote"):
        export_draft(tmp_path / "run", tmp_path / "other")
    assert (tmp_path / "other.tmp/notes.txt").read_text() == "mine"


def test_failed_check_keeps_the_export_aside_and_names_the_tensor(tmp_path, monkeypatch):
    import blockdraft.export.writer as writer

    make_run(tmp_path / "run", "dflash2")
    export_draft(tmp_path / "run", tmp_path / "out")  # an earlier export, which the failed one must leave alone
    earlier = sorted(p.name for p in (tmp_path / "out").iterdir())
    real = writer.draft_state_dict

    def corrupt(draft, dtype=None):
        state = real(draft, dtype)
        state["layers.1.mlp_conv.base_kernel"] = state["layers.1.mlp_conv.base_kernel"] + 1
        return state

    monkeypatch.setattr(writer, "draft_state_dict", corrupt)
    with pytest.raises(ExportCheckError, match="layers.1.mlp_conv.base_kernel"):
        export_draft(tmp_path / "run", tmp_path / "out", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == earlier
    assert (tmp_path / "out.failed/config.json").exists() and not (tmp_path / "out.tmp").exists()


def test_cli_exports_inspects_and_refuses_without_traceback(tmp_path):
    target = save_tiny_target(tmp_path / "target")
    make_run(tmp_path / "run", "dflash2", target_path=str(target))
    cmd = [sys.executable, "-m", "blockdraft.export", f"checkpoint={tmp_path / 'run'}", f"out={tmp_path / 'out'}", "dtype=float32"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 0, done.stderr
    assert f"checked against the target {target}" in done.stdout and "num_speculative_tokens = block_size - 1 = 3" in done.stdout
    again = subprocess.run([*cmd, f"target={target}"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_env())
    assert again.returncode == 2 and "is not empty" in again.stderr and "Traceback" not in again.stderr


def test_inspect_describes_exports_and_checkpoints(tmp_path):
    from blockdraft.config import compose
    from blockdraft.export.__main__ import run
    from omegaconf import OmegaConf

    make_run(tmp_path / "run", "dflash2")
    out = export_draft(tmp_path / "run", tmp_path / "out")
    text = run(OmegaConf.to_object(compose("export", [f"inspect={out}"])))
    for part in ("DFlash2DraftModel", "target_layer_ids: [1, 3]", "mask_token_id: 262", "block_size: 4", "BF16",
                 "tensors: 36", "contract: ok", "num_speculative_tokens = block_size - 1 = 3", "vllm serve"):
        assert part in text, part
    assert "training checkpoint (step_10)" in describe(tmp_path / "run")
    # DSpark: vLLM's own method, and a round drafts from every slot of the block.
    make_run(tmp_path / "dspark", "dspark", markov_rank=8)
    text = run(OmegaConf.to_object(compose("export", [f"inspect={export_draft(tmp_path / 'dspark', tmp_path / 'ds')}"])))
    for part in ("Qwen3DSparkModel", "contract: ok", "num_speculative_tokens = block_size = 4", '"method": "dspark"'):
        assert part in text, part


def test_reduced_vocabulary_export_round_trips_and_is_described(tmp_path):
    step_dir, trained = make_run(tmp_path / "run", "dflash", draft_vocab_size=24)
    trained.set_draft_vocab(torch.arange(100, 148, 2), torch.randn(TINY_VOCAB, trained.config.hidden_size))
    save_draft(step_dir, trained)
    out = export_draft(tmp_path / "run", tmp_path / "out", dtype="bfloat16")  # the reload check passes
    draft, cfg = import_draft(out)
    assert cfg.draft_vocab_size == 24 and torch.equal(draft.d2t, trained.d2t) and draft.d2t.dtype == torch.long
    text = describe(out)
    assert "reduced, 24 of 268 target tokens" in text and "contract: ok" in text


def _env():
    import os

    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_unknown_dtype_and_missing_checkpoint_are_refused_by_name(tmp_path):
    make_run(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"dtype='int8' is not supported; use one of"):
        export_draft(tmp_path / "run", tmp_path / "out", dtype="int8")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"checkpoint=.*empty is neither a checkpoint"):
        export_draft(tmp_path / "empty", tmp_path / "out")
    assert not (tmp_path / "out").exists()

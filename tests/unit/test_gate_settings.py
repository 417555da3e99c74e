"""The gate's settings before any work: a refused run writes nothing, an unfinished one is replaced, a
target without a set mask token gets suggest's first candidate, and the export is the dtype served."""

import pytest

from blockdraft.errors import ConfigError
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.gate import app as gate
from tests.integration.conftest import REPO

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"


@pytest.fixture(scope="module")
def target():
    return str(save_tiny_target(TARGET, "qwen3"))


def test_a_setting_training_refuses_is_said_before_out_is_written(target, tmp_path):
    out = tmp_path / "gate"
    cfg = gate.parse_arguments([f"target={target}", f"out={out}", "experiment=tiny_cpu", "train.grad_accum=0"])
    with pytest.raises(ConfigError, match="train.grad_accum=0"):
        gate.run_gate(cfg)
    assert not out.exists()


def test_without_a_mask_token_the_gate_takes_the_first_candidate_and_says_so(target, tmp_path, capsys):
    cfg = gate.parse_arguments([f"target={target}", f"out={tmp_path / 'gate'}"])
    gate.check_before_work(cfg, tmp_path / "gate")
    assert cfg.train_overrides[-1] == "draft.mask_token_id=260"
    assert "the gate uses 260 ('<|reserved_0|>')" in capsys.readouterr().err
    recipe = gate.parse_arguments([f"target={target}", f"out={tmp_path / 'gate'}", "experiment=tiny_cpu"])
    gate.check_before_work(recipe, tmp_path / "gate")
    assert not any(w.startswith("draft.mask_token_id") for w in recipe.train_overrides)  # the recipe's own stays


def test_an_unfinished_run_is_replaced_and_a_finished_one_kept(target, tmp_path):
    out = tmp_path / "gate"
    out.mkdir()
    (out / gate.PROMPT_NAME).write_text("[]")
    gate.parse_arguments([f"target={target}", f"out={out}"])  # no verdict yet: a rerun replaces it
    (out / gate.VERDICT_NAME).write_text("{}")
    with pytest.raises(ConfigError, match="already holds a finished gate run"):
        gate.parse_arguments([f"target={target}", f"out={out}"])
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match="not a gate run"):
        gate.parse_arguments([f"target={target}", f"out={other}", "overwrite=true"])


def test_the_export_is_the_dtype_served(target, tmp_path, monkeypatch):
    cfg = gate.parse_arguments([f"target={target}", f"out={tmp_path}"])
    assert gate.export_dtype(cfg) == "float32"
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gate.export_dtype(cfg) == "bfloat16"
    with pytest.raises(ConfigError, match="dtype='int8'"):
        gate.parse_arguments([f"target={target}", f"out={tmp_path}", "dtype=int8"])

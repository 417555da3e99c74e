"""Each newer target family end to end on a tiny random target: the recipe's data answered by that
target, a short training run that learns, an export that passes its reload check, and the
smoke-serve harness, in vLLM where the serving vLLM can run the pair, else on the reference
engine with the reason said."""

import json

import pytest

from blockdraft.export.writer import EXPORT_INFO, export_draft
from blockdraft.serve import harness
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.preflight import plan_serving, read_target, target_serving_problem
from blockdraft.train.logger import read_metrics
from blockdraft.vllm_runtime.probe import probe_architectures
from tests.integration.conftest import REPO, train_tiny

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
FAMILIES = {
    "qwen3_5": "Qwen3_5ForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]


BASE_FAMILY = "Qwen3ForCausalLM"  # the tiny target's: the control, and the answer the later vLLM tests reuse


@pytest.fixture(scope="module")
def vllm_answers():
    """What the serving vLLM says of every family, from one start of its interpreter (the probe keeps each
    answer for this process, so the gate and the plugin tests on the tiny Qwen3 import vLLM no more)."""
    return probe_architectures(SERVE_PYTHON, [*FAMILIES.values(), BASE_FAMILY])


def test_the_serving_vllm_knows_the_base_family(vllm_answers):
    answer = vllm_answers[BASE_FAMILY]
    assert answer.arch_known and answer.arch_error is None and "DFlashDraftModel" in answer.dflash_archs


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_family_trains_exports_and_is_served_or_checked(arch, tmp_path, vllm_answers, monkeypatch):
    target, data = tmp_path / "target", tmp_path / "data"
    run = train_tiny(tmp_path / "run", f"target.path={target}", f"target.tiny={arch}", f"data.train={data / 'train.jsonl'}",
                     f"data.val={data / 'val.jsonl'}", "prepare.num_train=16", "prepare.num_val=4", "prepare.max_new_tokens=16",
                     "train.max_steps=60")
    losses = [r["loss"] for r in read_metrics(run) if "split" not in r]
    assert losses[-1] < losses[0] - 0.1, losses

    export = export_draft(run, tmp_path / "export", dtype="float32")  # raises if the reload check fails
    check = json.loads((export / EXPORT_INFO).read_text())["reload_check"]
    assert check["max_abs_diff"] <= check["tolerance"]

    answer = vllm_answers[FAMILIES[arch]]
    monkeypatch.setattr(harness, "plan_serving", lambda cfg: plan_serving(cfg, probe=lambda *_: answer))
    report = harness.run(ServeConfig(draft_dir=str(export), target_dir=str(target), out=str(tmp_path / "serve"),
                                     num_prompts=3, max_tokens=24, rounds=1, vllm_python=str(SERVE_PYTHON)))
    problem = target_serving_problem(answer, read_target(target))
    if problem is None:
        assert report["engine"] == "vllm"
    else:
        assert report["engine"] == "reference"
        assert any(FAMILIES[arch] in w and problem in w for w in report["warnings"]), report["warnings"]
    assert report["lossless"] is True
    assert report["draft_active"] is True

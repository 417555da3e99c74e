"""`blockdraft pipeline ... rows=<rows>` end to end on the tiny target: rows the target answered earlier
(the regen app, run by hand) start a run; the held-out rows are carved out of them by prompt content,
training and the serve check read the two sides, and a rerun keeps every stage. Served by the reference
engine: what is measured is what the run does with given rows, not what vLLM computes (that is
tests/integration/test_pipeline.py). The logic, fast, is tests/unit/test_pipeline_given_rows.py."""

import json
import os
import subprocess
import sys

import pytest

from blockdraft.data.prompt_record import prompt_hash
from blockdraft.models.tiny_target import save_tiny_target
from tests.integration.conftest import REPO

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
SMALL = ["experiment=tiny_cpu", "regen.num_heldout=4", "train.max_steps=30", "train.log_every=10", "train.progress=false",
         "serve.num_prompts=2", "serve.max_tokens=24", "serve.rounds=1", "serve.engine=reference", "round_cost=false"]


def run(*argv):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)


def prompts(path):
    return {prompt_hash(json.loads(line)["messages"]) for line in path.read_text().splitlines()}


@pytest.mark.slow
def test_a_pipeline_from_given_rows_trains_serves_and_keeps_them_on_a_rerun(tmp_path):
    save_tiny_target(TARGET, "qwen3")
    answered = tmp_path / "answered"
    made = run("blockdraft.regen", f"target={TARGET}", f"out={answered}", "prompts=tiny_prompts", "num_train=36",
               "num_heldout=0", "max_tokens=32", "backend=transformers", "progress=false")
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path / "run"
    first = run("blockdraft.pipeline", f"target={TARGET}", f"out={out}", f"rows={answered / 'train.jsonl'}", *SMALL)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ran = [line.split()[2] for line in first.stdout.splitlines() if line.startswith("[pipeline] === ")]
    assert ran == ["regen", "capture", "train", "export", "serve"]
    train, held = out / "regen" / "train.jsonl", out / "regen" / "heldout.jsonl"
    assert len(held.read_text().splitlines()) == 4 and not prompts(train) & prompts(held)
    report = json.loads((out / "serve" / "report.json").read_text())
    assert report["lossless"] is True and report["spec_decode"]["num_drafts"] > 0
    second = run("blockdraft.pipeline", f"target={TARGET}", f"out={out}", f"rows={answered / 'train.jsonl'}", *SMALL)
    assert second.returncode == 0 and second.stdout.count(": cached (") == 5, second.stdout[-3000:]

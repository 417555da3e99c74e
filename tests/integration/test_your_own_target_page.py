"""docs/your-own-target.md run as a team would run it, on the tiny target: its commands are read from the
page, not copied here, and run from the checkout with one change, `runs/` moved into a temporary folder.

- `suggest` prints the keys the page shows, and the example rows the page shows open examples/chats.jsonl.
- The rehearsal pipeline (no recipe: suggest's keys on the command line, the rows of examples/chats.jsonl)
  passes its serve check, and run again prints `cached` for every stage. In `make test` it runs without its
  three vLLM start-ups: regen through transformers, no gate, the serve check on the reference engine, no
  round-cost probe (the gate and the serve stage in real vLLM are tests/integration/test_gate.py's DFlash
  gate and tests/slow/test_demo_scaled_down.py). `make test-slow` runs it exactly as written.
- `rows=` starts a run from the rehearsal's own rows (`make test-slow`; `make test` composes the command).
- The two `train` commands: the second, with `resume=auto`, continues the first's checkpoint.
"""

import json
import os
import re
import shlex
import subprocess

import pytest

from blockdraft.models.tiny_target import save_tiny_target
from tests.integration.conftest import REPO
from tests.unit.command_check import commands_in_markdown

PAGE = REPO / "docs" / "your-own-target.md"
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
# The fenced commands, as a reader copies them (inline code spans are prose).
COMMANDS = [c.text for c in commands_in_markdown(PAGE) if c.text == c.context and c.text.startswith(".venv/bin/")]
# What make test leaves out of the rehearsal: its vLLM start-ups (the words replaced, then the words added).
WITHOUT_VLLM = ({"gate=true": "gate=false"}, ["regen.backend=transformers", "serve.engine=reference", "round_cost=false"])


def page_command(*needles):
    found = [c for c in COMMANDS if all(n in c for n in needles)]
    assert len(found) == 1, f"the page should hold one command with {needles}: {found}"
    return found[0]


def run(command, runs, replace=None, add=()):
    words = [(replace or {}).get(w, w) for w in shlex.split(command.replace("runs/", f"{runs}/"))]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    result = subprocess.run([*words, *add], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"{' '.join(words)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def stage_lines(out):
    table = out.split("================= stages =================")[1].split("=================")[0]
    return {line.split()[0]: line.split()[1] for line in table.splitlines() if line.startswith("  ")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    save_tiny_target(TARGET, "qwen3")
    return tmp_path_factory.mktemp("own_target") / "runs"


@pytest.fixture(scope="module")
def rehearsal(runs):
    command = page_command("pipeline", "examples/chats.jsonl")
    replace, add = WITHOUT_VLLM
    first = run(command, runs, replace, add)
    again = run(command, runs, replace, add)
    return first, again


def test_suggest_prints_the_keys_the_page_shows():
    out = run(page_command("suggest"), "runs")
    shown = PAGE.read_text().split("It prints, for\nthe tiny target:\n\n```\n")[1].split("```")[0]
    assert out.startswith(shown), f"the page shows:\n{shown}\nsuggest prints:\n{out[:len(shown) + 200]}"
    keys = re.search(r"^  (draft\.mask_token_id=\S+ .*)$", out, re.M).group(1).split()
    rehearsal_words = page_command("pipeline", "examples/chats.jsonl").split()
    assert all(k in rehearsal_words for k in keys if not k.startswith("draft.block_size")), \
        "the rehearsal should use suggest's keys (the block set for a CPU)"


def test_the_example_rows_the_page_shows_open_the_example_file():
    rows = [json.loads(line) for line in (REPO / "examples" / "chats.jsonl").read_text().splitlines()]
    shown = re.findall(r"```json\n(.*?)\n```", PAGE.read_text(), re.S)
    assert [json.loads(text) for text in shown] == rows[:2]
    assert {"conversations", "messages"} == {next(iter(row)) for row in rows} and len(rows) == 40


def test_the_rehearsal_passes_its_serve_check_with_no_recipe(rehearsal):
    first, _ = rehearsal
    assert "experiment=" not in page_command("pipeline", "examples/chats.jsonl")
    assert re.search(r"^  result\s+PASS$", first, re.M) and re.search(r"^  lossless\s+yes$", first, re.M)
    assert re.search(r"^  draft active\s+yes$", first, re.M)
    assert "================= deploy =================" in first and "vllm serve " in first.split("deploy")[-1]


def test_the_rehearsal_run_again_prints_cached_for_every_stage(rehearsal):
    _, again = rehearsal
    stages = stage_lines(again)
    assert {s: stages[s] for s in ("regen", "capture", "train", "export", "serve")} == dict.fromkeys(
        ("regen", "capture", "train", "export", "serve"), "cached")


@pytest.mark.slow  # make test composes this command (tests/unit/test_doc_commands.py); rows= end to end: test_pipeline_from_given_rows.py
def test_rows_the_target_answered_start_a_run_without_regen(rehearsal, runs):
    out = run(page_command("pipeline", "rows="), runs, add=["serve.engine=reference", "round_cost=false"])
    regen = runs / "own-rows" / "regen"
    assert (regen / "given.json").is_file() and not (regen / "regen.json").exists()  # recorded as given, not regenerated
    assert re.search(r"^  result\s+PASS$", out, re.M)


def test_a_run_started_by_hand_resumes_with_resume_auto(rehearsal, runs):
    first, second = [c for c in COMMANDS if c.startswith(".venv/bin/blockdraft train")]
    run(first, runs)
    out = run(second, runs)
    assert re.search(r"\[resume\] continuing from \S+step_20\S* at step 20", out), out[-2000:]
    steps = [json.loads(line).get("step") for line in (runs / "own-hand" / "metrics.jsonl").read_text().splitlines()]
    assert max(s for s in steps if s is not None) == 40


@pytest.mark.slow
@pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`")
def test_the_rehearsal_as_written_passes_in_real_vllm(tmp_path):
    """The page's rehearsal exactly as written: the gate, regen and the serve check in real vLLM (about five
    minutes on a 2-core CPU, most of it three pairs of vLLM start-ups)."""
    out = run(page_command("pipeline", "examples/chats.jsonl"), tmp_path / "runs")
    assert re.search(r"^  engine\s+vLLM", out, re.M) and re.search(r"^  result\s+PASS$", out, re.M)
    assert stage_lines(out)["gate"] != "not"

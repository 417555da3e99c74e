"""docs/your-own-target.md run as a team would run it, on the tiny target: its commands are read from the
page, not copied here, and run from the checkout with one change, `runs/` moved into a temporary folder.

- `suggest` prints the keys the page shows, and the example rows the page shows open examples/chats.jsonl.
- The rehearsal pipeline (no recipe: suggest's keys on the command line, the rows of examples/chats.jsonl)
  passes its serve check. In `make test` it runs without its vLLM start-ups (own_target_page.WITHOUT_VLLM),
  once for this file and tests/integration/test_pipeline.py, which checks every stage and that a rerun
  prints `cached` for each; `make test-slow` runs it exactly as written.
- `rows=` starts a run from the rehearsal's own rows (`make test-slow`; `make test` composes the command).
- The two `train` commands: the second, with `resume=auto`, continues the first's checkpoint.
"""

import json
import re

import pytest

from tests.integration.conftest import REPO
from tests.integration.own_target_page import PAGE, COMMANDS, page_command, rehearsal_command, run_page_command, stage_lines

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"


def run(command, runs, add=()):
    return run_page_command(command, runs, add=add).stdout


def test_suggest_prints_the_keys_the_page_shows():
    out = run(page_command("suggest"), "runs")
    shown = PAGE.read_text().split("It prints, for\nthe tiny target:\n\n```\n")[1].split("```")[0]
    assert out.startswith(shown), f"the page shows:\n{shown}\nsuggest prints:\n{out[:len(shown) + 200]}"
    keys = re.search(r"^  (draft\.mask_token_id=\S+ .*)$", out, re.M).group(1).split()
    rehearsal_words = rehearsal_command().split()
    assert all(k in rehearsal_words for k in keys if not k.startswith("draft.block_size")), \
        "the rehearsal should use suggest's keys (the block set for a CPU)"


def test_the_example_rows_the_page_shows_open_the_example_file():
    rows = [json.loads(line) for line in (REPO / "examples" / "chats.jsonl").read_text().splitlines()]
    shown = re.findall(r"```json\n(.*?)\n```", PAGE.read_text(), re.S)
    assert [json.loads(text) for text in shown] == rows[:2]
    assert {"conversations", "messages"} == {next(iter(row)) for row in rows} and len(rows) == 40


def test_the_rehearsal_passes_its_serve_check_with_no_recipe(page_rehearsal):
    _, _, result, _, _ = page_rehearsal
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first = result.stdout
    assert "experiment=" not in rehearsal_command()
    assert re.search(r"^  result\s+PASS$", first, re.M) and re.search(r"^  lossless\s+yes$", first, re.M)
    assert re.search(r"^  draft active\s+yes$", first, re.M)
    assert "================= deploy =================" in first and "vllm serve " in first.split("deploy")[-1]


@pytest.mark.slow  # make test composes this command (tests/unit/test_doc_commands.py); rows= end to end: test_pipeline_from_given_rows.py
def test_rows_the_target_answered_start_a_run_without_regen(page_rehearsal):
    runs = page_rehearsal[0]
    out = run(page_command("pipeline", "rows="), runs, add=["serve.engine=reference", "round_cost=false"])
    regen = runs / "own-rows" / "regen"
    assert (regen / "given.json").is_file() and not (regen / "regen.json").exists()  # recorded as given, not regenerated
    assert re.search(r"^  result\s+PASS$", out, re.M)


def test_a_run_started_by_hand_resumes_with_resume_auto(page_rehearsal):
    runs = page_rehearsal[0]
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
    out = run(rehearsal_command(), tmp_path / "runs")
    assert re.search(r"^  engine\s+vLLM", out, re.M) and re.search(r"^  result\s+PASS$", out, re.M)
    assert stage_lines(out)["gate"] != "not"

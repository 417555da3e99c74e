"""docs/your-own-target.md's commands as a reader copies them, and how the tests run them: from the checkout,
with `runs/` moved into a temporary folder."""

import os
import shlex
import subprocess

from tests.integration.conftest import REPO
from tests.unit.command_check import commands_in_markdown

PAGE = REPO / "docs" / "your-own-target.md"
# The fenced commands (inline code spans are prose).
COMMANDS = [c.text for c in commands_in_markdown(PAGE) if c.text == c.context and c.text.startswith(".venv/bin/")]
# What make test leaves out of the rehearsal: its vLLM start-ups (the words replaced, then the words added). The
# gate and the serve stage in real vLLM are tests/integration/test_gate.py's DFlash gate and
# tests/slow/test_demo_scaled_down.py; the rehearsal as written runs in make test-slow.
WITHOUT_VLLM = ({"gate=true": "gate=false"}, ["regen.backend=transformers", "serve.engine=reference", "round_cost=false"])


def page_command(*needles):
    found = [c for c in COMMANDS if all(n in c for n in needles)]
    assert len(found) == 1, f"the page should hold one command with {needles}: {found}"
    return found[0]


def rehearsal_command():
    return page_command("pipeline", "examples/chats.jsonl")


def run_page_command(command, runs, replace=None, add=(), check=True):
    """The command as written (`runs/` under `runs`), some words replaced and some added; its CompletedProcess."""
    words = [(replace or {}).get(w, w) for w in shlex.split(command.replace("runs/", f"{runs}/"))]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    result = subprocess.run([*words, *add], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    if check:
        assert result.returncode == 0, f"{' '.join(words)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def stage_lines(out):
    """The pipeline summary's stage table: stage -> its first word (a time, `cached`, `not`)."""
    table = out.split("================= stages =================")[1].split("=================")[0]
    return {line.split()[0]: line.split()[1] for line in table.splitlines() if line.startswith("  ")}

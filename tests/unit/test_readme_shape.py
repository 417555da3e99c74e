"""The README stays a front page: at most 150 lines, with the first run of a minute and the demo's figures;
everything else lives in docs/ and is linked from it; the benchmark pages repeat no heading."""

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_the_readme_is_at_most_150_lines():
    assert len(README.splitlines()) <= 150, f"README.md has {len(README.splitlines())} lines; move detail to docs/"


def test_the_readme_holds_the_first_run_the_demo_and_how_to_run_commands():
    for heading in ("## Running commands", "## Quick start", "### A first run in a minute", "## The demo: `make demo`"):
        assert heading in README, heading
    first_run = README[README.index("### A first run in a minute"):README.index("## The demo")]
    assert "experiment=tiny_cpu" in first_run and "engine=reference" in first_run and "lossless" in first_run
    assert "{{" not in README, "a placeholder is left in README.md"


def test_no_benchmark_page_repeats_a_heading():
    for page in ("benchmarks.md", "benchmarks-history.md"):
        headings = [line for line in (REPO / "docs" / page).read_text().splitlines() if re.match(r"#{1,6} ", line)]
        repeated = [h for h, n in Counter(headings).items() if n > 1]
        assert not repeated, f"docs/{page} repeats {repeated}"

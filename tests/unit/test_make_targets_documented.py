"""Every make target a user can type is documented: docs/getting-started.md's table names each `.PHONY` target
of the Makefile, and names no target the Makefile lacks."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_make_targets_table_matches_the_makefile():
    phony = set(re.search(r"^\.PHONY:(.*)$", (REPO / "Makefile").read_text(), re.M).group(1).split())
    page = (REPO / "docs" / "getting-started.md").read_text()
    table = page.split("## The make targets")[1].split("\n## ")[0]
    documented = set(re.findall(r"^\| `make ([\w-]+)` \|", table, re.M))
    assert documented == phony

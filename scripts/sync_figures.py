"""Copy each measured figure's block from its one home, docs/benchmarks.md, into the pages that show it.

A block in docs/benchmarks.md:

    <!-- figures: demo -->
    ...the table, its command, machine and date...
    <!-- /figures -->

A page that shows it holds the same markers; this script rewrites what lies between them from the source.
A few blocks are settings rather than measurements; their home is the code, and they are rendered from it
(GENERATED: the demo's preset, from blockdraft/demo.py).

    .venv/bin/python scripts/sync_figures.py            # rewrite every copy
    .venv/bin/python scripts/sync_figures.py --check    # list stale or unknown copies; exit 1 if any

tests/unit/test_figures_one_home.py runs the check, so a figure changed in one place only fails `make test`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / "docs" / "benchmarks.md"
BLOCK = re.compile(r"(<!-- figures: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)


def blocks(text: str) -> Dict[str, str]:
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def demo_preset() -> str:
    """The demo's preset as blockdraft/demo.py holds it: the keys every CPU gets, then each class's sized ones."""
    from blockdraft import demo

    words, lines, line = list(demo.PRESET), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > 100:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    rows = [f"| {demo.CPU_NAMES[name]} | `{' '.join(demo.sized_for_class(name))}` |" for name in demo.SIZES]
    return ("```\n" + "\n".join(lines) + "\n```\n\nand the keys sized for the CPU's class:\n\n"
            "| CPU class | sized keys |\n|---|---|\n" + "\n".join(rows) + "\n")


GENERATED = {"demo-preset": demo_preset}


def sources() -> Dict[str, str]:
    return {**blocks(HOME.read_text()), **{name: render() for name, render in GENERATED.items()}}


def pages() -> List[Path]:
    """Every page but the figures' home and its history."""
    return [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if not p.name.startswith("benchmarks"))]


def synced(text: str, source: Dict[str, str]) -> str:
    def fill(m: re.Match) -> str:
        if m["name"] not in source:
            raise KeyError(m["name"])
        return m.group(1) + source[m["name"]] + m.group(4)

    return BLOCK.sub(fill, text)


def problems() -> List[str]:
    source = sources()
    found = []
    for page in pages():
        for name, body in blocks(page.read_text()).items():
            if name not in source:
                found.append(f"{page.relative_to(REPO)}: figures '{name}' has no block in docs/benchmarks.md")
            elif body != source[name]:
                home = "the code's" if name in GENERATED else "docs/benchmarks.md's"
                found.append(f"{page.relative_to(REPO)}: figures '{name}' differs from {home}; "
                             "run python scripts/sync_figures.py")
    return found


def main(argv: List[str]) -> int:
    if "--check" in argv:
        found = problems()
        print("\n".join(found) or "every copied figure matches docs/benchmarks.md")
        return 1 if found else 0
    source = sources()
    for page in pages():
        text = page.read_text()
        try:
            new = synced(text, source)
        except KeyError as missing:
            print(f"{page.relative_to(REPO)}: figures {missing} has no block in docs/benchmarks.md", file=sys.stderr)
            return 1
        if new != text:
            page.write_text(new)
            print(f"updated {page.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

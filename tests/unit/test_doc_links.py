"""Every relative link in README.md and docs/*.md resolves: the file exists, and an anchor names a
heading of that page as GitHub spells it (lowercase, spaces to hyphens, punctuation dropped, a
repeated heading numbered -1, -2, ...)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> List[Tuple[int, str]]:
    """(line number, line) outside fenced code blocks: links and headings in code are not rendered."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def github_anchor(heading: str) -> str:
    """GitHub's heading id: the rendered text lowercased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and underscores, as GitHub does
    return text.replace(" ", "-")


def anchors_of(page: Path) -> Set[str]:
    seen: dict = {}
    anchors = set()
    for _, line in prose_lines(page.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = github_anchor(match.group(2))
        count = seen.get(base, 0)
        anchors.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return anchors


def relative_links(page: Path) -> List[Tuple[int, str]]:
    links = []
    for number, line in prose_lines(page.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                links.append((number, target))
    return links


def broken(page: Path, target: str) -> str | None:
    path_part, _, anchor = target.partition("#")
    linked = (page.parent / path_part).resolve() if path_part else page
    if not linked.exists():
        return f"{path_part} does not exist"
    if anchor and linked.suffix == ".md" and anchor not in anchors_of(linked):
        return f"{linked.name} has no heading whose anchor is #{anchor}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_resolves(page):
    problems = [f"{page.relative_to(REPO)}:{number}: ({target}) {why}"
                for number, target in relative_links(page) if (why := broken(page, target))]
    assert not problems, "\n".join(problems)


def test_the_anchor_rule_is_githubs():
    assert github_anchor("Serving other stacks' drafts unchanged: the vLLM plugin") == \
        "serving-other-stacks-drafts-unchanged-the-vllm-plugin"
    assert github_anchor("The loop and the loss: `train.*`") == "the-loop-and-the-loss-train"
    assert github_anchor("Position weights (`train.position_weighting`)") == "position-weights-trainposition_weighting"
    assert github_anchor("[A link](x.md) in a heading") == "a-link-in-a-heading"


def test_the_check_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## Same\n\n## Same\n\n[a](page.md#same-1) [b](gone.md) [c](#nowhere)\n"
                    "`[not a link](gone.md)`\n```\n[in code](gone.md)\n```\n[d](https://example.com/x)\n")
    found = {target: broken(page, target) for _, target in relative_links(page)}
    assert set(found) == {"page.md#same-1", "gone.md", "#nowhere"}
    assert found["page.md#same-1"] is None and "does not exist" in found["gone.md"] and "#nowhere" in found["#nowhere"]

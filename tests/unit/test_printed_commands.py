"""Every command the product prints (in an error, a note or its help, written between backticks) works
as printed: the same check as the docs' commands, over the string literals of blockdraft/."""

from __future__ import annotations

import ast
import re

import pytest

from tests.unit.command_check import COMMAND_START, REPO, Command, check
from tests.unit.test_doc_commands import concrete  # noqa: F401  (the fixture: targets of each shape)


def literal_text(node: ast.AST) -> str:
    """A string literal's text; an f-string's {expression} becomes a <placeholder> a user would fill."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        else:
            name = ast.unparse(value.value).split(".")[-1].strip("()[]'\"") or "value"
            parts.append(f"<{re.sub(r'[^A-Za-z0-9_]+', '_', name)}>")
    return "".join(parts)


def printed_commands():
    found = []
    for path in sorted((REPO / "blockdraft").rglob("*.py")):
        tree = ast.parse(path.read_text())
        joined = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if id(node) in joined or not (isinstance(node, ast.JoinedStr) or
                                          (isinstance(node, ast.Constant) and isinstance(node.value, str))):
                continue
            for span in re.findall(r"`([^`]+)`", literal_text(node)):
                if COMMAND_START.match(span) and not span.rstrip().endswith(("blockdraft", "-m")):
                    found.append(Command(f"{path.relative_to(REPO)}:{node.lineno}", span.strip(), span))
    return found


COMMANDS = printed_commands()


def test_the_product_prints_commands():
    texts = " | ".join(c.text for c in COMMANDS)
    assert len(COMMANDS) >= 10, texts
    assert "suggest" in texts and "make setup-serve" in texts


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_each_printed_command_works_as_printed(command, concrete):  # noqa: F811
    problem = check(command, concrete)
    assert problem is None, f"{command}\n{problem}"

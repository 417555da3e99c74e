"""The code runs on the oldest Python that pyproject.toml's `requires-python` promises.

No interpreter of that version is installed here, so the check is static, over every Python file
of the project (package, plugin, scripts, tests): each parses under that version's grammar, and
none imports a standard-library module or name that arrived later. A module guarded by
`except ModuleNotFoundError` / `ImportError` (a fallback for older versions) is allowed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("blockdraft", "vllm_plugin", "scripts", "tests")

# Standard-library modules and names newer than 3.10, with the version that added them.
NEW_MODULES = {"tomllib": (3, 11), "wsgiref.types": (3, 11)}
NEW_NAMES = {
    "typing": {"Self": (3, 11), "LiteralString": (3, 11), "Never": (3, 11), "assert_never": (3, 11),
               "assert_type": (3, 11), "reveal_type": (3, 11), "Required": (3, 11), "NotRequired": (3, 11),
               "TypeVarTuple": (3, 11), "Unpack": (3, 11), "dataclass_transform": (3, 11), "override": (3, 12),
               "TypeAliasType": (3, 12), "ReadOnly": (3, 13), "TypeIs": (3, 13)},
    "enum": {"StrEnum": (3, 11), "verify": (3, 11), "member": (3, 11), "nonmember": (3, 11), "ReprEnum": (3, 11),
             "EnumCheck": (3, 11)},
    "datetime": {"UTC": (3, 11)},
    "itertools": {"batched": (3, 12)},
    "contextlib": {"chdir": (3, 11)},
    "asyncio": {"TaskGroup": (3, 11), "timeout": (3, 11), "Runner": (3, 11)},
    "hashlib": {"file_digest": (3, 11)},
    "math": {"cbrt": (3, 11), "exp2": (3, 11)},
    "operator": {"call": (3, 11)},
    "builtins": {"ExceptionGroup": (3, 11), "BaseExceptionGroup": (3, 11)},
}


def declared_minimum() -> Tuple[int, int]:
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(r'^requires-python\s*=\s*">=\s*(\d+)\.(\d+)"', text, re.M)
    assert found, "pyproject.toml has no requires-python = \">=X.Y\""
    return int(found.group(1)), int(found.group(2))


def python_files() -> Iterator[Path]:
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            if not any(part.startswith(".") or part in ("build", "__pycache__") for part in path.parts):
                yield path


def guarded(node: ast.AST, parents: dict) -> bool:
    """Inside `try:` whose handler catches ImportError or ModuleNotFoundError: a fallback exists."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                names = [handler.type] if not isinstance(handler.type, ast.Tuple) else handler.type.elts
                if any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names):
                    return True
    return False


def newer_than(source: str, minimum: Tuple[int, int]) -> List[str]:
    """What in `source` needs a Python newer than `minimum`: syntax, modules or names."""
    try:
        tree = ast.parse(source, feature_version=minimum)
    except SyntaxError as err:
        return [f"line {err.lineno}: syntax newer than {minimum[0]}.{minimum[1]}: {err.msg}"]
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    aliases = {}  # local name -> stdlib module, for `import datetime as dt` then dt.UTC
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
                since = NEW_MODULES.get(alias.name)
                if since and since > minimum and not guarded(node, parents):
                    found.append(f"line {node.lineno}: import {alias.name} (Python {since[0]}.{since[1]})")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            since = NEW_MODULES.get(node.module)
            if since and since > minimum and not guarded(node, parents):
                found.append(f"line {node.lineno}: from {node.module} import (Python {since[0]}.{since[1]})")
            for alias in node.names:
                since = NEW_NAMES.get(node.module, {}).get(alias.name)
                if since and since > minimum and not guarded(node, parents):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name} (Python {since[0]}.{since[1]})")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            since = NEW_NAMES.get(module or "", {}).get(node.attr)
            if since and since > minimum:
                found.append(f"line {node.lineno}: {module}.{node.attr} (Python {since[0]}.{since[1]})")
        elif isinstance(node, ast.Name) and node.id in NEW_NAMES["builtins"]:
            since = NEW_NAMES["builtins"][node.id]
            if since > minimum:
                found.append(f"line {node.lineno}: {node.id} (Python {since[0]}.{since[1]})")
    return found


def test_every_file_runs_on_the_declared_minimum():
    minimum = declared_minimum()
    problems = []
    for path in python_files():
        for problem in newer_than(path.read_text(), minimum):
            problems.append(f"{path.relative_to(REPO)} {problem}")
    assert not problems, (f"requires-python says >={minimum[0]}.{minimum[1]}, but:\n  " + "\n  ".join(problems)
                          + "\nguard the import with a fallback, or raise requires-python (and the README) to match.")


@pytest.mark.parametrize("source", [
    "import tomllib\n",
    "from typing import Self\n",
    "import datetime\nx = datetime.UTC\n",
    "import datetime as dt\nx = dt.UTC\n",
    "try:\n    pass\nexcept* ValueError:\n    pass\n",
    "def f[T](x: T) -> T:\n    return x\n",
    "raise ExceptionGroup('x', [ValueError()])\n",
])
def test_the_check_finds_what_310_lacks(source):
    assert newer_than(source, (3, 10))


@pytest.mark.parametrize("source", [
    "try:\n    import tomllib\nexcept ModuleNotFoundError:\n    import tomli as tomllib\n",
    "match x:\n    case 1:\n        pass\n",
    "from typing import Optional\nimport datetime\nx = datetime.timezone.utc\n",
])
def test_the_check_allows_what_310_has(source):
    assert not newer_than(source, (3, 10))

"""Every row of docs/reliability.md names a test that exists: the fault suite's rows name the test that recorded
them, and the rows held by `make test` (scripts/reliability_rows.py) name theirs, checked here."""

import ast
import importlib.util

import pytest

from tests.integration.conftest import REPO


def guarantees():
    spec = importlib.util.spec_from_file_location("reliability_rows", REPO / "scripts" / "reliability_rows.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GUARANTEES


@pytest.mark.parametrize("what,test", guarantees())
def test_each_guarantee_names_a_test_that_exists(what, test):
    path, _, name = test.partition("::")
    tree = ast.parse((REPO / path).read_text())
    assert name in {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}, f"{test} ({what})"

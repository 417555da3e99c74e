"""One variable moves everything blockdraft keeps between runs: the token files and the round-cost record
sit under $BLOCKDRAFT_CACHE_DIR, and the retired token-file variable still works, with a warning naming it."""

import ast
from pathlib import Path

import pytest

from blockdraft import cache_paths
from blockdraft.data.config import DataConfig
from blockdraft.pipeline.round_cost_record import record_path

PACKAGE = Path(cache_paths.__file__).parent


def test_one_root_holds_the_token_files_and_the_round_costs(monkeypatch, tmp_path):
    monkeypatch.setenv("BLOCKDRAFT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("BLOCKDRAFT_CACHE", raising=False)
    assert DataConfig().resolved_cache_dir() == tmp_path / "tokenized"
    assert record_path() == tmp_path / "round_costs.json"


def test_without_the_variable_the_root_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("BLOCKDRAFT_CACHE_DIR", raising=False)
    monkeypatch.delenv("BLOCKDRAFT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_paths.cache_root() == tmp_path / "blockdraft"
    assert record_path().parent == DataConfig().resolved_cache_dir().parent == tmp_path / "blockdraft"


def test_the_retired_variable_still_points_the_token_files_and_says_its_successor(monkeypatch, tmp_path):
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path / "old"))
    with pytest.warns(FutureWarning, match="BLOCKDRAFT_CACHE_DIR"):
        assert DataConfig().resolved_cache_dir() == tmp_path / "old"


def test_no_other_module_reads_a_cache_variable():
    """The variables are read in one module: a second reader is how two names for one cache began."""
    readers = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "cache_paths.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("BLOCKDRAFT_CACHE"):
                readers.append(str(path.relative_to(PACKAGE)))
    assert readers == []

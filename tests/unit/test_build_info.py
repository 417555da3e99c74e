"""The version is defined once, and the commit is found in a checkout and "unknown" anywhere else."""

import subprocess
from importlib.metadata import version as installed
from pathlib import Path

import blockdraft
from blockdraft import build_info

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def test_the_version_is_defined_once_in_the_package():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "blockdraft.__version__"}
    assert installed("blockdraft") == blockdraft.__version__  # what pip recorded is read from there


def test_the_commit_is_this_checkouts_head():
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    build_info.git_commit.cache_clear()
    assert build_info.git_commit(REPO).removesuffix("-dirty") == head
    assert build_info.build_info() == {"blockdraft_version": blockdraft.__version__,
                                       "blockdraft_commit": build_info.git_commit(REPO)}


def test_outside_a_checkout_the_commit_is_unknown(tmp_path, monkeypatch):
    build_info.git_commit.cache_clear()
    assert build_info.git_commit(tmp_path) == "unknown"  # an installed copy: no .git beside it
    inner = tmp_path / "vendored"
    inner.mkdir()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (inner / ".git").write_text("gitdir: nowhere\n")  # a broken .git: no checkout, no error
    assert build_info.git_commit(inner) == "unknown"
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))  # git not installed: never fails
    assert build_info.git_commit(REPO) == "unknown"
    build_info.git_commit.cache_clear()

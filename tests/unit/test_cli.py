"""The `blockdraft` command: its help, its version, each subcommand the same app as its module."""

import subprocess

import pytest

from blockdraft import cli
from tests.integration.conftest import REPO

BLOCKDRAFT = REPO / ".venv" / "bin" / "blockdraft"
needs_script = pytest.mark.skipif(not BLOCKDRAFT.exists(), reason="the console script comes with `make setup`")


def run(*args):
    return subprocess.run([str(BLOCKDRAFT), *args], cwd=REPO, capture_output=True, text=True, timeout=300)


@needs_script
def test_help_lists_every_subcommand_with_one_line_each():
    result = run("--help")
    assert result.returncode == 0
    for name in ("train", "capture", "regen", "export", "serve", "eval", "gate", "pipeline", "inspect", "suggest"):
        assert any(line.split()[:1] == [name] and len(line.split()) > 2 for line in result.stdout.splitlines()), name


@needs_script
def test_version_is_the_installed_one():
    from importlib.metadata import version

    result = run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"blockdraft {version('blockdraft')}"


@needs_script
def test_a_subcommand_is_its_module_with_its_help_and_cfg_job(capsys):
    train = run("train", "--help")
    module = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "blockdraft.train", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert train.returncode == 0 and "train.max_steps: int = " in train.stdout
    # The same help, each naming the command it was started as.
    assert train.stdout.replace("blockdraft train", "PROG") == module.stdout.replace("python -m blockdraft.train", "PROG")
    # The script and the module are one app (above): its settings are read in this process, without two more
    # interpreters' imports.
    assert main_status("train", "--cfg", "job", "experiment=tiny_cpu", "train.max_steps=7") == 0
    assert "max_steps: 7" in capsys.readouterr().out
    assert main_status("train", "train.max_stepz=3") != 0 and "max_stepz" in capsys.readouterr().err


def main_status(*args) -> int:
    try:
        return cli.main(list(args))
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 1


# In this process the suite has imported those modules already, which runpy warns of; a console run has not.
@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")
@pytest.mark.parametrize("command,needle", [("gate", "python -m blockdraft.gate target=<HF dir>"),
                                            ("pipeline", "blockdraft pipeline target=<HF dir> out=<dir>"),
                                            ("suggest", "python -m blockdraft.models.suggest <target_dir>")])
def test_subcommands_without_hydra_have_help_too(command, needle, capsys):
    assert cli.main([command, "--help"]) == 0
    assert needle in capsys.readouterr().out


def test_a_misspelt_subcommand_names_the_closest_and_every_command(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'trian'" in err and "did you mean 'train'" in err and "pipeline" in err


def test_no_subcommand_prints_the_usage_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: blockdraft <command>" in capsys.readouterr().out

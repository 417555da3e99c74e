"""`target=<dir>` in the training and capture apps: a directory is target.path (no tiny target), a name of
configs/target/ is still the group, anything else is refused in one line before any work; and every
`suggest` command the product prints runs as printed."""

import re

import pytest

from blockdraft import cli
from blockdraft.config.target_argument import rewrite_target_argument
from blockdraft.errors import ConfigError
from blockdraft.models.tiny_target import save_tiny_target
from tests.integration.conftest import REPO

# In this process the suite has imported the app modules already, which runpy warns of; a console run has not.
pytestmark = pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_tiny_target(tmp_path_factory.mktemp("target") / "tiny-qwen3")


def test_a_directory_becomes_target_path_without_a_tiny_target(target_dir):
    assert rewrite_target_argument(["app", f"target={target_dir}", "x=1"]) == \
        ["app", f"target.path={target_dir}", "target.tiny=null", "x=1"]


@pytest.mark.parametrize("name", ["tiny", "smollm2_135m", "qwen3_8b"])
def test_a_target_config_name_stays_the_group(name):
    assert rewrite_target_argument([f"target={name}"]) == [f"target={name}"]


@pytest.mark.parametrize("value,says", [("/no/such/dir", "neither a directory nor a target config"),
                                        ("configs", "has no config.json")])
def test_a_non_model_directory_is_refused_in_one_line(value, says, capsys):
    with pytest.raises(ConfigError, match=says):
        rewrite_target_argument([f"target={value}"])
    assert cli.main(["train", f"target={value}", "run_dir=/tmp/never"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and "local Hugging Face model directory" in err


def test_train_and_capture_compose_a_target_directory(target_dir, capsys):
    # Hydra reads its overrides after its flags: `--cfg job` comes first.
    for command in (["train", "--cfg", "job", "experiment=tiny_cpu"], ["capture", "--cfg", "job", "experiment=tiny_cpu", "out=/tmp/store"]):
        assert cli.main([*command, f"target={target_dir}"]) == 0
        out = capsys.readouterr().out
        assert f"path: {target_dir}\n  tiny: null" in out, command


def test_a_group_name_still_selects_the_group(capsys):
    assert cli.main(["capture", "--cfg", "job", "target=smollm2_135m", "out=/tmp/store"]) == 0
    assert "path: .cache/targets/smollm2-135m-instruct" in capsys.readouterr().out


def printed_suggest_commands():
    """The suggest commands the product's messages print, placeholders as written (`python -m ... <words>`)."""
    found = set()
    for source in (REPO / "blockdraft").rglob("*.py"):
        found.update(re.findall(r"`python -m blockdraft\.models\.suggest ([^`]*)`", source.read_text()))
    assert found, "the refusals that name suggest are gone: drop this test or find where they went"
    return found


def test_every_printed_suggest_command_runs_as_printed(target_dir, capsys):
    from blockdraft.models import suggest

    for words in {*printed_suggest_commands(), "<dir> 2"}:  # the second: the positional form
        filled = re.sub(r"<\w*dir>", str(target_dir), words).replace("[", "").replace("]", "")  # [x]: x, optional
        assert suggest.main(filled.split()) == 0, words
        assert "mask_token_id candidates" in capsys.readouterr().out


def test_suggest_takes_target_and_num_draft_layers_keys(target_dir, capsys):
    assert cli.main(["suggest", f"target={target_dir}", "num_draft_layers=2"]) == 0
    out = capsys.readouterr().out
    assert "draft.mask_token_id=260 draft.target_layer_ids=[1,3] draft.num_layers=2 draft.block_size=16" in out
    assert "262\t<|reserved_2|>" in out
    assert cli.main(["suggest", f"target={target_dir}"]) == 0  # 5 layers collapse on 6: the most that fit
    out = capsys.readouterr().out
    assert "3 suggested" in out and "draft.target_layer_ids=[1,2,3] draft.num_layers=3" in out
    assert cli.main(["suggest", "target=/no/such/dir"]) == 2
    assert "has no config.json" in capsys.readouterr().err

"""`--help` of each app lists every key it composes with a meaning read from the schema, and every
subcommand that is not a Hydra app takes `--cfg job` (its settings, no work) or refuses it in one line."""

import re

import pytest
import yaml

from blockdraft import cli
from blockdraft.models.tiny_target import save_tiny_target
from tests.unit.command_check import prompt_plan_read_once

# In this process the suite has imported the app modules already, which runpy warns of; a console run has not.
pytestmark = pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")

# The keys each Hydra app needs before `--cfg job` composes (its MISSING ones).
HYDRA_APPS = {"train": [], "capture": ["out=/tmp/store"], "export": [], "serve": ["draft=/tmp/d", "target=/tmp/t"],
              "eval": ["target=/tmp/t"], "regen": ["target=/tmp/t", "out=/tmp/o"]}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_tiny_target(tmp_path_factory.mktemp("target") / "tiny-qwen3")


def leaf_keys(node, prefix=""):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaf_keys(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")


def help_meanings(text):
    """{key: meaning} from the `  key: type = default` lines and the indented lines under each."""
    meanings, key = {}, None
    for line in text.splitlines():
        row = re.match(r"^  (\S+): .* = ", line)
        if row:
            key = row.group(1)
            meanings[key] = ""
        elif key and line.startswith("      "):
            meanings[key] += line.strip() + " "
        else:
            key = None
    return meanings


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("app", HYDRA_APPS)
def test_help_gives_every_composed_key_a_meaning(app, capsys):
    code, composed, err = run(capsys, app, "--cfg", "job", *HYDRA_APPS[app])
    assert code == 0, err
    code, text, _ = run(capsys, app, "--help")
    assert code == 0 and text.startswith(f"usage: blockdraft {app} ") and "\nexample: " in text
    meanings = help_meanings(text)
    for key in leaf_keys(yaml.safe_load(composed)):
        # A dict-valued key (eval's sampling, say) is one key of the help: its entries are free-form.
        documented = [k for k in meanings if key == k or key.startswith(k + ".")]
        assert documented, f"{app}: {key} is not in --help"
        meaning = meanings[documented[0]].strip()
        assert meaning and meaning != "(no description)", f"{app}: {key} has no meaning in --help"


def test_train_help_shows_the_config_groups_and_a_recipes_defaults(capsys):
    _, text, _ = run(capsys, "train", "--help", "experiment=tiny_cpu")
    assert ("experiment=<dflash_gpu | qwen3_8b_dflash | qwen3_8b_dflash2 | qwen3_8b_dspark | qwen3_8b_lilicorr | smollm2_dflash2_cpu"
            " | smollm2_dflash_cpu | smollm2_dspark_cpu | smollm2_lilicorr_cpu | tiny_cpu>") in text
    assert "  draft.block_size: int = 4\n" in text  # the recipe's, not the schema's 16


def test_non_hydra_subcommands_list_their_keys(capsys):
    for command, key in (("pipeline", "store"), ("gate", "min_ratio"), ("suggest", "num_draft_layers"), ("demo", "experiment")):
        code, text, _ = run(capsys, command, "--help")
        meanings = help_meanings(text)
        assert code == 0 and meanings.get(key, "").strip(), (command, key)


def test_subcommands_print_their_settings_for_cfg_job(target_dir, tmp_path, capsys):
    target = f"target={target_dir}"
    cases = {
        "pipeline": ["pipeline", "--cfg", "job", target, f"out={tmp_path / 'p'}", "prompts=tiny", "experiment=tiny_cpu",
                     "round_cost=false"],
        "gate": ["gate", "--cfg", "job", target, f"out={tmp_path / 'g'}"],
        "suggest": ["suggest", "--cfg", "job", target],
        "demo": ["demo", "--cfg", "job", f"out={tmp_path / 'd'}"],
        "inspect": ["inspect", "--cfg", "job", str(tmp_path)],
    }
    # The demo's: its preset before SmolLM2 is prepared, the stages' composed configs after; both name the recipe.
    needles = {"pipeline": "# --- train:", "gate": "# --- training", "suggest": "num_draft_layers: 5", "demo": "smollm2_dflash_cpu",
               "inspect": f"inspect: {tmp_path}"}
    for name, argv in cases.items():
        with prompt_plan_read_once():  # the demo's preflight plans its prompts as the doc commands' checks do
            code, out, err = run(capsys, *argv)
        assert code == 0, (name, err)
        assert needles[name] in out, name
    assert not list((tmp_path).iterdir()), "a --cfg job wrote something"


@pytest.mark.parametrize("command", ["pipeline", "gate", "suggest", "demo"])
def test_another_cfg_value_is_refused_in_one_line(command, capsys):
    code, _, err = run(capsys, command, "--cfg", "all")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--cfg job" in err

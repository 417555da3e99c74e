"""`blockdraft train target=<dir>`: a local model directory trains as target.path, with no tiny target built."""

import os

import pytest
import yaml

from blockdraft import cli
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")
def test_train_target_dir_trains_against_that_directory(tmp_path):
    target = save_tiny_target(tmp_path / "target")
    cwd = os.getcwd()
    os.chdir(REPO)  # the recipe's rows are relative .cache paths
    try:
        code = cli.main(["train", "experiment=tiny_cpu", f"target={target}", f"run_dir={tmp_path / 'run'}",
                         "train.max_steps=2", "train.log_every=1", "train.save_every=0", "train.progress=false", "data.val=null"])
    finally:
        os.chdir(cwd)
    assert code == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["target"]["path"] == str(target) and saved["target"]["tiny"] is None
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r][-1] == 2

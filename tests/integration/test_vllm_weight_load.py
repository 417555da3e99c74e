"""vLLM itself loads every tensor of an export, and a missing one is caught.

vLLM's DFlash loader does not check for missing weights, so scripts/check_vllm_weights.py
loads the draft in the real engine and compares its parameters with the file.
"""

import os
import shutil

import pytest
from safetensors.torch import load_file, save_file

from tests.integration.conftest import REPO, export_here
from tests.integration.serving_env import serving_run

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"

pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.is_file(), reason=f"no serving env at {SERVE_PYTHON}; run `make setup-serve`"),
]


def check_weights(draft):
    # Two cores shared with other jobs: idle OpenMP threads must not spin.
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    return serving_run(["scripts/check_vllm_weights.py", "--target", str(TARGET), "--draft", str(draft)], cwd=REPO, env=env)


@pytest.fixture(scope="module")
def export(tiny_dflash_run, tmp_path_factory):
    return export_here(tiny_dflash_run, tmp_path_factory.mktemp("weight_load") / "export")


# Its positive path, vLLM loading every weight of an export, runs for every kind this machine's vLLM serves in
# tests/integration/test_kind_conformance.py (make test).
@pytest.mark.slow  # the checker's negative path (make test-slow)
def test_a_tensor_missing_from_the_export_is_reported(export, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(export, broken)
    (broken / "checksums.json").unlink(missing_ok=True)  # the file is edited on purpose
    weights = load_file(broken / "model.safetensors")
    dropped = "layers.0.mlp.down_proj.weight"
    del weights[dropped]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})

    proc = check_weights(broken)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    assert f"missing: model.{dropped}" in proc.stdout

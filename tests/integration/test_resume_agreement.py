"""Ranks resume from one checkpoint, rank 0's choice, or refuse together before any load.

Three gloo ranks, each shown its own copy of the run directory, as ranks on nodes whose shared file system lags
would see it: a newest checkpoint one rank does not see yet, a file another sees at another size. Every rank
must refuse alike, naming the rank and what it sees; a corrupt file, hashed by one rank only, is every rank's
refusal too; run directories seen alike resume from the same checkpoint on every rank."""

import json
import os
import shutil
import subprocess

import pytest

from blockdraft.integrity import write_checksums
from tests.integration.conftest import REPO, python

WORLD = 3


def _checkpoint(run_dir, step: int):
    path = run_dir / "checkpoints" / f"step_{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (path / "trainer_state.pt").write_bytes(b"state" * 100)
    (path / "config.yaml").write_text("train: {}\n")
    write_checksums(path)
    return path


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root = tmp_path_factory.mktemp("views")
    base = root / "base"
    _checkpoint(base, 2)
    _checkpoint(base, 4)
    views = {}
    for case in ("alike", "lagging", "resized", "corrupt"):
        views[case] = [shutil.copytree(base, root / case / f"rank{r}") for r in range(WORLD)]
    shutil.rmtree(views["lagging"][1] / "checkpoints" / "step_4")  # rank 1 does not see the newest yet
    with open(views["resized"][2] / "checkpoints" / "step_4" / "model.safetensors", "ab") as fh:
        fh.write(b"more")  # rank 2 sees the file at another size
    for r in range(WORLD):  # the same bytes everywhere, the last listed file flipped: hashed by one rank only
        state = views["corrupt"][r] / "checkpoints" / "step_4" / "trainer_state.pt"
        state.write_bytes(b"xtate" + state.read_bytes()[5:])
    cases = root / "cases.json"
    cases.write_text(json.dumps({case: [str(d) for d in dirs] for case, dirs in views.items()}))
    out = root / "out"
    out.mkdir()
    proc = subprocess.run([python(), "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", "--standalone",
                           str(REPO / "tests" / "integration" / "resume_agreement_worker.py"), str(cases), str(out)],
                          cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    assert proc.returncode == 0, proc.stdout.decode()[-3000:]
    got = {}
    for case in views:
        for r in range(WORLD):
            result = json.loads((out / f"{case}.rank{r}.json").read_text())
            got.setdefault(case, {})[r] = (result["kind"], result["text"])
    return got


def test_ranks_that_see_alike_resume_from_the_same_checkpoint(outcomes):
    assert outcomes["alike"] == {r: ("ok", "step_4") for r in range(WORLD)}


def test_a_rank_that_does_not_see_the_newest_checkpoint_stops_every_rank(outcomes):
    for rank in range(WORLD):
        kind, text = outcomes["lagging"][rank]
        assert kind == "ConfigError", text
        assert "rank 1 sees checkpoints ['step_2'], rank 0 sees ['step_2', 'step_4']" in text
        assert "nothing was loaded" in text and "resume=" in text


def test_a_file_seen_at_another_size_stops_every_rank(outcomes):
    for rank in range(WORLD):
        kind, text = outcomes["resized"][rank]
        assert kind == "ConfigError", text
        assert "rank 2 sees other sizes of model.safetensors" in text


def test_a_corrupt_file_hashed_by_one_rank_is_every_ranks_refusal(outcomes):
    for rank in range(WORLD):
        kind, text = outcomes["corrupt"][rank]
        assert kind == "DataError", text
        assert "step_4/trainer_state.pt is corrupt" in text

"""The user's path on a CPU: train a tiny_cpu draft, export it, smoke-serve it in real vLLM."""

import json
import os
import subprocess
import sys

import pytest

from tests.integration.conftest import REPO

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
# Slow (make test-slow): make test covers the same path in pieces, each in real vLLM: training, export
# and serving (the gate, test_gate.py), baseline against draft, lossless and active (the eval), and
# the harness's rounds, report and verdict against a stand-in server (test_serve_harness.py).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]


def _vllm_processes() -> list:
    """Live vLLM processes (a zombie has exited already: only its exit status is left)."""
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()[1:]]
    return [r[0] for r in rows if len(r) == 3 and not r[1].startswith("Z") and ("vllm.entrypoints" in r[2] or "VLLM::" in r[2])]


def test_trained_tiny_draft_is_lossless_and_active_in_vllm(tiny_dflash_run, tmp_path):
    export = tmp_path / "export"
    subprocess.run([sys.executable, "-m", "blockdraft.export", f"checkpoint={tiny_dflash_run}", f"out={export}", "dtype=float32"],
                   cwd=REPO, check=True, capture_output=True)
    before = _vllm_processes()
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "blockdraft.serve", f"draft={export}", f"target={REPO / '.cache/targets/tiny-qwen3'}",
         "prompts=tiny", "num_prompts=4", "max_tokens=48", "rounds=1", f"out={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=1500, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["engine"] == "vllm"
    assert report["lossless"] is True
    assert report["draft_active"] is True
    assert report["mean_acceptance_length"] > 1.2
    assert len(report["acceptance_per_position"]) == 3  # block 4 -> num_speculative_tokens 3
    # One round: how rounds alternate and combine is checked on a stand-in server (test_serve_harness),
    # and `make demo` serves two rounds in real vLLM.
    assert [r["order"] for r in report["rounds"]] == [["baseline", "draft"]]
    assert report["rounds"][0]["speedup"] > 0 and report["speedup_spread"] == [report["speedup"]] * 2
    assert (out / "acceptance.png").stat().st_size > 0
    # Only the harness's own: a server another job on the machine runs may start or end meanwhile.
    assert not set(_vllm_processes()) - set(before), "a vLLM process outlived the harness"

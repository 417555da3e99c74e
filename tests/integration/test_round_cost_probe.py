"""The pipeline's early round-cost probe against the fake vLLM, in seconds: the untrained draft of the
recipe's shape is served through `python -m blockdraft.serve` as the pipeline does, the figure is printed
with the acceptance length a draft needs, kept in the machine's record, and read from there by a rerun and
by a pipeline in another out; a changed machine or draft shape measures again.
The same probe in real vLLM is tests/slow/test_demo_scaled_down.py; tests/integration/test_pipeline.py
runs with round_cost=false and serves on the reference engine, so make test starts no vLLM for either."""

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from blockdraft import machine
from blockdraft.machine import machine_facts
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.pipeline import app, round_cost_record
from blockdraft.pipeline.records import StageRecords
from blockdraft.pipeline.round_cost import early_round_cost
from blockdraft.pipeline.settings import parse_overrides
from blockdraft.vllm_runtime.probe import MARKER
from tests.fake_vllm import INFO_FIELDS, write_fake_python
from tests.integration.conftest import REPO

TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
NEEDS = "the trained draft pays only with a mean acceptance length above"


def write_vllm_python(directory: Path) -> Path:
    """The serving interpreter the probe's child is pointed at. The serve app asks it what vLLM can do
    (`<python> -I probe.py <architectures>`) in its own process, where no test can patch the answer: this
    answers as the fake does in-process (a CPU vLLM that knows DFlash) and hands every other start to the fake."""
    fake = write_fake_python(directory / "fake_vllm")
    path = directory / "python"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "if sys.argv[1:2] == ['-I']:\n"
        f"    print({MARKER!r} + json.dumps({{a: {INFO_FIELDS!r} for a in sys.argv[3:]}}), flush=True)\n"
        "    sys.exit(0)\n"
        # exec, not a child: the harness stops the pid it started, which must be the server itself
        f"os.execv({str(fake)!r}, [{str(fake)!r}, *sys.argv[1:]])\n")
    path.chmod(0o755)
    return path


def settings(out: Path, vllm_python: Path, *extra):
    return parse_overrides([f"target={TARGET}", "prompts=tiny", "experiment=tiny_cpu", f"out={out}",
                            f"serve.vllm_python={vllm_python}", "serve.startup_timeout_s=60", *extra])


def said(call) -> tuple:
    """(what call() returned, what it printed)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        value = call()
    return value, printed.getvalue()


def server_starts(fake_dir: Path) -> int:
    argv = fake_dir / "argv"
    return len(argv.read_text().splitlines()) if argv.exists() else 0


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """One probe, measured on a fresh out: (out, fake_dir, vllm_python, its cost, what it printed)."""
    save_tiny_target(TARGET, "qwen3")
    work = tmp_path_factory.mktemp("round_cost")
    fake_dir = work / "fake"
    fake_dir.mkdir()
    vllm_python = write_vllm_python(fake_dir)
    out = work / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAKE_DIR", str(fake_dir))  # the fake records each server start's argv there
        mp.setenv("HF_HUB_OFFLINE", "1")
        s = settings(out, vllm_python)
        cfgs = app.prepare(s)
        cost, printed = said(lambda: early_round_cost(s, cfgs, StageRecords(s.root / "stages.json")))
        yield out, fake_dir, vllm_python, cost, printed


def test_the_probe_prints_the_round_cost_and_the_acceptance_a_draft_needs(probed):
    out, fake_dir, _, cost, printed = probed
    log = out / "round_cost" / "probe.log"
    assert cost is not None and cost > 0, printed + (log.read_text()[-3000:] if log.is_file() else "")
    assert f"round cost: a draft-and-verify round costs {cost:.2f} plain decode steps" in printed, printed
    assert f"{NEEDS} {cost:.2f}" in printed
    # One baseline and one draft server, kept for the one round, the prompts interleaved.
    assert server_starts(fake_dir) == 2
    report = json.loads((out / "round_cost" / "serve" / "report.json").read_text())
    assert report["engine"] == "vllm" and report["servers"] == "kept" and report["round_cost"] > 0
    assert report["round_cost"] == pytest.approx(cost) and report["interval"]["pairs"] == 4
    recorded = json.loads((out / "stages.json").read_text())["pipeline"]["round_cost"]
    assert recorded["round_cost"] == pytest.approx(cost) and recorded["key"] and not recorded["reused"]
    kept = json.loads(round_cost_record.record_path().read_text())
    assert kept[recorded["key"]]["round_cost"] == pytest.approx(cost)
    assert kept[recorded["key"]]["machine"]["cpu_model"] == machine_facts()["cpu_model"]


def test_another_out_on_the_same_machine_reads_the_record_and_starts_no_server(probed, tmp_path):
    _, fake_dir, vllm_python, cost, _ = probed
    s = settings(tmp_path / "another_out", vllm_python)
    again, printed = said(lambda: early_round_cost(s, app.prepare(s), StageRecords(s.root / "stages.json")))
    assert again == pytest.approx(cost)
    assert f"{NEEDS} {cost:.2f}" in printed and "on this machine" in printed, printed
    assert server_starts(fake_dir) == 2
    assert json.loads((s.root / "stages.json").read_text())["pipeline"]["round_cost"]["reused"] is True


@pytest.mark.parametrize("change", ["machine", "shape"])
def test_a_changed_cpu_or_draft_shape_measures_again(probed, tmp_path, monkeypatch, change):
    _, fake_dir, vllm_python, _, _ = probed
    started = server_starts(fake_dir)
    if change == "machine":
        other_cpu = {**machine_facts(), "cpu_model": "Another CPU", "avx512f": False, "avx512_bf16": False, "amx": False}
        monkeypatch.setattr(machine, "machine_facts", lambda: other_cpu)
        s = settings(tmp_path / "other", vllm_python)
    else:
        s = settings(tmp_path / "other", vllm_python, "draft.block_size=8")
    with monkeypatch.context() as mp:
        mp.setenv("FAKE_DIR", str(fake_dir))
        cost, printed = said(lambda: early_round_cost(s, app.prepare(s), StageRecords(s.root / "stages.json")))
    assert cost is not None and "measured in" in printed, printed
    assert server_starts(fake_dir) == started + 2


@pytest.mark.parametrize("word, probes", [("round_cost=true", True), ("round_cost=false", False)])
def test_the_pipeline_says_the_round_cost_before_its_stages_unless_round_cost_false(probed, monkeypatch, word, probes):
    out, fake_dir, vllm_python, _, _ = probed
    reached = []
    # The stages themselves are tests/integration/test_pipeline.py's; here only what comes before them.
    monkeypatch.setattr(app, "run_stages", lambda stages, *a, **k: reached.append([st.name for st in stages]) or {})
    monkeypatch.setattr(app, "summarize", lambda *a, **k: 0)
    code, printed = said(lambda: app.run_pipeline(settings(out, vllm_python, word)))
    assert code == 0 and reached and "regen" in reached[-1]
    # true: read from the machine's record the probe above left, so no server starts either way.
    assert ("on this machine" in printed) is probes, printed
    assert ("round cost" in printed) is probes

"""The whole harness (preflight, two servers, verdict, report) against a fake vLLM, in seconds.

The fake answers the completions API deterministically from the prompt's token ids and,
when started with --speculative-config, counts drafts in /metrics as vLLM does. The real
vLLM run is the lead's train -> export -> serve test; this one needs no serving env.
"""

import json
import os
import statistics
import sys
from pathlib import Path

import pytest

from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.serve import harness
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.preflight import plan_serving
from blockdraft.vllm_runtime.probe import VllmInfo
from tests.fake_vllm import INFO_FIELDS, write_fake_draft, write_fake_python

FAKE_INFO = VllmInfo(**INFO_FIELDS)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    script = write_fake_python(tmp_path / "fake_python")
    target = save_tiny_target(tmp_path / "target")
    draft = write_fake_draft(tmp_path / "draft")
    monkeypatch.setattr(harness, "plan_serving", lambda cfg: plan_serving(cfg, probe=lambda *_: FAKE_INFO))
    return ServeConfig(draft_dir=str(draft), target_dir=str(target), vllm_python=str(script), out=str(tmp_path / "out"),
                       num_prompts=4, max_tokens=16, startup_timeout_s=30)


def test_a_lossless_active_run_passes_and_writes_its_report(setup):
    setup.servers = "fresh"
    report = harness.run(setup)
    assert report["passed"] and report["lossless"] and report["draft_active"], report["failures"]
    assert report["engine"] == "vllm" and not report["incomplete"]
    # Per prompt of 16 tokens: 4 drafts, 6 accepted -> 1 + 6/4; the warm-up request is not counted.
    assert report["mean_acceptance_length"] == pytest.approx(2.5)  # the same in both rounds
    assert report["acceptance_per_position"] == pytest.approx([0.5, 0.5, 0.5])
    # Two rounds (the default) on fresh servers, the second in the other order, each kept.
    assert set(report["timings_s"]) >= {"startup_baseline", "generation_baseline", "startup_draft", "generation_draft",
                                        "startup_baseline_round2", "generation_draft_round2"}
    assert [r["order"] for r in report["rounds"]] == [["baseline", "draft"], ["draft", "baseline"]]
    ratios = [r["speedup"] for r in report["rounds"]]
    assert report["speedup"] == pytest.approx(statistics.median(ratios)) and report["speedup_spread"] == [min(ratios), max(ratios)]
    for name in ("vllm_baseline.log", "vllm_draft.log", "vllm_baseline_round2.log", "vllm_draft_round2.log"):
        assert (Path(setup.out) / name).is_file()
    written = json.loads((Path(setup.out) / "report.json").read_text())
    assert written["tokens_generated"] == {"baseline": 128, "draft": 128}
    # Where it ran and what a round cost: a machine effect told apart from a recipe effect.
    assert written["machine"]["cores"] == os.cpu_count() and set(written["machine"]) >= {"cpu_model", "avx512_bf16", "amx"}
    costs = [r["round_cost"] for r in report["rounds"]]
    assert all(c > 0 for c in costs) and written["round_cost"] == pytest.approx(statistics.median(costs))


def test_one_round_serves_each_side_once(setup):
    setup.rounds, setup.servers = 1, "fresh"
    report = harness.run(setup)
    assert report["passed"] and len(report["rounds"]) == 1 and report["tokens_generated"] == {"baseline": 64, "draft": 64}
    assert not (Path(setup.out) / "vllm_draft_round2.log").exists()


@pytest.mark.parametrize("method", ["frozen", "kept"])
def test_a_pair_kept_for_every_round_starts_twice_and_serves_each_half_in_turn(setup, method):
    setup.servers = method
    report = harness.run(setup)
    assert report["passed"] and report["lossless"] and report["servers"] == method
    assert sorted(k for k in report["timings_s"] if k.startswith("startup_")) == ["startup_baseline", "startup_draft"]
    assert [r["order"] for r in report["rounds"]] == [["baseline", "draft"], ["draft", "baseline"]]
    # The counters are read around each draft prompt: the same server, each drafting round counted once.
    assert report["mean_acceptance_length"] == pytest.approx(2.5)
    assert report["tokens_generated"] == {"baseline": 128, "draft": 128}
    assert sorted(p.name for p in Path(setup.out).glob("vllm_*.log")) == ["vllm_baseline.log", "vllm_draft.log"]
    # Each server warms up once, before round 1; every measured phase has the idle server's CPU seconds beside it.
    assert sorted(k for k in report["timings_s"] if k.startswith("warmup_")) == ["warmup_baseline", "warmup_draft"]
    assert sorted(report["idle_server_cpu_s"]) == ["baseline", "baseline_round2", "draft", "draft_round2"]
    assert sorted(report["idle_server_quiet_wait_s"]) == ["baseline", "baseline_round2", "draft", "draft_round2"]
    # 4 prompts x 2 rounds paired: intervals around the speedup and the round cost.
    assert report["interval"] == {"level": 0.95, "pairs": 8, "method": "paired bootstrap over prompts",
                                  "halves_in_reversed_order": True}
    for key in ("speedup_interval", "round_cost_interval"):
        low, high = report[key]
        assert 0 < low <= high, (key, report[key])


def test_kept_servers_serve_the_first_half_in_the_rounds_order_and_the_second_half_reversed(setup, monkeypatch):
    # Four prompts a side in one round: baseline 0, 1, draft 0, 1, then draft 2, 3, baseline 2, 3; the warm-up's
    # short requests name each server's url, baseline first.
    setup.rounds, setup.num_prompts, setup.warmup_prompts, setup.servers = 1, 4, 0, "kept"
    arrivals = []
    real = harness.complete

    def logged(url, model, prompt, *args, **kwargs):
        arrivals.append((url, tuple(prompt.token_ids)))
        return real(url, model, prompt, *args, **kwargs)

    monkeypatch.setattr(harness, "complete", logged)
    report = harness.run(setup)
    assert report["passed"]
    (base, first), (draft, _) = arrivals[:2]
    prompts = list(dict.fromkeys(ids for _, ids in arrivals[2:]))
    assert [(url, prompts.index(ids)) for url, ids in arrivals[2:]] == [
        (base, 0), (base, 1), (draft, 0), (draft, 1), (draft, 2), (draft, 3), (base, 2), (base, 3)]


def test_each_half_waits_until_the_idle_server_is_quiet(monkeypatch):
    class Server:  # its CPU seconds at each read: busy for three reads, then still
        def __init__(self, readings):
            self.readings = iter(readings)

        def cpu_seconds(self):
            return next(self.readings)

    monkeypatch.setattr(harness, "QUIET_WINDOW_S", 0.01)
    assert 0.03 <= harness.wait_until_quiet(Server([0.0, 0.2, 0.5, 0.9, 0.905, 0.905])) < 0.5
    monkeypatch.setattr(harness, "QUIET_MAX_S", 0.05)
    spinning = Server(x * 0.1 for x in range(1000))
    assert harness.wait_until_quiet(spinning) < 0.2  # bounded: a server that never quiets is measured anyway


def test_the_default_on_a_cpu_is_a_kept_pair_started_side_by_side(setup):
    kept = harness.run(setup)
    assert kept["servers"] == "kept" and kept["warmup_prompts"] == 2
    assert sorted(k for k in kept["timings_s"] if k.startswith("warmup_")) == ["warmup_baseline", "warmup_draft"]


def test_fresh_servers_warm_up_each_time_and_still_give_a_paired_speedup_interval(setup):
    setup.servers = "fresh"
    fresh = harness.run(setup)
    assert len([k for k in fresh["timings_s"] if k.startswith("warmup_")]) == 4 and fresh["idle_server_cpu_s"] == {}
    assert fresh["speedup_interval"] is not None and fresh["round_cost_interval"] is None
    assert fresh["interval"]["halves_in_reversed_order"] is False


def test_a_frozen_idle_server_takes_no_cpu_while_the_other_is_measured(setup, monkeypatch):
    # Each fake server's child spins on a core, and each phase lasts over a second: left running (kept),
    # the idle server takes CPU from the measured one; frozen, it takes none.
    monkeypatch.setenv("FAKE_BUSY", "1")
    monkeypatch.setenv("FAKE_SLOW_S", "0.3")
    monkeypatch.setattr(harness, "QUIET_MAX_S", 0.6)  # a spinning server never goes quiet: wait no longer
    monkeypatch.setenv("FAKE_DIR", str(Path(setup.out).parent))
    setup.rounds, setup.warmup_prompts = 1, 0
    out = setup.out
    idle = {}
    for method in ("kept", "frozen"):
        setup.servers, setup.out = method, f"{out}-{method}"
        idle[method] = harness.run(setup)["idle_server_cpu_s"]
    assert min(idle["kept"].values()) > 0.3, idle
    assert max(idle["frozen"].values()) == 0.0, idle


def test_a_differing_draft_run_is_reported_with_prompt_and_position(setup, monkeypatch):
    monkeypatch.setenv("FAKE_FLIP", "1")
    report = harness.run(setup)
    assert not report["passed"] and not report["lossless"]
    first = report["mismatches"][0]
    assert first["position"] == 3 and first["near_tie"] == "yes"
    setup.allow_near_ties = True
    setup.overwrite = True  # the same out again: the earlier report is replaced only when asked
    assert harness.run(setup)["passed"]


def test_a_server_that_cannot_start_leaves_an_incomplete_report(setup, tmp_path):
    broken = tmp_path / "broken_python"
    broken.write_text(f"#!{sys.executable}\nimport sys\nprint('no vLLM here')\nsys.exit(1)\n")
    broken.chmod(0o755)
    setup.vllm_python = str(broken)
    report = harness.run(setup)
    assert report["incomplete"] and not report["passed"]
    assert "exited with code 1" in report["error"] and "no vLLM here" in report["error"]


def test_dflash2_on_a_cpu_vllm_is_checked_by_the_reference_engine(tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    from blockdraft.export.writer import export_draft
    from blockdraft.models.io import save_draft
    from tests.conftest import make_draft

    target = save_tiny_target(tmp_path / "target")
    save_draft(tmp_path / "ckpt", make_draft(AutoModelForCausalLM.from_pretrained(target), "dflash2"))
    export = export_draft(tmp_path / "ckpt", tmp_path / "export", dtype="float32", target_dir=target)
    info = VllmInfo(**{**FAKE_INFO.__dict__, "dflash_archs": ["DFlash2DraftModel", "DFlashDraftModel"], "anchor_clamp": False})
    monkeypatch.setattr(harness, "plan_serving", lambda cfg: plan_serving(cfg, probe=lambda *_: info))
    cfg = ServeConfig(draft_dir=str(export), target_dir=str(target), vllm_python=sys.executable,
                      out=str(tmp_path / "out"), num_prompts=2, max_tokens=8)
    report = harness.run(cfg)
    assert report["engine"] == "reference" and report["lossless"] and not report["incomplete"]
    assert report["spec_decode"]["num_drafts"] > 0
    assert any("reference engine" in w for w in report["warnings"])
    assert any("clamp" in w for w in report["warnings"])
    assert "REFERENCE engine" in capsys.readouterr().out


def test_a_kept_draft_server_dying_mid_round_leaves_the_prompts_both_sides_finished(setup, monkeypatch):
    # Four prompts, kept servers, no warm-up prompts: the draft server answers its short warm-up request and the
    # first half (prompts 0 and 1), then dies on prompt 2; the baseline had finished prompts 0 and 1.
    monkeypatch.setenv("FAKE_DIE_AFTER_DRAFT", "3")
    setup.rounds, setup.warmup_prompts, setup.servers = 1, 0, "kept"
    report = harness.run(setup)
    assert report["incomplete"] and not report["passed"]
    assert report["tokens_generated"] == {"baseline": 2 * setup.max_tokens, "draft": 2 * setup.max_tokens}
    assert "died" in report["error"] or "no answer" in report["error"], report["error"]

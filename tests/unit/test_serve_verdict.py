import json

import pytest

import blockdraft
from blockdraft.build_info import git_commit
from blockdraft.serve.client import Completion, SpecMetrics
from blockdraft.serve.report import PLOT_NAME, REPORT_NAME, Round, RunRecord, build_report, print_table, write_report
from blockdraft.serve.verdict import acceptance, compare_outputs, first_difference, judge

ACTIVE = SpecMetrics(num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12, accepted_per_position=[7, 4, 1])


def c(index, ids, top=None, seconds=1.0):
    return Completion(index, ids, seconds, "length", top or [])


def test_identical_outputs_have_no_mismatch():
    assert compare_outputs([c(0, [1, 2, 3])], [c(0, [1, 2, 3])], ["p0"]) == []


def test_a_mismatch_names_prompt_position_and_tokens():
    [m] = compare_outputs([c(0, [1, 2]), c(1, [5, 6, 7])], [c(0, [1, 2]), c(1, [5, 9, 7])], ["p0", "p1"])
    assert (m.prompt_index, m.source, m.position, m.baseline_token, m.draft_token) == (1, "p1", 1, 6, 9)
    assert m.near_tie == "unknown"  # no log-probabilities were returned
    assert "prompt 1 (p1)" in m.describe() and "token 1" in m.describe()


def test_near_tie_from_the_baseline_logprobs():
    top = [{5: -0.1}, {6: -0.70, 9: -0.72}]
    [m] = compare_outputs([c(0, [5, 6], top)], [c(0, [5, 9])], ["p"])
    assert m.near_tie == "yes" and m.logprob_gap == pytest.approx(0.02)


def test_clear_flip_is_not_a_near_tie():
    top = [{6: -0.1, 9: -3.0}]
    [m] = compare_outputs([c(0, [6], top)], [c(0, [9], top)], ["p"])
    assert m.near_tie == "no" and m.logprob_gap == pytest.approx(2.9)


def test_other_token_below_a_wide_top_list_is_not_a_near_tie():
    [m] = compare_outputs([c(0, [6], [{6: -0.1, 4: -2.0}])], [c(0, [9])], ["p"])
    assert m.near_tie == "no"


def test_one_output_stopping_early_is_a_mismatch_at_its_end():
    assert first_difference([1, 2, 3], [1, 2]) == 2
    [m] = compare_outputs([c(0, [1, 2, 3])], [c(0, [1, 2])], ["p"])
    assert (m.position, m.baseline_token, m.draft_token) == (2, 3, None)


def test_acceptance_length_and_per_position():
    a = acceptance(ACTIVE)
    assert a.mean_acceptance_length == pytest.approx(2.2)
    assert a.acceptance_per_position == pytest.approx([0.7, 0.4, 0.1])
    assert a.cumulative_acceptance_length == pytest.approx([1.7, 2.1, 2.2])


def test_a_lossless_active_run_passes():
    v = judge([], ACTIVE, min_acceptance_length=2.0)
    assert v.passed and v.lossless and v.draft_active


def test_failures_are_each_named():
    mismatch = compare_outputs([c(0, [1])], [c(0, [2])], ["p"])
    assert "not lossless" in judge(mismatch, ACTIVE).failures[0]
    assert "no drafts were proposed" in judge([], SpecMetrics()).failures[0]
    assert "not one token accepted" in judge([], SpecMetrics(5, 15, 0, [0, 0, 0])).failures[0]
    assert "below min_acceptance_length=3" in judge([], ACTIVE, min_acceptance_length=3.0).failures[0]


def test_near_ties_pass_only_when_allowed():
    tie = compare_outputs([c(0, [6], [{6: -0.70, 9: -0.71}])], [c(0, [9])], ["p"])
    assert not judge(tie, ACTIVE).passed
    v = judge(tie, ACTIVE, allow_near_ties=True)
    assert v.passed and not v.lossless


def test_report_has_the_promised_keys_and_files(tmp_path):
    record = RunRecord(sources=["p0"], rounds=[Round(baseline=[c(0, [1, 2], seconds=2.0)], draft=[c(0, [1, 2], seconds=1.0)], metrics=ACTIVE)])
    report = build_report(record)
    for key in ("lossless", "draft_active", "mean_acceptance_length", "acceptance_per_position",
                "tokens_per_s_baseline", "tokens_per_s_draft", "speedup", "engine", "incomplete"):
        assert key in report
    assert report["speedup"] == pytest.approx(2.0) and report["incomplete"] is False and report["passed"]
    write_report(report, tmp_path)
    written = json.loads((tmp_path / REPORT_NAME).read_text())
    assert written["engine"] == "vllm"
    # Which blockdraft measured it: the version, and the commit of this checkout.
    assert written["blockdraft_version"] == blockdraft.__version__
    assert written["blockdraft_commit"] == git_commit() != "unknown"
    assert (tmp_path / PLOT_NAME).stat().st_size > 0


def test_a_stopped_run_is_reported_incomplete_and_failed(tmp_path, capsys):
    record = RunRecord(sources=["p0"], rounds=[Round(baseline=[c(0, [1])])], error="vLLM exited with code 1\nlog tail")
    report = build_report(record)
    assert report["incomplete"] and not report["passed"] and report["lossless"] is None
    assert report["failures"] == ["incomplete: vLLM exited with code 1"]
    write_report(report, tmp_path)
    print_table(report)
    assert "FAIL" in capsys.readouterr().out


def test_reference_engine_is_said_plainly(capsys):
    record = RunRecord(engine="reference", sources=["p0"], rounds=[Round(baseline=[c(0, [1])], draft=[c(0, [1])], metrics=ACTIVE)])
    print_table(build_report(record))
    assert "REFERENCE engine" in capsys.readouterr().out


def _round(base_seconds, draft_seconds, draft_ids=(1, 2), order=("baseline", "draft")):
    return Round(order=order, baseline=[c(0, [1, 2], seconds=base_seconds)],
                 draft=[c(0, list(draft_ids), seconds=draft_seconds)], metrics=ACTIVE)


def test_the_speedup_is_the_median_of_the_rounds_with_their_spread(capsys):
    rounds = [_round(2.0, 1.0), _round(3.0, 2.0, order=("draft", "baseline")), _round(1.0, 1.0)]
    report = build_report(RunRecord(sources=["p0"], rounds=rounds, planned_rounds=3))
    assert [r["speedup"] for r in report["rounds"]] == pytest.approx([2.0, 1.5, 1.0])
    assert report["speedup"] == pytest.approx(1.5) and report["speedup_spread"] == pytest.approx([1.0, 2.0])
    assert report["rounds"][1]["order"] == ["draft", "baseline"]
    # the counters of every draft run count: three rounds of ACTIVE
    assert report["spec_decode"]["num_drafts"] == 30 and report["mean_acceptance_length"] == pytest.approx(1 + 36 / 30)
    print_table(report)
    assert "1.500 (median of 3 rounds, 1.000 to 2.000)" in capsys.readouterr().out


def test_a_later_round_that_differs_fails_naming_its_round():
    report = build_report(RunRecord(sources=["p0"], rounds=[_round(2.0, 1.0), _round(2.0, 1.0, draft_ids=(1, 3))], planned_rounds=2))
    assert not report["passed"] and not report["lossless"]
    assert report["mismatches"][0]["round"] == 2 and "in round 2" in report["failures"][0]


def test_a_baseline_that_changes_between_rounds_is_named():
    drifting = Round(baseline=[c(0, [1, 4])], draft=[c(0, [1, 4])], metrics=ACTIVE)
    report = build_report(RunRecord(sources=["p0"], rounds=[_round(2.0, 1.0), drifting], planned_rounds=2))
    assert not report["passed"] and any("baseline itself is not reproducible" in f for f in report["failures"])


def test_a_run_stopped_before_its_last_round_is_incomplete():
    report = build_report(RunRecord(sources=["p0"], rounds=[_round(2.0, 1.0)], planned_rounds=2))
    assert report["incomplete"] and not report["passed"]
    assert report["speedup"] == pytest.approx(2.0) and len(report["rounds"]) == 1  # what ran is still reported


def test_a_round_cost_below_one_warns_only_outside_the_measured_spread_with_advice_not_yet_taken():
    from blockdraft.serve.report import round_cost_suspect

    inside = {"round_cost": 0.99, "round_cost_interval": [0.96, 1.02], "rounds": [{"round_cost": 0.99}]}
    assert round_cost_suspect(inside, "kept") is None
    below = {"round_cost": 0.93, "round_cost_interval": [0.91, 0.95], "rounds": [{"round_cost": 0.93}]}
    kept = round_cost_suspect(below, "kept")
    assert "reaches only 0.95" in kept and "servers=fresh" in kept
    fresh = round_cost_suspect(below, "fresh")
    assert "servers=fresh" not in fresh and "num_prompts=" in fresh
    # Without an interval, the rounds' spread decides: one round at 1.01 of two clears it.
    rounds = {"round_cost": 0.97, "round_cost_interval": None, "rounds": [{"round_cost": 0.93}, {"round_cost": 1.01}]}
    assert round_cost_suspect(rounds, "fresh") is None
    assert round_cost_suspect({**rounds, "rounds": [{"round_cost": 0.93}, {"round_cost": 0.96}]}, "fresh")
    assert round_cost_suspect({"round_cost": 1.2, "rounds": []}, "kept") is None

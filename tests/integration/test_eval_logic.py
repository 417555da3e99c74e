"""The eval app end to end against the fake vLLM server (tests/fake_vllm.py), in seconds: two drafts,
a JSONL dataset of 2 prompts, greedy and sampled, concurrency 1 and 2; then a rerun that finds every
cell done. The real-vLLM run of the same app is tests/integration/test_eval.py (make test-slow).

What only a real vLLM shows stays there: acceptance figures that depend on the draft's training
(the fake counts a fixed rate), the OpenMP binding line vLLM writes to its log, and which draft
features load (reduced vocabulary head, mask embedding, renamed architecture).
"""

import contextlib
import io
import json

import pytest
from omegaconf import OmegaConf

import blockdraft
from blockdraft.build_info import git_commit
from blockdraft.config import compose, register_schema
from blockdraft.data.prompt_record import RECORD_NAME, PromptRecord, prompt_hash
from blockdraft.eval import runner
from blockdraft.eval.__main__ import evaluate
from blockdraft.eval.config import EvalAppConfig
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.vllm_runtime.probe import VllmInfo
from tests.fake_vllm import INFO_FIELDS, started_pids, write_fake_draft, write_fake_python

register_schema("eval_schema", EvalAppConfig)
QUESTIONS = ["Tell me about the moon.", "Name a fruit."]


def _run(overrides):
    """What `python -m blockdraft.eval` runs, in this process so that the vLLM probe can be stood in for;
    stdout (the table) and stderr (the progress lines) are kept."""
    cfg = OmegaConf.to_object(compose("eval", overrides))  # fresh each time: the run settles its top-k in place
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        report = evaluate(cfg)
    return report, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_logic")
    fake_dir = root / "fake"
    fake_dir.mkdir()
    target = save_tiny_target(root / "target")
    first_draft, second_draft = write_fake_draft(root / "first"), write_fake_draft(root / "second")
    # A model card's validation line, as an export writes it: the table shows it beside the served figure.
    (first_draft / "README.md").write_text("validation accept_len (step 120): 1.875\n")
    # The first draft trained on the first question (allowed below: its headline says so); the second has no record.
    PromptRecord.of([prompt_hash([{"role": "user", "content": QUESTIONS[0]}])]).write(first_draft / RECORD_NAME)
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS))
    overrides = [f"target_dir={target}", f"drafts=[{first_draft},{second_draft}]", f"datasets=[{questions}]",
                 "settings=[greedy,sampled]", "concurrency=[1,2]", "num_prompts=2", "max_tokens=8",
                 "max_model_len=512", "startup_timeout_s=30", f"vllm_python={write_fake_python(root / 'fake_python')}",
                 f"out={root / 'out'}", "allow_training_prompts=true"]
    with pytest.MonkeyPatch.context() as mp:
        # The fake is no vLLM to import: the probe's answer is what a CPU vLLM that knows DFlash says.
        mp.setattr(runner, "probe_vllm", lambda *_: VllmInfo(**INFO_FIELDS))
        mp.setenv("FAKE_DIR", str(fake_dir))
        first = _run(overrides)
        records = {"pids": started_pids(fake_dir), "argv": (fake_dir / "argv").read_text().splitlines(),
                   "eval.json": json.loads((root / "out" / "eval.json").read_text())}  # the rerun rewrites it
        logs = {p.name: p.stat().st_mtime_ns for p in (root / "out" / "logs").iterdir()}
        again = _run(overrides)
    return root / "out", fake_dir, first, again, records, logs


def test_eval_writes_every_cell_table_and_plot(evaluated):
    out, _, (returned, stdout, _), _, records, _ = evaluated
    report = records["eval.json"]
    assert report == returned
    assert report["complete"] and len(report["results"]) == 2 * 2 * 2  # drafts x settings x concurrencies
    assert set(report["drafts"]) == {"first", "second"}
    cells = {(r["draft"], r["setting"], r["concurrency"]) for r in report["results"]}
    assert cells == {(d, s, c) for d in ("first", "second") for s in ("greedy", "sampled") for c in (1, 2)}
    for r in report["results"]:
        assert r["engine"] == "vllm" and r["prompts"] == 2 and r["speedup"] > 0
        assert len(r["acceptance_per_position"]) == 3 and r["num_drafts"] > 0  # read from the draft server's counters
        if r["setting"] == "greedy":
            assert r["lossless"] is True and r["lossless_checked"], r["mismatches"]
        else:
            assert r["lossless"] is None and not r["lossless_checked"] and r["mismatches"] == []
    table = (out / "eval.md").read_text()
    assert "| first | second |" in table and "rejection sampling" in table
    assert "without its default top-k 20" in table and report["settings"]["sampled"]["top_k"] == 0
    assert "Machine: " in table and "vLLM fake on cpu" in table
    assert report["environment"]["machine"]["cores"]
    assert report["blockdraft_version"] == blockdraft.__version__ and report["blockdraft_commit"] == git_commit()
    # The OpenMP binding line comes from vLLM's own log, which the fake does not write: test_eval.py checks it.
    assert report["environment"]["vllm_omp_binding"] is None
    assert table in stdout
    assert sorted(p.rsplit("/", 1)[-1] for p in report["plots"]) == ["acceptance_questions.png", "speedup.png"]
    for name in ("acceptance_questions.png", "speedup.png"):
        assert (out / name).stat().st_size > 1000
    assert report["drafts"]["first"]["training"]["accept_len"] == pytest.approx(1.875)  # from the model card
    assert report["drafts"]["second"]["training"] is None
    assert "first 1.875 (step 120), second -" in table


def test_a_draft_measured_on_its_training_prompts_is_named_first(evaluated):
    """allow_training_prompts=true measured the first draft on a question it trained on: eval.md opens with it,
    and the draft without a record of its training prompts is named too (the refusal: test_held_out_refusals.py)."""
    out, _, (report, _, stderr), _, _, _ = evaluated
    held = report["drafts"]["first"]["held_out"]
    assert [(d.rsplit("/", 1)[-1], h["trained_on"], h["allowed"]) for d, h in held.items()] == [("questions.jsonl", 1, True)]
    assert not next(iter(report["drafts"]["second"]["held_out"].values()))["recorded"]
    table = (out / "eval.md").read_text().splitlines()
    assert table[0] == ("**first on questions.jsonl: MEASURED ON TRAINING PROMPTS: 1 of the 2 prompts are among those "
                        "the draft trained on (allow_training_prompts=true): its acceptance here is inflated by memorised prompts.**")
    assert table[1].startswith("second: no record of its training prompts")
    assert "second: warning: the draft" in stderr and "carries no record" in stderr


def test_one_server_per_draft_and_one_for_the_target_alone(evaluated):
    out, _, (_, _, stderr), _, records, _ = evaluated
    starts = [json.loads(line) for line in records["argv"]]
    assert len(starts) == 3 and stderr.count("starting vLLM") == 3
    speculative = [json.loads(a[a.index("--speculative-config") + 1]) for a in starts if "--speculative-config" in a]
    assert len(speculative) == 2 and {s["model"].rsplit("/", 1)[-1] for s in speculative} == {"first", "second"}
    assert sorted(p.name for p in (out / "logs").iterdir()) == ["vllm_baseline.log", "vllm_first.log", "vllm_second.log"]


def test_a_rerun_finds_every_cell_done_and_starts_no_server(evaluated):
    out, fake_dir, (first, _, _), (again, _, stderr), records, logs = evaluated
    assert stderr.count("already done; nothing to run") == 3
    assert "starting vLLM" not in stderr
    # The fake records every start: none since the first run.
    assert started_pids(fake_dir) == records["pids"]
    assert (fake_dir / "argv").read_text().splitlines() == records["argv"]
    assert {p.name: p.stat().st_mtime_ns for p in (out / "logs").iterdir()} == logs
    assert again["complete"] and again["results"] == first["results"]
    assert json.loads((out / "eval.json").read_text())["complete"]


def test_a_dflash2_draft_the_cpu_vllm_cannot_run_is_evaluated_on_the_reference_engine(tiny_dflash2_run, tmp_path,
                                                                                     monkeypatch):
    """The same as test_eval.py's (make test-slow), with the serving vLLM's answer stood in for: a CPU
    vLLM that has no DFlash2 runner, so no server starts and the reference engine decodes every cell."""
    from blockdraft.export.writer import export_draft

    from tests.integration.conftest import REPO

    export_draft(tiny_dflash2_run, tmp_path / "dflash2", dtype="float32")
    export, target = tmp_path / "dflash2", REPO / ".cache" / "targets" / "tiny-qwen3"  # the run's own target
    registered = {**INFO_FIELDS, "dflash_archs": ["DFlashDraftModel", "DFlash2DraftModel"]}  # vLLM 0.32 on a CPU
    monkeypatch.setattr(runner, "probe_vllm", lambda *_: VllmInfo(**registered))
    report, _, stderr = _run([f"target_dir={target}", f"drafts=[{export}]", "datasets=[tiny]",
                              "settings=[greedy,sampled]", "sampling.sampled.top_k=0", "concurrency=[1,2]",
                              "num_prompts=2", "max_tokens=16", f"vllm_python={write_fake_python(tmp_path / 'py')}",
                              f"out={tmp_path / 'out'}"])
    assert "REFERENCE ENGINE" in stderr and "starting vLLM" not in stderr  # no vLLM draft: no server
    assert report["complete"] and {r["concurrency"] for r in report["results"]} == {1}
    assert all(r["engine"] == "reference" and r["speedup"] > 0 for r in report["results"])
    assert [r["lossless"] for r in report["results"] if r["setting"] == "greedy"] == [True]
    assert len(report["not_run"]) == 2 and "concurrency 2" in report["not_run"][0]
    assert "(reference engine)" in (tmp_path / "out" / "eval.md").read_text()

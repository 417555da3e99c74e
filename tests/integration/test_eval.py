"""`python -m blockdraft.eval` end to end on the tiny target, in real vLLM: two drafts, a
JSONL dataset, greedy and sampled, concurrency 1 and 2; then a rerun that finds every cell done.

Its three vLLM server starts take minutes on a CPU, so that run is in `make test-slow`; the eval's
own logic (every cell, the table, the plots, the rerun) is tested in seconds against the fake vLLM
server in test_eval_logic.py, the DFlash2 draft on the reference engine there too (here it asks the
real serving vLLM, an import of seconds, which the other make-test vLLM checks already pay)."""

import json
import subprocess
import sys

import pytest

from tests.integration.conftest import REPO, train_tiny
from tests.integration.renamed_draft import renamed_copy

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]
QUESTIONS = ["Tell me about the moon.", "What is two plus two?", "Name a fruit.", "Describe a cat."]


def _export(run, out):
    subprocess.run([sys.executable, "-m", "blockdraft.export", f"checkpoint={run}", f"out={out}", "dtype=float32"],
                   cwd=REPO, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def evaluated(reduced_vocab_export, tmp_path_factory):
    """The trained draft is the reduced-vocabulary one (120 steps from a store): serving it here is
    also that feature's real-vLLM check. The barely trained one carries a trained mask embedding."""
    root = tmp_path_factory.mktemp("eval")
    trained = reduced_vocab_export[1]
    # Barely trained, and with a trained mask embedding: serving it here is also that feature's
    # real-vLLM check (test_mask_embedding_serve checks the loaded vector itself). Its directory
    # names it Qwen3DFlashDraftModel, as other training stacks do: served unchanged through
    # vllm_plugin/, which is that plugin's real-vLLM check.
    barely_export = _export(train_tiny(root / "barely_run", "train.max_steps=2", "data.val=null",
                                       "draft.train_mask_embedding=true"), root / "barely_export")
    barely = renamed_copy(barely_export, root / "barely", "Qwen3DFlashDraftModel")
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS))
    # The default sampled setting, as a new user runs it: on a CPU vLLM it drops its top-k by itself.
    argv = [sys.executable, "-m", "blockdraft.eval", f"target={TARGET}", f"drafts=[{trained},{barely}]",
            f"datasets=[{questions}]", "settings=[greedy,sampled]", "concurrency=[1,2]", "num_prompts=4",
            "max_tokens=32", "max_model_len=512", "kv_cache_gib=1", f"out={root / 'out'}"]
    first = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-5000:]
    logs = {p.name: p.stat().st_mtime_ns for p in (root / "out" / "logs").iterdir()}
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    return root / "out", first, again, logs


@pytest.mark.slow
def test_eval_writes_every_cell_table_and_plot(evaluated):
    out, first, _, _ = evaluated
    report = json.loads((out / "eval.json").read_text())
    assert report["complete"] and len(report["results"]) == 2 * 2 * 2  # drafts x settings x concurrencies
    assert set(report["drafts"]) == {"reduced_vocab", "barely"}
    for r in report["results"]:
        assert r["engine"] == "vllm" and r["prompts"] == 4 and r["speedup"] > 0
        assert len(r["acceptance_per_position"]) == 3
        if r["setting"] == "greedy":
            assert r["lossless"] is True, r["mismatches"]
        else:
            assert r["lossless"] is None and not r["lossless_checked"]
    table = (out / "eval.md").read_text()
    assert "| reduced_vocab | barely |" in table and "rejection sampling" in table
    assert "without its default top-k 20" in table and report["settings"]["sampled"]["top_k"] == 0
    assert "Machine: " in table and "OpenMP binding: VLLM_CPU_OMP_THREADS_BIND=" in table
    assert report["environment"]["machine"]["cores"] and "core ids=" in report["environment"]["vllm_omp_binding"]
    assert table in first.stdout
    for name in ("acceptance_questions.png", "speedup.png"):
        assert (out / name).stat().st_size > 1000
    assert report["drafts"]["reduced_vocab"]["training"]["accept_len"] > 1.0  # read from the export's model card
    assert report["drafts"]["barely"]["training"] is None  # trained without validation


@pytest.mark.slow
def test_the_trained_draft_is_accepted_more_than_the_barely_trained_one(evaluated):
    report = json.loads(evaluated[0].joinpath("eval.json").read_text())
    by = {}
    for r in report["results"]:
        by.setdefault((r["dataset"], r["setting"], r["concurrency"]), {})[r["draft"]] = r["mean_acceptance_length"]
    for cell, lengths in by.items():
        if cell[1] == "greedy":
            assert lengths["reduced_vocab"] > lengths["barely"], cell


@pytest.mark.slow
def test_a_rerun_finds_every_cell_done_and_starts_no_server(evaluated):
    out, first, again, logs = evaluated
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("already done; nothing to run") == 3
    assert "starting vLLM" not in again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (out / "logs").iterdir()} == logs
    assert json.loads((out / "eval.json").read_text())["complete"]


@pytest.mark.slow
def test_the_reduced_vocabulary_draft_is_served_with_its_own_head(evaluated):
    out = evaluated[0]
    report = json.loads((out / "eval.json").read_text())
    greedy = [r for r in report["results"] if r["draft"] == "reduced_vocab" and r["setting"] == "greedy"]
    assert all(r["lossless"] and r["num_accepted_tokens"] > 0 for r in greedy)
    assert max(r["mean_acceptance_length"] for r in greedy) > 1.2
    # vLLM kept the draft's own head (a shared target head would be [V, H] and fail to load).
    assert "Keeping separate lm_head weights" in (out / "logs" / "vllm_reduced_vocab.log").read_text()


@pytest.mark.slow  # make test: the same in test_eval_logic.py, with the vLLM probe's answer stood in for
def test_a_dflash2_draft_the_cpu_vllm_cannot_run_is_evaluated_on_the_reference_engine(tiny_dflash2_run, tmp_path):
    export = _export(tiny_dflash2_run, tmp_path / "dflash2")
    argv = [sys.executable, "-m", "blockdraft.eval", f"target={TARGET}", f"drafts=[{export}]", "datasets=[tiny]",
            "settings=[greedy,sampled]", "sampling.sampled.top_k=0", "concurrency=[1,2]", "num_prompts=2",
            "max_tokens=16", f"out={tmp_path / 'out'}"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "REFERENCE ENGINE" in proc.stderr and "starting vLLM" not in proc.stderr  # no vLLM draft: no server
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert report["complete"] and {r["concurrency"] for r in report["results"]} == {1}
    assert all(r["engine"] == "reference" and r["speedup"] > 0 for r in report["results"])
    assert [r["lossless"] for r in report["results"] if r["setting"] == "greedy"] == [True]
    assert len(report["not_run"]) == 2 and "concurrency 2" in report["not_run"][0]
    assert "(reference engine)" in (tmp_path / "out" / "eval.md").read_text()


@pytest.mark.slow
def test_the_mask_embedding_draft_is_loaded_and_served_losslessly(evaluated):
    out = evaluated[0]
    report = json.loads((out / "eval.json").read_text())
    greedy = [r for r in report["results"] if r["draft"] == "barely" and r["setting"] == "greedy"]
    assert len(greedy) == 2 and all(r["lossless"] and r["num_drafts"] > 0 for r in greedy)
    assert "Loaded DFlash mask embedding for mask_token_id 262" in (out / "logs" / "vllm_barely.log").read_text()


@pytest.mark.slow
def test_a_draft_saved_as_qwen3dflashdraftmodel_is_served_unchanged_through_the_plugin(evaluated):
    out = evaluated[0]
    report = json.loads((out / "eval.json").read_text())
    greedy = [r for r in report["results"] if r["draft"] == "barely" and r["setting"] == "greedy"]
    assert len(greedy) == 2 and all(r["engine"] == "vllm" and r["lossless"] and r["num_drafts"] > 0 for r in greedy)
    log = (out / "logs" / "vllm_barely.log").read_text()
    assert "blockdraft_vllm_plugin: registered Qwen3DFlashDraftModel -> DFlashDraftModel" in log
    assert "draft architectures ['Qwen3DFlashDraftModel'] read as ['DFlashDraftModel']" in log
    assert json.loads((out.parent / "barely" / "config.json").read_text())["architectures"] == ["Qwen3DFlashDraftModel"]

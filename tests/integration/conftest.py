"""Shared, session-scoped tiny training runs (each takes seconds) for the integration tests."""

import os
import sys
from pathlib import Path

import pytest

from blockdraft.capture.config import CaptureAppConfig
from blockdraft.config import compose, register_schema
from blockdraft.config.recipe import TrainAppConfig

REPO = Path(__file__).resolve().parents[2]
register_schema("train_schema", TrainAppConfig)
register_schema("capture_schema", CaptureAppConfig)
SHARD_ROWS = 16  # the tiny recipe's 64 training rows -> 4 shards


def tiny_overrides(run_dir, *extra):
    # Target and data live in the repo's .cache, shared by every test run and the tiny_cpu recipe.
    return ["experiment=tiny_cpu", f"run_dir={run_dir}", "train.progress=false", *extra]


def train_tiny(run_dir, *extra):
    from blockdraft.train.loop import run_training

    cwd = os.getcwd()
    os.chdir(REPO)  # the recipe's relative .cache paths are relative to the repo
    try:
        return run_training(compose("train", tiny_overrides(run_dir, *extra)))
    finally:
        os.chdir(cwd)


def decode_heldout_losslessly(export, num_prompts: int):
    """The tiny recipe's first held-out prompts decoded by the reference engine with `export`, each
    asserted token for token equal to the tiny target's own decode; returns (the engine, the steps of
    all of them in one DecodeStats)."""
    import json

    from transformers import AutoTokenizer

    from blockdraft.draft_format.importer import import_draft
    from blockdraft.engine.decoder import DecodeStats, SpeculativeEngine
    from blockdraft.models.target import TargetModel

    target = REPO / ".cache" / "targets" / "tiny-qwen3"
    draft, cfg = import_draft(export)
    tokenizer = AutoTokenizer.from_pretrained(target)
    engine = SpeculativeEngine(TargetModel.load(str(target), cfg.target_layer_ids), draft,
                               eos_token_ids=[tokenizer.eos_token_id])
    stats = DecodeStats(engine.k)
    for line in (REPO / ".cache" / "tiny_cpu" / "val.jsonl").read_text().splitlines()[:num_prompts]:
        row = json.loads(line)
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, return_dict=True)["input_ids"]
        budget = row["generation"]["max_new_tokens"]
        result = engine.generate(prompt, budget)
        assert result.tokens == engine.target_generate(prompt, budget).tokens
        stats.add(result.stats)
    return engine, stats


def capture_tiny(out, *extra):
    """A feature store of the tiny_cpu recipe's rows (what its training run consumes)."""
    from blockdraft.capture.app import run_capture

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        return run_capture(compose("capture", ["experiment=tiny_cpu", f"out={out}", "train.progress=false",
                                               f"rows_per_shard={SHARD_ROWS}", *extra]))
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="session")
def fp32_store(tmp_path_factory):
    return capture_tiny(tmp_path_factory.mktemp("store") / "fp32", "storage_dtype=float32")


@pytest.fixture(scope="session")
def tiny_dflash_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("dflash") / "run", "train.max_steps=120")


@pytest.fixture(scope="session")
def tiny_dflash2_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("dflash2") / "run", "draft=dflash2", "train.max_steps=120")


@pytest.fixture(scope="session")
def tiny_domino_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("domino") / "run", "draft=domino", "train.max_steps=120")


@pytest.fixture(scope="session")
def tiny_dspark_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("dspark") / "run", "draft=dspark", "draft.markov_rank=16")


# The tiny recipe's replies use 34 distinct tokens: 28 leaves a few labels outside the vocabulary.
REDUCED_VOCAB = 28


@pytest.fixture(scope="session")
def reduced_vocab_export(fp32_store, tmp_path_factory):
    """(run, export) of a reduced-vocabulary draft trained from a store: the reduced-vocabulary tests
    read its run and export, and the eval test serves it."""
    root = tmp_path_factory.mktemp("reduced")
    run = train_tiny(root / "run", "train.max_steps=120", f"data.features={fp32_store}", f"draft.draft_vocab_size={REDUCED_VOCAB}")
    return run, export_here(run, root / "reduced_vocab")


def export_here(checkpoint, out, *extra):
    """`blockdraft export checkpoint=... out=... dtype=float32` in this process (a new interpreter's imports cost
    more than the export of a tiny draft); `out`, once it succeeded."""
    from tests.unit.command_check import run_app

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        status, printed = run_app("export", [f"checkpoint={checkpoint}", f"out={out}", "dtype=float32", *extra])
    finally:
        os.chdir(cwd)
    assert status == 0, printed[-3000:]
    return out


def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def page_rehearsal(tmp_path_factory):
    """docs/your-own-target.md's rehearsal on the tiny target without its vLLM start-ups, then the same command
    again with throughput and logging knobs changed: (runs, out, the first run, the second, the parts of the
    store and the run the second rewrote). tests/integration/test_pipeline.py and test_your_own_target_page.py
    assert on it."""
    from blockdraft.models.tiny_target import save_tiny_target
    from tests.faults.test_reruns import NEUTRAL, snapshot
    from tests.integration.own_target_page import WITHOUT_VLLM, rehearsal_command, run_page_command

    save_tiny_target(REPO / ".cache" / "targets" / "tiny-qwen3", "qwen3")
    runs = tmp_path_factory.mktemp("own_target") / "runs"
    replace, add = WITHOUT_VLLM
    first = run_page_command(rehearsal_command(), runs, replace, add, check=False)
    out = runs / "own-tiny"
    before = {part: snapshot(out / part) for part in ("store", "run")}
    second = run_page_command(rehearsal_command(), runs, replace, [*add, *NEUTRAL], check=False)
    rewritten = [part for part in before if snapshot(out / part) != before[part]]
    return runs, out, first, second, rewritten


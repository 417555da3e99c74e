"""Shared, session-scoped tiny training runs (each takes seconds) for the integration tests."""

import os
import sys
from pathlib import Path

import pytest

from blockdraft.config import compose, register_schema
from blockdraft.train.config import TrainAppConfig

REPO = Path(__file__).resolve().parents[2]
register_schema("train_schema", TrainAppConfig)


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


@pytest.fixture(scope="session")
def tiny_dflash_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("dflash") / "run", "train.max_steps=120")


@pytest.fixture(scope="session")
def tiny_dflash2_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("dflash2") / "run", "draft=dflash2", "train.max_steps=120")


def python() -> str:
    return sys.executable

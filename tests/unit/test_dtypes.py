"""Which dtype the target and the step run in, and the refusals that keep a GPU run from mixing them."""

import importlib.util

import pytest
import torch
from omegaconf import OmegaConf

from blockdraft.config import compose, register_schema
from blockdraft.config.recipe import TrainAppConfig
from blockdraft.errors import ConfigError
from blockdraft.train.setup import check_config, resolve_dtype, resolve_target_dtype

register_schema("train_schema", TrainAppConfig)


def test_the_target_follows_the_training_dtype_unless_set():
    assert resolve_target_dtype("auto", resolve_dtype("auto", torch.device("cuda"))) == torch.bfloat16
    assert resolve_target_dtype("auto", resolve_dtype("auto", torch.device("cpu"))) == torch.float32
    assert resolve_target_dtype("float32", torch.bfloat16) == torch.float32
    assert resolve_target_dtype("bfloat16", torch.bfloat16) == torch.bfloat16


def test_a_bf16_target_under_an_fp32_step_is_refused():
    with pytest.raises(ConfigError, match="target.dtype=bfloat16 with an fp32 training step.*train.dtype=bfloat16"):
        resolve_target_dtype("bfloat16", torch.float32)


def _schema(*overrides):
    return OmegaConf.to_object(compose("train", ["experiment=tiny_cpu", "run_dir=/tmp/unused", *overrides]))


def test_a_misspelt_target_dtype_fails_before_anything_loads():
    with pytest.raises(ConfigError, match="dtype 'bf16'"):
        check_config(_schema("target.dtype=bf16"))


def test_wandb_logging_without_wandb_installed_names_the_fix(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="wandb is not installed: pip install wandb, or set wandb.mode=disabled"):
        check_config(_schema("wandb.mode=offline"))
    check_config(_schema("wandb.mode=disabled"))  # training without wandb needs no wandb

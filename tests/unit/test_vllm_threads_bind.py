"""vLLM's CPU thread binding, chosen per stage: regeneration binds every core, serving keeps vLLM's default."""

import os

import pytest

from blockdraft.regen.config import RegenConfig
from blockdraft.errors import ConfigError
from blockdraft.vllm_runtime.server import cpu_cores_bind, is_cpu_threads_bind, server_settings


def test_all_binds_every_core_this_process_may_use_and_auto_leaves_vllms_default(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert server_settings("cpu", 512, 4, 1, "all")[1]["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_settings("cpu", 512, 4, 1)[1]  # auto, the serving default
    assert server_settings("cpu", 512, 4, 1, "0,2")[1]["VLLM_CPU_OMP_THREADS_BIND"] == "0,2"
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 2})
    assert cpu_cores_bind("all") == "0,2"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_settings("cuda", 512, 4, 1, "all")[1]  # a CPU setting only


def test_a_binding_already_in_the_environment_wins(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_settings("cpu", 512, 4, 1, "all")[1]  # inherited as set


@pytest.mark.parametrize("choice", ["auto", "all", "0-1", "0,2-3"])
def test_good_choices_pass(choice):
    assert is_cpu_threads_bind(choice)


@pytest.mark.parametrize("choice", ["both", "0-", "", "a,b"])
def test_bad_choices_are_refused_with_the_forms_that_work(choice, tmp_path):
    assert not is_cpu_threads_bind(choice)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="use auto .* all .* or a core list such as 0-1"):
        RegenConfig(target_dir=str(tmp_path), out=str(tmp_path / "o"), prompts="tiny_prompts", cpu_threads_bind=choice).validate()

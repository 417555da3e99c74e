"""Where regen's servers run (their GPUs or cores, their arguments), and the settings refused before any work."""

import pytest

from blockdraft.errors import ConfigError
from blockdraft.pipeline.keys import without
from blockdraft.regen.config import RegenConfig
from blockdraft.regen.endpoints import base_url
from blockdraft.regen.server_checks import data_parallel_size
from blockdraft.regen.servers import local_server_count, plan_slots, server_arguments
from blockdraft.vllm_runtime import server as server_module
from blockdraft.vllm_runtime.server import core_list_text, parse_core_list, split_evenly


@pytest.fixture
def target(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


@pytest.fixture
def gpus(monkeypatch):
    def visible(ids: str):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ids)
    return visible


@pytest.fixture
def cores(monkeypatch):
    """A CPU machine (no GPU visible) whose process may use `n` cores."""
    def usable(n: int):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        monkeypatch.setattr(server_module, "usable_cores", lambda: list(range(n)))
    return usable


def test_each_server_gets_its_own_group_of_gpus(tmp_path):
    slots = plan_slots(4, 2, "cuda", "all", ["0", "1", "2", "3", "4", "5", "6", "7"], tmp_path)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0,1", "2,3", "4,5", "6,7"]
    assert [s.log.name for s in slots] == [f"vllm_regen.{i}.log" for i in range(4)]


def test_on_cpu_the_cores_are_split_between_servers_and_again_between_their_ranks(tmp_path, cores):
    cores(8)
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in plan_slots(2, 1, "cpu", "all", [], tmp_path)] == ["0-3", "4-7"]
    # A server with tensor or data parallel ranks: one run of cores per rank, as vLLM reads them (`|`).
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in plan_slots(2, 2, "cpu", "all", [], tmp_path)] == ["0-1|2-3", "4-5|6-7"]
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in plan_slots(3, 1, "cpu", "0-4", [], tmp_path)] == ["0-1", "2-3", "4"]
    assert plan_slots(1, 1, "cpu", "auto", [], tmp_path)[0].env == {}  # vLLM's own binding, as before


def test_core_lists_read_and_write_as_vllm_takes_them():
    assert parse_core_list("0-2,6") == [0, 1, 2, 6] and core_list_text([0, 1, 2, 6, 8, 9]) == "0-2,6,8-9"
    assert split_evenly(list(range(5)), 2) == [[0, 1, 2], [3, 4]]


def test_by_default_a_cuda_machine_fills_its_gpus_and_a_cpu_runs_one_server(target):
    cfg = RegenConfig(target_dir=target, out="o", tensor_parallel_size=2)
    assert local_server_count(cfg, "cuda", [str(i) for i in range(8)]) == 4
    assert local_server_count(cfg, "cpu", []) == 1
    dp = RegenConfig(target_dir=target, out="o", extra_vllm_args=["--data-parallel-size=8"])
    assert local_server_count(dp, "cuda", [str(i) for i in range(8)]) == 1 and data_parallel_size(dp.extra_vllm_args) == 8


def test_every_server_gets_the_tensor_parallel_size_and_the_extra_arguments_last(target):
    cfg = RegenConfig(target_dir=target, out="o", tensor_parallel_size=4, workers=64,
                      extra_vllm_args=["--gpu-memory-utilization", "0.85"])
    args, _ = server_arguments(cfg, "cuda")
    assert args[args.index("--tensor-parallel-size") + 1] == "4" and args[args.index("--max-num-seqs") + 1] == "64"
    assert args[-2:] == ["--gpu-memory-utilization", "0.85"]


@pytest.mark.parametrize("override,message", [
    ({"servers": -1}, r"servers=-1 must be 0 or more"),
    ({"servers": 0}, r"servers=0 and no endpoints: nothing would answer; set servers=1 or more, or endpoints="),
    ({"tensor_parallel_size": 0}, r"tensor_parallel_size=0 must be 1 or more"),
    ({"retries": -1}, r"retries=-1 must be 0 or more"),
    ({"endpoints": ["node2:8000"]}, r"endpoints\[0\]='node2:8000' is not an http\(s\) URL; write it as http://host:port"),
    ({"extra_vllm_args": ["--max-num-seqs", "8"]}, r"extra_vllm_args sets --max-num-seqs, which regen sets itself; set workers="),
    ({"extra_vllm_args": ["-tp", "2"]}, r"set tensor_parallel_size= instead"),
    ({"extra_vllm_args": ["--data-parallel-size", 2]}, r"must be strings, one per argv word"),
    ({"extra_vllm_args": ["--data-parallel-size", "two"]}, r"--data-parallel-size 'two' is not a whole number"),
    ({"backend": "transformers", "endpoints": ["http://h:1"]}, r"backend=transformers answers in this process"),
])
def test_settings_that_cannot_work_are_refused_in_one_line(target, cores, override, message):
    cores(2)
    with pytest.raises(ConfigError, match=message):
        RegenConfig(target_dir=target, out="o", **override).validate()


def test_more_gpus_than_visible_are_refused_naming_the_fix(target, gpus):
    gpus("0,1,2,3")
    with pytest.raises(ConfigError, match=r"servers=2 with tensor_parallel_size=4 GPUs each needs 8 GPUs; 4 are visible "
                                          r"\(CUDA_VISIBLE_DEVICES=0,1,2,3\): lower servers= or tensor_parallel_size="):
        RegenConfig(target_dir=target, out="o", servers=2, tensor_parallel_size=4).validate()
    with pytest.raises(ConfigError, match=r"x --data-parallel-size 4 GPUs each needs 8"):
        RegenConfig(target_dir=target, out="o", tensor_parallel_size=2, extra_vllm_args=["-dp", "4"]).validate()
    RegenConfig(target_dir=target, out="o", servers=2, tensor_parallel_size=2).validate()


def test_more_servers_than_cores_or_servers_sharing_cores_are_refused(target, cores):
    cores(2)
    with pytest.raises(ConfigError, match=r"servers=3 with 1 rank\(s\) each needs a core per rank, 3 cores; "
                                          r"cpu_threads_bind=all gives 2: lower servers="):
        RegenConfig(target_dir=target, out="o", servers=3).validate()
    with pytest.raises(ConfigError, match=r"cpu_threads_bind=auto lets each vLLM take every core but one, so servers=2"):
        RegenConfig(target_dir=target, out="o", servers=2, cpu_threads_bind="auto").validate()
    RegenConfig(target_dir=target, out="o", servers=2).validate()
    RegenConfig(target_dir=target, out="o", servers=0, endpoints=["https://h.example/v1"]).validate()
    # Endpoints alone start nothing here: nothing to place, whatever this machine has.
    RegenConfig(target_dir=target, out="o", tensor_parallel_size=8, endpoints=["http://n2:8000"]).validate()


def test_endpoints_take_the_base_url_with_or_without_v1():
    assert base_url("http://node2:8000/v1/") == base_url("http://node2:8000") == "http://node2:8000"


def test_where_and_how_fast_it_runs_changes_no_row_so_no_pipeline_key(target):
    plain = RegenConfig(target_dir=target, out="o")
    scaled = RegenConfig(target_dir=target, out="o", servers=8, tensor_parallel_size=2, endpoints=["http://n2:8000"],
                         endpoint_model="m", endpoint_api_key_env="KEY", extra_vllm_args=["--enable-prefix-caching"],
                         retries=9, retry_backoff_s=1.0)
    assert without(plain, RegenConfig.OUTPUT_NEUTRAL) == without(scaled, RegenConfig.OUTPUT_NEUTRAL)

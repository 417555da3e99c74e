"""What a report says of its machine: the CPU model and the ISA features that change kernels, vLLM's
OpenMP binding as its log states it, and what a draft-and-verify round costs in plain decode steps."""

import pytest

from blockdraft import machine
from blockdraft.serve.client import Completion, SpecMetrics
from blockdraft.serve.report import Round
from blockdraft.vllm_runtime.omp_binding import omp_binding

CPUINFO = "processor : 0\nmodel name : AMD EPYC 9B14\nflags : fpu sse2 avx2 avx512f amx_tile amx_bf16\n"
VLLM_LOG = """\
(EngineCore pid=7789) INFO 12-02 13:37:50 [core.py:133] Initializing a V1 LLM engine (v0.32.0)
(EngineCore pid=7789) INFO 12-02 13:37:50 [ompmultiprocessing.py:185] OpenMP thread binding info: 
(EngineCore pid=7789) INFO 12-02 13:37:50 [ompmultiprocessing.py:185] \tVLLM_CPU_OMP_THREADS_BIND='auto', auto_setup=True
(EngineCore pid=7789) INFO 12-02 13:37:51 [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=[0]
(EngineCore pid=7789) INFO 12-02 13:37:51 [ompmultiprocessing.py:185] \treserved_cpus=[1]
[W1202 13:38:01.527700214 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy
"""


def test_the_machine_names_its_cpu_and_which_kernel_features_it_has(monkeypatch):
    files = {"/proc/cpuinfo": CPUINFO, "/proc/meminfo": "MemTotal:       25165824 kB\n"}
    monkeypatch.setattr(machine, "_read", lambda path: files[path])
    facts = machine.machine_facts()
    assert facts["cpu_model"] == "AMD EPYC 9B14" and facts["memory_gib"] == 24
    assert (facts["avx512f"], facts["avx512_bf16"], facts["amx"]) == (True, False, True)
    assert "(AMD EPYC 9B14; avx512f, amx; no avx512_bf16), 24 GiB" in machine.describe(facts)


def test_the_openmp_binding_is_read_from_the_vllm_log(tmp_path):
    log = tmp_path / "vllm_draft.log"
    log.write_text(VLLM_LOG)
    assert omp_binding(log) == "VLLM_CPU_OMP_THREADS_BIND='auto', auto_setup=True; local_rank=0, core ids=[0]; reserved_cpus=[1]"
    log.write_text("INFO [core.py:1] a GPU log has no binding block\n")
    assert omp_binding(log) is None and omp_binding(tmp_path / "missing.log") is None


def test_a_round_costs_the_draft_runs_seconds_per_round_over_the_baselines_per_token():
    base = [Completion(0, list(range(10)), 1.0), Completion(1, list(range(10)), 1.0)]  # 0.1 s per token
    draft = [Completion(0, list(range(10)), 0.75), Completion(1, list(range(10)), 0.75)]
    played = Round(baseline=base, draft=draft, metrics=SpecMetrics(num_drafts=6.0))  # 0.25 s per round
    assert played.round_cost() == pytest.approx(2.5)
    assert played.throughput()["round_cost"] == pytest.approx(2.5)
    assert Round(baseline=base, draft=draft, metrics=SpecMetrics()).round_cost() is None  # no draft was proposed

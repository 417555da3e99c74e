"""Regeneration spread over several servers, against server processes: two servers regen starts with a kill
of the run and a resume, an endpoint that runs already (alone, and beside a server regen starts), a request
that fails, is retried, then rejected, and a server that dies mid-run.

The fast tests run the fake vLLM of tests/fake_vllm.py (a real process on a real port, vLLM's command line,
its completions and /v1/models) in seconds; the one marked slow runs the real vLLM of .venv-serve on the
tiny target, twice started by regen and once as an endpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.regen.app import run_regen
from blockdraft.regen.config import RegenConfig
from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON
from blockdraft.vllm_runtime.server import VllmServer
from tests.fake_vllm import recorded_fake_python

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"


@pytest.fixture(scope="module")
def target():
    return save_tiny_target(TARGET, "qwen3")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    yield from recorded_fake_python(tmp_path, monkeypatch)


def settings(target, out, fake, **overrides) -> RegenConfig:
    base = dict(target_dir=str(target), out=str(out), prompts="tiny_prompts", num_train=24, num_heldout=0, max_tokens=4,
                backend="vllm", vllm_python=str(fake), workers=2, shard_size=8, progress=False, startup_timeout_s=30,
                retry_backoff_s=0.01)
    return RegenConfig(**{**base, **overrides})


def shard_rows(out: Path, split: str = "train") -> list:
    """Every whole row in the split's shards, repeats included (a torn line is no row)."""
    rows = []
    for shard in sorted((out / "parts" / split).glob("[0-9]*.jsonl")):
        for line in shard.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def manifest(out: Path) -> dict:
    return json.loads((out / "regen.json").read_text())


def test_two_servers_share_the_prompts_and_a_killed_run_resumes_answering_each_prompt_once(target, fake, tmp_path):
    out = tmp_path / "regen"
    words = [f"target={target}", f"out={out}", "prompts=tiny_prompts", "num_train=40", "num_heldout=0", "max_tokens=4",
             "backend=vllm", f"vllm_python={fake}", "servers=2", "workers=2", "shard_size=8", "progress=false"]
    env = {**os.environ, "FAKE_SLOW_S": "0.05", "OMP_WAIT_POLICY": "PASSIVE"}
    run = subprocess.Popen([sys.executable, "-m", "blockdraft.regen", *words], cwd=REPO, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(shard_rows(out)) < 6 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    run.kill()  # SIGKILL: no clean-up of any kind runs
    run.wait()
    before = {r["generation"]["index"]: r for r in shard_rows(out)}
    assert 6 <= len(before) < 40

    run_regen(settings(target, out, fake, num_train=40, servers=2, extra_vllm_args=[]))
    rows = shard_rows(out)
    assert Counter(r["generation"]["index"] for r in rows) == Counter(range(40))  # each once, none lost, none twice
    for index, row in before.items():  # kept, not answered again
        assert next(r for r in rows if r["generation"]["index"] == index) == row
    merged = [json.loads(line)["generation"]["index"] for line in (out / "train.jsonl").read_text().splitlines()]
    assert merged == list(range(40))
    resumed = manifest(out)["splits"]["train"]["last_run"]["by_server"]
    assert len(resumed) == 2 and all(server["rows"] > 0 for server in resumed.values())  # both took prompts
    assert sorted(p.name for p in out.glob("vllm_regen.*.log")) == ["vllm_regen.0.log", "vllm_regen.1.log"]


def outside_server(fake, tmp_path, name="outside", **env) -> VllmServer:
    return VllmServer(fake, "/models/tiny", log_path=tmp_path / f"{name}.log", startup_timeout_s=30,
                      args=["--served-model-name", "tiny-served", "--max-model-len", "1024"], env=env)


def test_an_endpoint_that_runs_already_answers_alone_or_beside_a_server_regen_starts(target, fake, tmp_path):
    with outside_server(fake, tmp_path, FAKE_SLOW_S="0.02") as endpoint:
        alone = run_regen(settings(target, tmp_path / "alone", fake, endpoints=[endpoint.url + "/v1"]))
        assert not list(alone.glob("vllm_regen.*.log"))  # no server started
        assert {json.dumps(r["generation"]["served_by"]) for r in shard_rows(alone)} == {
            json.dumps({"url": endpoint.url, "model": "tiny-served"})}
        [record] = manifest(alone)["servers"]
        assert (record["kind"], record["url"], record["model"]) == ("endpoint", endpoint.url, "tiny-served")
        assert manifest(alone)["settings"]["temperature"] == 0.0  # the sampling, beside who answered

        both = run_regen(settings(target, tmp_path / "both", fake, endpoints=[endpoint.url], servers=1))
        answered = manifest(both)["splits"]["train"]["last_run"]["by_server"]
        assert sorted(s["kind"] for s in manifest(both)["servers"]) == ["endpoint", "started"]
        assert len(answered) == 2 and all(server["rows"] > 0 for server in answered.values())
        assert sorted(r["generation"]["index"] for r in shard_rows(both)) == list(range(24))


def prompt_sums(cfg: RegenConfig) -> list:
    """The sum of each training prompt's ids: what the fake keys its injected failures by."""
    from transformers import AutoTokenizer

    from blockdraft.regen.prompt_plan import plan_splits
    from blockdraft.regen.turns import prompt_ids, turn_inputs

    tokenizer = AutoTokenizer.from_pretrained(cfg.target_dir)
    return [sum(prompt_ids(tokenizer, turn_inputs(c, 1)[0])) for c in plan_splits(cfg, tokenizer)["train"].conversations]


def test_a_failing_request_is_retried_then_rejected_keeping_every_other_row_and_a_rerun_answers_it(target, fake, tmp_path, capsys):
    out = tmp_path / "regen"
    cfg = settings(target, out, fake, servers=0, retries=2)
    sums = prompt_sums(cfg)
    flaky, broken = 3, 5
    assert sums.count(sums[flaky]) == 1 and sums.count(sums[broken]) == 1
    failing = json.dumps({str(sums[flaky]): 1, str(sums[broken]): -1})
    with outside_server(fake, tmp_path, FAKE_FAIL_PROMPTS=failing) as endpoint:
        run_regen(settings(target, out, fake, servers=0, retries=2, endpoints=[endpoint.url]))
    assert sorted(r["generation"]["index"] for r in shard_rows(out)) == [i for i in range(24) if i != broken]
    [reject] = [json.loads(line) for line in (out / "parts" / "train" / "rejects.jsonl").read_text().splitlines()]
    assert (reject["index"], reject["attempts"]) == (broken, 3) and "HTTP 500" in reject["reason"]
    record = manifest(out)["splits"]["train"]
    assert (record["rejects"], record["complete"], record["last_run"]["failed_requests"]) == (1, False, 4)
    assert "1 prompts got no answer after every retry" in capsys.readouterr().err

    with outside_server(fake, tmp_path, name="mended") as endpoint:
        run_regen(settings(target, out, fake, servers=0, retries=2, endpoints=[endpoint.url]))
    assert Counter(r["generation"]["index"] for r in shard_rows(out)) == Counter(range(24))
    assert manifest(out)["splits"]["train"]["complete"] and not (out / "parts" / "train" / "rejects.jsonl").exists()


def test_a_server_that_dies_mid_run_leaves_its_prompts_to_the_other(target, fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_DIE_ONE_AFTER", "3")
    monkeypatch.setenv("FAKE_SLOW_S", "0.02")
    out = run_regen(settings(target, tmp_path / "regen", fake, servers=2))
    assert (tmp_path / "died").exists()
    assert Counter(r["generation"]["index"] for r in shard_rows(out)) == Counter(range(24))
    last_run = manifest(out)["splits"]["train"]["last_run"]
    [gone] = last_run["gone"]
    assert last_run["by_server"][gone]["rows"] <= 3 and last_run["rejects"] == 0


needs_vllm = pytest.mark.skipif(not DEFAULT_VLLM_PYTHON.is_file(),
                                reason=f"no serving env at {DEFAULT_VLLM_PYTHON}; run `make setup-serve`")


@pytest.mark.slow
@needs_vllm
def test_real_vllm_two_servers_regen_starts_and_an_endpoint_share_the_prompts(target, tmp_path):
    """Two real vLLM servers started by regen, each on its own core as vLLM's own log states it, and one
    started outside (under another served name), which passes the tokenizer check through vLLM's /tokenize."""
    from blockdraft.regen.servers import server_arguments

    cfg = RegenConfig(target_dir=str(target), out=str(tmp_path / "regen"), prompts="tiny_prompts", num_train=24,
                      num_heldout=0, max_tokens=8, max_prompt_tokens=128, workers=4, kv_cache_gib=1, progress=False,
                      backend="vllm", servers=2)
    args, env = server_arguments(cfg, "cpu")
    endpoint = VllmServer(DEFAULT_VLLM_PYTHON, str(target), log_path=tmp_path / "endpoint.log", startup_timeout_s=600,
                          args=[*args, "--served-model-name", "tiny-endpoint"], env={**env, "VLLM_CPU_OMP_THREADS_BIND": "0"})
    with endpoint:
        cfg.endpoints = [endpoint.url]
        out = run_regen(cfg)
    servers = manifest(out)["servers"]
    assert sorted(s["kind"] for s in servers) == ["endpoint", "started", "started"]
    assert all(s["tokenizer_checked"] for s in servers)  # vLLM's /tokenize agrees with target_dir's tokenizer
    assert {s["model"] for s in servers if s["kind"] == "endpoint"} == {"tiny-endpoint"}
    bindings = [s["vllm_omp_binding"] for s in servers if s["kind"] == "started"]
    assert "core ids=[0]" in bindings[0] and "core ids=[1]" in bindings[1]  # each server its own core
    rows = shard_rows(out)
    assert Counter(r["generation"]["index"] for r in rows) == Counter(range(24))
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows)
    answered = manifest(out)["splits"]["train"]["last_run"]["by_server"]
    assert len(answered) == 3 and all(server["rows"] > 0 for server in answered.values())

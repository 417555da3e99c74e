"""docs/pipeline.md's sbatch script, run as written by bash with stand-ins for what a Slurm node has: `srun` (runs
its command once per task, on the node named, and passes a SIGTERM on, as srun does), `scontrol`, `curl`, `sleep`
(short), the checkout's vLLM (a server that waits for its SIGTERM) and `blockdraft` (node 0's prints the line the
pipeline prints when its regen is over). Each records what it was given. Then what the script would run is checked:
the pipeline command composes (its own `--cfg job`, with 8 GPUs visible as on a node), the two nodes' commands
differ only in train.node_rank, regen.endpoints names exactly node 1's vLLM servers, whose context and batch fit
regen's settings, and node 1's servers stop before its pipeline starts.

`--cfg job` here skips one of its checks, that the prompts hold regen.num_train + regen.num_heldout: it tokenises
all 10,256 of them (7 s), and it depends on the regen keys alone, not on how the nodes are laid out."""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from tests.unit.command_check import REPO, config_only_target, run_app

NODES = ("gpu-a", "gpu-b")
CPUS_PER_NODE = 64
GPUS_PER_NODE = 8


def sbatch_script() -> str:
    text = (REPO / "docs" / "pipeline.md").read_text()
    scripts = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if b.startswith("#!/bin/bash") and "#SBATCH" in b]
    assert len(scripts) == 1, "docs/pipeline.md should hold one sbatch script"
    return scripts[0]


def pipeline_lines(tmp_path) -> dict:
    """What the pipeline prints when its regen stage runs, and when a rerun finds it cached (runner.lead itself)."""
    from blockdraft.pipeline.records import StageRecords
    from blockdraft.pipeline.runner import Stage, run_stages

    regen = Stage("regen", {}, lambda: True, lambda: True, tmp_path)
    printed = {}
    for run in ("done", "cached"):
        out = io.StringIO()
        with redirect_stdout(out):
            run_stages([regen], StageRecords(tmp_path / "stages.json"), [])
        printed[run] = next(line for line in out.getvalue().splitlines() if line.startswith("[pipeline] regen: "))
    assert "done in" in printed["done"] and "cached" in printed["cached"]
    return printed


STANDINS = {
    "bin/srun": r"""
printf 'srun\t-\t%s\n' "$(printf '%q ' "$@")" >> "$CALLS"
node= ntasks=1
while [[ $1 == -* ]]; do
    case $1 in --nodelist=*) node=${1#*=};; --ntasks=*) ntasks=${1#*=};; esac
    shift
done
pids=()
for ((i = 0; i < ntasks; i++)); do SLURMD_NODENAME=$node SLURM_LOCALID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' TERM
until wait; do :; done
""",
    "bin/scontrol": 'printf "%s\\n" ' + " ".join(NODES),
    "bin/curl": 'port=${*: -1}; port=${port##*:}; [[ -f $STATE/up-${port%%/*} ]]',
    "bin/sleep": 'exec "$REAL_SLEEP" 0.02',
    "checkout/.venv-serve/bin/vllm": r"""
printf 'vllm\t%s\t%s\n' "$SLURMD_NODENAME" "$(printf '%q ' "$@")" >> "$CALLS"
port=$(sed -n 's/.*--port \([0-9]*\).*/\1/p' <<< "$*")
trap 'printf "vllm-stopped\t%s\t%s\n" "$SLURMD_NODENAME" "$port" >> "$CALLS"; exit 0' TERM
touch "$STATE/up-$port"
while :; do sleep 1; done
""",
    "checkout/.venv/bin/blockdraft": r"""
printf 'blockdraft\t%s\t%s\n' "$SLURMD_NODENAME" "$(printf '%q ' "$@")" >> "$CALLS"
if [[ " $* " == *" train.node_rank=0 "* ]]; then echo "$REGEN_LINE"; fi
""",
}


def run_script(tmp_path, target: Path, regen_line: str) -> list:
    """Runs the script with the stand-ins; returns what they recorded, in order: (what, node, words)."""
    for name, body in STANDINS.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/bash\n" + body.lstrip("\n"))
        path.chmod(0o755)
    (tmp_path / "state").mkdir()
    script = tmp_path / "pipeline-2x8.sbatch"
    script.write_text(sbatch_script())
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "REAL_SLEEP": shutil.which("sleep"),
           "CALLS": str(tmp_path / "calls.tsv"), "STATE": str(tmp_path / "state"), "REGEN_LINE": regen_line,
           "TARGET": str(target), "OUT": str(tmp_path / "out"), "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_CPUS_ON_NODE": str(CPUS_PER_NODE)}
    done = subprocess.run(["bash", str(script)], cwd=tmp_path / "checkout", env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line.split("\t", 2) for line in (tmp_path / "calls.tsv").read_text().splitlines()]
    return [(what, node, shlex.split(words)) for what, node, words in rows]


def options(words: list) -> dict:
    return dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)


def flag(words: list, name: str) -> str:
    return words[words.index(name) + 1]


@pytest.fixture
def eight_gpus(monkeypatch):
    """What node 0 and node 1 see: regen checks its servers against the visible GPUs when it composes."""
    monkeypatch.setattr("blockdraft.regen.server_checks.visible_gpus", lambda: [str(i) for i in range(GPUS_PER_NODE)])


@pytest.fixture
def target(tmp_path):
    """A config-only Qwen3-8B (the recipe's shape; composing reads no weights)."""
    from blockdraft.models.tiny_target import save_tiny_target

    tiny = save_tiny_target(REPO / ".cache" / "targets" / "tiny-qwen3", "qwen3")
    return config_only_target(tmp_path / "Qwen3-8B", "qwen3", tiny, num_hidden_layers=36, hidden_size=4096,
                              intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                              vocab_size=151936)


def composed_regen(words: list) -> dict:
    """The pipeline's `--cfg job` for these words: it must pass; returns the regen stage's composed config."""
    status, printed = run_app("pipeline", [*words, "--cfg", "job"])
    assert status == 0, printed[-1500:]
    regen = printed[printed.index("# --- regen:"):printed.index("# --- capture:")]
    return yaml.safe_load(regen.split("\n", 1)[1])


def test_the_sbatch_script_runs_node_1s_servers_for_regen_then_both_pipelines(tmp_path, target, eight_gpus, monkeypatch):
    from blockdraft.pipeline import commands
    from blockdraft.pipeline.settings import check_settings, parse_overrides

    monkeypatch.setattr("blockdraft.pipeline.app.check_prompt_supply", lambda regen, train: None)  # the docstring says why
    calls = run_script(tmp_path, target, pipeline_lines(tmp_path / "lines")["done"])
    pipelines = {node: words for what, node, words in calls if what == "blockdraft"}
    assert set(pipelines) == set(NODES), calls
    leader, follower = pipelines[NODES[0]], pipelines[NODES[1]]
    assert leader[0] == "pipeline" and "train.node_rank=0" in leader and "train.node_rank=1" in follower
    assert [w for w in leader if w != "train.node_rank=0"] == [w for w in follower if w != "train.node_rank=1"]
    assert f"train.rdzv_endpoint={NODES[0]}:29500" in leader and f"target={target}" in leader
    regen = composed_regen(leader[1:])  # every key known, every app composed and checked
    check_settings(parse_overrides(follower[1:]))  # node 1's rank, within train.nnodes
    # When the run takes a feature store, node 1's 8 GPUs capture beside node 0's: the capture is launched as
    # training is, on both nodes and the same rendezvous endpoint.
    for words, rank in ((leader, 0), (follower, 1)):
        s = parse_overrides(words[1:])
        capture, training = commands.stage_argv("capture", s, True), commands.train_argv(s, True)
        assert [w for w in capture if w.startswith("--")] == [
            w + "-capture" if w.startswith("--rdzv_id=") else w for w in training if w.startswith("--")]
        assert f"--node_rank={rank}" in capture and "--nnodes=2" in capture and "--nproc_per_node=8" in capture

    servers = [(node, words) for what, node, words in calls if what == "vllm"]
    assert len(servers) == GPUS_PER_NODE and {node for node, _ in servers} == {NODES[1]}
    assert all(words[:2] == ["serve", str(target)] for _, words in servers)
    ports = sorted(int(flag(words, "--port")) for _, words in servers)
    assert len(set(ports)) == GPUS_PER_NODE
    assert sorted(regen["endpoints"]) == sorted(f"http://{NODES[1]}:{port}" for port in ports)
    assert regen["servers"] == GPUS_PER_NODE  # node 0's own, beside the endpoints
    needed = regen["max_prompt_tokens"] + regen["max_tokens"]
    assert all(int(flag(w, "--max-model-len")) >= needed for _, w in servers)
    assert all(int(flag(w, "--max-num-seqs")) >= regen["workers"] for _, w in servers)

    steps = [options(words) for what, _, words in calls if what == "srun"]
    served = next(s for s in steps if s["ntasks"] == str(GPUS_PER_NODE))
    assert served["nodelist"] == NODES[1] and served["gpus-per-task"] == "1"
    assert sum(s.get("gpus-per-node") == str(GPUS_PER_NODE) for s in steps) == 2  # each pipeline, its node's GPUs

    order = [(what, node) for what, node, _ in calls]
    started_leader = order.index(("blockdraft", NODES[0]))
    started_follower = order.index(("blockdraft", NODES[1]))
    assert max(i for i, (what, _) in enumerate(order) if what == "vllm") < started_leader  # its endpoints answer first
    stopped = [i for i, (what, _) in enumerate(order) if what == "vllm-stopped"]
    assert len(stopped) == GPUS_PER_NODE and max(stopped) < started_follower  # GPUs free before training


def test_node_1_stops_serving_at_either_line_the_pipeline_prints_when_regen_is_over(tmp_path):
    pattern = re.search(r"grep -qE '([^']+)' \"\$log\"", sbatch_script()).group(1)
    for run, line in pipeline_lines(tmp_path).items():
        assert subprocess.run(["grep", "-qE", pattern], input=line + "\n", text=True).returncode == 0, (run, line)

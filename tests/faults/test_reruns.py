"""Rerun a finished pipeline as a user would, with one kind of change at a time; nothing finished may be
lost. A throughput or logging knob keeps every stage (the store and the checkpoints byte for byte); more
steps continue the run; a new recipe, force= or new target weights run the stages again with what they
replace kept under <out>/superseded/; two nodes killed part way and rerun keep their training, which one
node then continues with the same global batch.

The tiny Qwen3 target, served by the reference engine (the vLLM pipeline is tests/integration/test_pipeline.py):
what is measured here is what a rerun keeps, not what serving computes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from blockdraft.models.tiny_target import save_tiny_target
from tests.faults.conftest import REPO, WAIT_S
from tests.unit.test_pipeline_keys import rewrite_weights

BLOCKDRAFT = REPO / ".venv" / "bin" / "blockdraft"
# Minutes of real pipelines: make test-slow and make test-faults. make test reruns with NEUTRAL knobs in
# tests/integration/test_pipeline.py and keeps the other reruns' logic in faster tests (its docstring names them).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (REPO / ".venv-serve" / "bin" / "python").exists(),
                                 reason="no serving environment (the serve stage probes it): run `make setup-serve`")]
SMALL = ["prompts=tiny", "experiment=tiny_cpu", "regen.num_train=32", "regen.num_heldout=4", "regen.max_tokens=32",
         "regen.backend=transformers", "regen.progress=false", "train.max_steps=30", "train.save_every=10",
         "train.keep_last=10", "train.log_every=10", "train.progress=false", "serve.num_prompts=2", "serve.max_tokens=24",
         "serve.rounds=1", "serve.engine=reference"]
NEUTRAL = ["regen.workers=7", "train.log_every=5", "wandb.project=renamed", "capture.rows_per_forward=4",
           "serve.request_timeout_s=100"]


def start(target, out, *extra, fault=None, log=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("BLOCKDRAFT_FAULT", None)
    if fault:
        env["BLOCKDRAFT_FAULT"], env["BLOCKDRAFT_FAULT_MARK"] = fault, str(Path(log).with_suffix(".mark"))
    with open(log, "wb") as fh:
        return subprocess.Popen([str(BLOCKDRAFT), "pipeline", f"target={target}", f"out={out}", *SMALL, *extra],
                                cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


class Rerun:
    """One pipeline run to its end: exit code, output, seconds, and the stages it ran."""

    def __init__(self, target, out, *extra, log, fault=None):
        began = time.monotonic()
        proc = start(target, out, *extra, log=log, fault=fault)
        self.code = proc.wait(WAIT_S * 3)
        self.seconds = time.monotonic() - began
        self.out = Path(log).read_text(errors="replace")
        self.ran = [line.split()[2] for line in self.out.splitlines() if line.startswith("[pipeline] === ")]


def snapshot(path: Path) -> dict:
    """Every file under `path`: its hash and modification time (a file written again, even alike, differs)."""
    return {str(p.relative_to(path)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*")) if p.is_file()}


def superseded(out: Path) -> list:
    root = out / "superseded"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (each stage runs in its own process group)."""
    children: dict = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, found = [pid], []
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    for p in found:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Chain:
    """A finished pipeline, then each rerun in turn on the same out; what each found and left.

    The reruns run in this order, each when a test first asks for it or for a later one; `force` and
    `weights` only when their own tests ask for them."""

    ORDER = ("first", "neutral", "longer", "recipe", "force", "nonfinite", "advice", "weights")
    ON_REQUEST = ("force", "weights")

    def __init__(self, root: Path):
        self.root, self.out, self.results = root, root / "out", {}
        self.target = shutil.copytree(save_tiny_target(REPO / ".cache" / "targets" / "tiny-qwen3", "qwen3"), root / "target")
        self.steps = {
            "first": dict(),
            "neutral": dict(extra=NEUTRAL),
            "longer": dict(extra=["train.max_steps=40"]),
            "recipe": dict(extra=["train.max_steps=40", "optim.lr=1e-3"]),
            "force": dict(extra=["train.max_steps=40", "optim.lr=1e-3", "force=[train]"]),
            # A new run that stops on non-finite steps (NaN losses from step 15 on), then the advice it prints, followed.
            "nonfinite": dict(extra=["train.max_steps=40", "optim.lr=1e-3", "train.max_nonfinite_steps=2", "force=[train]"],
                              fault="train.loss@15+:nan"),
            "advice": dict(extra=["train.max_steps=40", "optim.lr=5e-4", "train.max_nonfinite_steps=2"]),
            "weights": dict(extra=["train.max_steps=40", "optim.lr=5e-4"], before=lambda: rewrite_weights(self.target)),
        }

    def __getitem__(self, name: str) -> Rerun:
        for earlier in self.ORDER[:self.ORDER.index(name) + 1]:
            if earlier not in self.results and (earlier == name or earlier not in self.ON_REQUEST):
                self.run(earlier, **self.steps[earlier])
        return self.results[name]

    def run(self, name, extra=(), before=None, fault=None):
        out = self.out
        if before:
            before()
        taken = {"store": snapshot(out / "store"), "run": snapshot(out / "run")} if out.exists() else {}
        aside = superseded(out)
        result = Rerun(self.target, out, *extra, log=self.root / f"{name}.log", fault=fault)
        result.before, result.after = taken, {"store": snapshot(out / "store"), "run": snapshot(out / "run")}
        result.moved = sorted(set(superseded(out)) - set(aside))  # what this rerun moved aside
        self.results[name] = result


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    chain = Chain(tmp_path_factory.mktemp("reruns"))
    return chain.out, chain


def check(result: Rerun, problems: list, ran: list) -> None:
    if result.code != 0:
        problems.append(f"the rerun exited {result.code}: {result.out[-2500:]}")
    elif result.ran != ran:
        problems.append(f"ran {result.ran}, expected {ran}")


def stages_moved(result: Rerun) -> list:
    return sorted(name.rsplit("-", 2)[0] for name in result.moved)


def moved_run(out: Path, result: Rerun) -> dict:
    """The run/ this rerun moved aside, as it lies there now."""
    homes = [name for name in result.moved if name.startswith("train-")]
    return snapshot(out / "superseded" / homes[0] / "run") if homes else {}


def test_a_rerun_with_throughput_and_logging_knobs_changed_caches_every_stage(chain, record):
    out, steps = chain
    first, result = steps["first"], steps["neutral"]
    assert first.code == 0, first.out[-3000:]
    problems = []
    check(result, problems, [])
    if result.out.count(": cached (") != 5:
        problems.append(f"{result.out.count(': cached (')} stages said cached, not 5")
    for part in ("store", "run"):
        if result.after[part] != result.before[part]:
            problems.append(f"{part}/ was written again")
    if result.moved:
        problems.append(f"moved aside: {result.moved}")
    record("a rerun with " + ", ".join(NEUTRAL) + " changed",
           f"every stage cached; the store ({len(result.before['store'])} files) and the run "
           f"({len(result.before['run'])} files) byte-identical, not rewritten", problems, result.seconds,
           "none needed: the rerun prints the report")
    assert not problems, "\n".join(problems)


def test_a_larger_max_steps_continues_the_run(chain, record):
    out, steps = chain
    result = steps["longer"]
    problems = []
    check(result, problems, ["train", "export", "serve"])
    if "step_30 at step 30" not in result.out:
        problems.append("training did not resume from step_30")
    if "train.max_steps 30 -> 40" not in result.out:
        problems.append("the schedule's change was not said")
    kept = {k: v for k, v in result.before["run"].items() if k.startswith("checkpoints/step_")}
    if any(result.after["run"].get(k) != v for k, v in kept.items()):
        problems.append("a checkpoint of the first 30 steps changed")
    if "checkpoints/step_40/model.safetensors" not in result.after["run"]:
        problems.append("no step_40 checkpoint")
    if stages_moved(result) != ["export", "serve"]:
        problems.append(f"moved aside {stages_moved(result)}, expected the 30-step export and report")
    record("a rerun with a larger train.max_steps (30 -> 40)",
           "regen and capture cached; training resumed from step_30 under the 40-step schedule, its checkpoints "
           "kept; the 30-step export and report kept in superseded/", problems, result.seconds,
           "the same command with the new max_steps")
    assert not problems, "\n".join(problems)


def test_a_changed_learning_rate_trains_a_new_run_and_keeps_the_old_one(chain, record):
    out, steps = chain
    result = steps["recipe"]
    problems = []
    check(result, problems, ["train", "export", "serve"])
    if "[resume]" in result.out:
        problems.append("the new recipe resumed the old run")
    if stages_moved(result) != ["export", "serve", "train"]:
        problems.append(f"moved aside {stages_moved(result)}")
    elif moved_run(out, result) != result.before["run"]:
        problems.append("the old run in superseded/ is not the run as it was")
    if "train: its settings changed; the earlier run/" not in result.out or "rm -r" not in result.out:
        problems.append("no line said why and where the old run went")
    record("a rerun with a changed optim.lr (a new recipe)",
           "the 40-step run moved whole to superseded/ with its record; a new run trained from step 0; regen and "
           "capture cached", problems, result.seconds, "none needed: the old run is kept aside")
    assert not problems, "\n".join(problems)


def test_force_train_trains_again_and_keeps_the_old_run(chain, record):
    out, steps = chain
    result = steps["force"]
    problems = []
    check(result, problems, ["train", "export", "serve"])
    if "[resume]" in result.out:
        problems.append("force=[train] resumed instead of training again")
    if "train" not in stages_moved(result) or moved_run(out, result) != result.before["run"]:
        problems.append("the forced run's predecessor is not kept whole in superseded/")
    if "train: force=[train]; the earlier run/" not in result.out:
        problems.append("no line said where the forced stage's run went")
    record("force=[train] on a finished run", "the finished run moved whole to superseded/; training ran again "
           "from step 0 (not resumed at max_steps)", problems, result.seconds, "none needed")
    assert not problems, "\n".join(problems)


def test_the_advice_after_non_finite_steps_works_as_printed_in_the_pipeline(chain, record):
    out, steps = chain
    stopped, result = steps["nonfinite"], steps["advice"]
    problems = []
    advice = "lower optim.lr, or set optim.grad_clip"
    if stopped.code != 1 or advice not in stopped.out or "with a lower optim.lr or optim.grad_clip set" not in stopped.out:
        problems.append(f"the stopped run exited {stopped.code} without the advice: {stopped.out[-2000:]}")
    check(result, problems, ["train", "export", "serve"])
    if "train: the run stopped part way; it continues from its last checkpoint" not in result.out:
        problems.append("the rerun with a lower optim.lr did not continue the stopped run")
    if "step_10 at step 10" not in result.out or "optim peak learning rate 0.001 -> 0.0005" not in result.out:
        problems.append("training did not resume from step_10 at the lower rate")
    if "train" in stages_moved(result):
        problems.append("the stopped run was moved aside instead of continued")
    record("training stops on non-finite steps in the pipeline; rerun as the advice says (a lower optim.lr)",
           "the stopped run continued in place from step_10 at the new rate to step 40", problems,
           result.seconds, "the same command with a lower optim.lr")
    assert not problems, "\n".join(problems)


def test_new_target_weights_at_the_same_path_run_every_stage_again(chain, record):
    out, steps = chain
    result = steps["weights"]
    problems = []
    check(result, problems, ["regen", "capture", "train", "export", "serve"])
    if stages_moved(result) != ["capture", "export", "regen", "serve", "train"]:
        problems.append(f"moved aside {stages_moved(result)}, expected every stage's artifact")
    record("new target weights written over the old at the same path",
           "every stage ran again (the fingerprint covers the weights); each earlier artifact kept in superseded/",
           problems, result.seconds, "none needed")
    assert not problems, "\n".join(problems)


# --- two nodes on one shared out ---------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_killed_and_rerun_keep_their_training(tmp_path, record):
    target = save_tiny_target(REPO / ".cache" / "targets" / "tiny-qwen3", "qwen3")
    out, problems = tmp_path / "out", []

    def nodes(attempt, fault0=None, fault1=None):
        port = free_port()
        words = ["train.nnodes=2", f"train.rdzv_endpoint=127.0.0.1:{port}", "node_wait_minutes=5"]
        return [start(target, out, *words, f"train.node_rank={rank}", fault=fault, log=tmp_path / f"{attempt}-{rank}.log")
                for rank, fault in ((0, fault0), (1, fault1))]

    def log(attempt, rank):
        return (tmp_path / f"{attempt}-{rank}.log").read_text(errors="replace")

    def wait_mark(attempt, rank, procs):
        mark, deadline = tmp_path / f"{attempt}-{rank}.mark", time.monotonic() + WAIT_S
        while not (mark.exists() and mark.read_text().strip()):
            assert procs[rank].poll() is None and time.monotonic() < deadline, log(attempt, rank)[-3000:]
            time.sleep(0.05)

    # 1: both nodes killed mid-training (node 0's rank 0 paused after step 25's backward; node 1 waits on it).
    first = nodes("first", fault0="train.after_backward@25:sleep=600")
    wait_mark("first", 0, first)
    for proc in first:
        kill_tree(proc.pid)
        proc.wait()
    kept = snapshot(out / "run" / "checkpoints")
    if sorted({k.split("/")[0] for k in kept}) != ["step_10", "step_20"]:
        problems.append(f"after the kill: checkpoints {sorted({k.split('/')[0] for k in kept})}, expected step_10, step_20")
    # 2: rerun both: training resumes on both from step_20; node 0 is then killed during its export.
    began = time.monotonic()
    second = nodes("second", fault0="export.after_weights:sleep=600")
    wait_mark("second", 0, second)
    resumed = time.monotonic() - began
    if second[1].wait(WAIT_S) != 0 or "node 1: training done" not in log("second", 1):
        problems.append(f"node 1 did not finish its training: {log('second', 1)[-1500:]}")
    kill_tree(second[0].pid)
    second[0].wait()
    # torchrun's c10d rendezvous gives global rank 0 (the one that resumes and saves) to either node.
    if not any("step_20 at step 20" in log("second", rank) for rank in (0, 1)):
        problems.append("the rerun did not resume from step_20")
    trained = snapshot(out / "run" / "checkpoints")
    if any(trained.get(k) != v for k, v in kept.items()) or "step_30/model.safetensors" not in trained:
        problems.append("the resumed training changed a kept checkpoint or did not reach step 30")
    # 3: rerun both: the finished training is cached on both; node 0 exports and serves.
    third = nodes("third")
    codes = [proc.wait(WAIT_S) for proc in third]
    if codes != [0, 0]:
        problems.append(f"the last rerun exited {codes}: {log('third', 0)[-1500:]} {log('third', 1)[-1500:]}")
    for rank in (0, 1):
        if "train: cached" not in log("third", rank) or "=== train" in log("third", rank):
            problems.append(f"node {rank} trained again in the last rerun")
    if snapshot(out / "run" / "checkpoints") != trained:
        problems.append("the last rerun rewrote the trained checkpoints")
    record("two nodes SIGKILLed mid-training, rerun, node 0 SIGKILLed in its export, rerun",
           "checkpoints step_10, step_20 kept; both nodes resumed from step_20 to step 30; the last rerun found the "
           "training cached on both (checkpoints byte-identical) and node 0 exported and served", problems, resumed,
           "the same command on each node")
    # 4: a node lost: node 0 alone, with train.max_steps raised, continues the 2-rank run at its global batch.
    began, alone = time.monotonic(), tmp_path / "alone-0.log"
    code = start(target, out, "train.max_steps=40", log=alone).wait(WAIT_S)
    text, moved = alone.read_text(errors="replace"), [name for name in superseded(out) if name.startswith("train-")]
    lost = [] if code == 0 else [f"the rerun on one node exited {code}: {text[-1500:]}"]
    if "step_30 at step 30" not in text:
        lost.append("the run on one node did not resume from step_30")
    if "[train] world size 2 -> 1: grad_accum 1 -> 2 keeps the global batch of 8 rows per step" not in text:
        lost.append("the run on one node did not keep (or say) its global batch")
    after = snapshot(out / "run" / "checkpoints")
    if moved or any(after.get(k) != v for k, v in trained.items()):
        lost.append(f"the 2-rank run was moved aside ({moved}) or a kept checkpoint changed")
    if "step_40/model.safetensors" not in after:
        lost.append("no step_40 checkpoint")
    record("the 2-node run continued on 1 node with a larger train.max_steps (30 -> 40)",
           "training resumed from step_30 on one rank with grad_accum 2, the global batch of 8 rows kept and said; "
           "its checkpoints kept, none moved aside", lost, time.monotonic() - began,
           "the same command without train.nnodes, train.max_steps raised")
    assert not problems + lost, "\n".join(problems + lost)

"""The stages in order: each runs unless its record and outputs say it is done, and what it ran
with is recorded so a rerun repeats only what a changed setting affects."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from blockdraft.pipeline import commands
from blockdraft.pipeline.records import StageRecords, stage_key
from blockdraft.pipeline.settings import PipelineSettings

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stage:
    name: str
    inputs: dict
    """What this stage's result depends on besides the stages before it (their keys chain into its key)."""
    run: Callable[[], bool]
    """Runs the stage; False when it stopped short of a result worth caching."""
    present: Callable[[], bool]
    artifact: Path
    wipe: Optional[Path] = None
    """Removed before the stage runs with other inputs than it started with: never resumed across recipes."""
    skip_reason: Optional[str] = None
    """Set when the stage is not part of this run (online capture, no gate)."""


def say(message: str) -> None:
    print(f"[pipeline] {message}", flush=True)


def run_command(argv: List[str]) -> int:
    say("$ " + " ".join(argv))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    # Idle OpenMP threads sleep instead of spinning: with two cores and anything else running,
    # spinning threads made each target forward 3-8x slower (measured: 0.6 s vs 2-5 s per row).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    stage = subprocess.Popen(argv, cwd=REPO, env=env)
    try:
        return stage.wait()
    except KeyboardInterrupt:
        stop(stage)
        raise


# A stage stopped by Ctrl-C stops its own vLLM servers and saves what it can first (seconds): it is
# given that long before it is killed. subprocess.run would kill it after 0.25 s, leaving its servers.
STOP_GRACE_S = 60.0
TERMINATED = {"by_signal": False}  # set by __main__'s SIGTERM handler: the stage did not see that signal


def on_sigterm(_signum, _frame) -> None:
    """The SIGTERM handler of the pipeline's commands: as KeyboardInterrupt, through the running stage's
    stop (which passes the signal on) and the records."""
    TERMINATED["by_signal"] = True
    raise KeyboardInterrupt


def stop(stage: subprocess.Popen) -> None:
    """The stage saw the terminal's Ctrl-C (one process group); a SIGTERM sent to this process alone is
    passed on. A second Ctrl-C while it cleans up kills it at once."""
    if TERMINATED["by_signal"]:
        stage.terminate()
    try:
        stage.wait(timeout=STOP_GRACE_S)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        stage.kill()
        stage.wait()


class StageFailed(Exception):
    def __init__(self, stage: str, code: int, fix: str):
        super().__init__(f"the {stage} stage failed (exit {code}); {fix}")
        self.code = code


def command_stage(name: str, argv: List[str], fix: str) -> Callable[[], bool]:
    def run() -> bool:
        code = run_command(argv)
        if code != 0:
            raise StageFailed(name, code, fix)
        return True

    return run


def use_feature_store(s: PipelineSettings, cfgs: dict) -> tuple:
    """(use it?, why): on a CPU always (the target runs once per row instead of once per step), on a
    GPU when training reads each row more than once; never a store that would fill the disk."""
    if s.store != "auto":
        return s.store == "true", f"store={s.store}"
    regen, train = cfgs["regen"], cfgs["train"]
    size, free = store_bytes(cfgs), free_bytes(s.root)
    if size > free / 2:
        return False, (f"a store of these rows would take up to {size / 2**30:.0f} GiB, more than half the "
                       f"{free / 2**30:.0f} GiB free: features captured online")
    if not commands.on_cuda():
        return True, "no GPU: the target runs once per row instead of once per step"
    loop = train.train
    rows_read = loop.max_steps * loop.micro_batch_size * loop.grad_accum * s.nproc * int(s.torchrun.get("nnodes", 1))
    if rows_read > regen.num_train:
        return True, f"training reads {rows_read} rows of {regen.num_train}: each more than once"
    return False, f"training reads {rows_read} rows of {regen.num_train}: each at most once, features captured online"


def store_bytes(cfgs: dict) -> float:
    """At most: every row at its longest (prompt and reply caps) x the features' width x the storage dtype."""
    from blockdraft.models.resolve import resolve_layer_ids
    from blockdraft.models.target_families import load_text_config

    regen, capture = cfgs["regen"], cfgs["capture"]
    config = load_text_config(capture.target.path)
    width = len(resolve_layer_ids(capture.draft, config)) * int(config.hidden_size)
    tokens = regen.num_train * (regen.max_prompt_tokens + regen.max_tokens * regen.max_turns)
    return float(tokens * width * (4 if capture.storage_dtype == "float32" else 2))


def free_bytes(out: Path) -> float:
    existing = next(p for p in (out, *out.parents) if p.exists())
    return float(shutil.disk_usage(existing).free)


def capture_reads(cfg) -> dict:
    """What the store's content depends on (its identity), so a change elsewhere in the recipe trains
    again from the same store instead of capturing it again."""
    from blockdraft.models.resolve import resolve_layer_ids
    from blockdraft.models.target_families import load_text_config

    return {
        "target": dataclasses.asdict(cfg.target), "data": dataclasses.asdict(cfg.data),
        "layers": resolve_layer_ids(cfg.draft, load_text_config(cfg.target.path)),
        "teacher": [cfg.train.kl_weight, cfg.train.teacher_top_k], "dtype": [cfg.train.dtype, cfg.compute_dtype],
        "storage": [cfg.storage_dtype, cfg.rows_per_shard],
    }


def pipeline_stages(s: PipelineSettings, cfgs: dict) -> List[Stage]:
    from blockdraft.train.checkpoint import complete_checkpoints

    p = s.paths()
    use_store, why = use_feature_store(s, cfgs)
    train_argv = commands.stage_argv("train", s, use_store)

    def train() -> bool:
        argv = list(train_argv)
        if not complete_checkpoints(p["run"]):
            argv.append("overwrite=true")  # a run killed before its first checkpoint has nothing to resume
        return command_stage("train", argv, "fix what it says, then rerun: it resumes from the last checkpoint")()

    def serve() -> bool:
        p["report"].unlink(missing_ok=True)  # a report left from an earlier run must not pass for this one
        code = run_command(commands.stage_argv("serve", s, use_store))
        if not p["report"].is_file():
            raise StageFailed("serve", code, f"see the vLLM logs under {p['report'].parent}")
        # A finished check is cached even when it failed (the report says why); a stopped one is not.
        return not json.loads(p["report"].read_text()).get("incomplete", True)

    train_inputs = {k: v for k, v in dataclasses.asdict(cfgs["train"]).items() if k not in ("resume", "overwrite")}
    stages = [
        Stage("regen", {"target": commands.target_fingerprint(s.target), "argv": commands.regen_overrides(s)},
              command_stage("regen", commands.stage_argv("regen", s, use_store), "rerun: it resumes after the rows already written"),
              lambda: p["train_rows"].is_file() and p["heldout_rows"].is_file(), p["train_rows"].parent),
        Stage("capture", {"reads": capture_reads(cfgs["capture"])},
              command_stage("capture", commands.stage_argv("capture", s, use_store), "rerun: it resumes at the first unfinished shard"),
              lambda: (p["store"] / "index.json").is_file(), p["store"], wipe=p["store"],
              skip_reason=None if use_store else why),
        Stage("train", {"config": train_inputs, "store": use_store, "launch": train_argv[:train_argv.index("blockdraft.train")]},
              train, lambda: bool(complete_checkpoints(p["run"])), p["run"], wipe=p["run"]),
        Stage("export", {"argv": commands.export_overrides(s)},
              command_stage("export", commands.stage_argv("export", s, use_store), "see the export's message above"),
              lambda: (p["export"] / "config.json").is_file(), p["export"]),
        Stage("gate", {"argv": commands.gate_words(s)} if s.gate else {},
              command_stage("gate", commands.stage_argv("gate", s, use_store), f"its verdict is in {p['gate']}"),
              lambda: p["gate"].is_file(), p["gate"], skip_reason=None if s.gate else "gate=false"),
        Stage("serve", {"argv": commands.serve_overrides(s)}, serve, lambda: p["report"].is_file(), p["report"]),
    ]
    if use_store:
        say(f"training from a feature store ({why})")
    return stages


def run_stages(stages: List[Stage], records: StageRecords, force: List[str], awaited: tuple = (),
               poll_s: float = 10.0) -> Dict[str, float]:
    """Each stage in order; a stage that ran makes every later one run too. Returns seconds per stage run.
    An `awaited` stage is another process's to run (node 0's, for a node of rank > 0 on a shared file
    system): this one waits until its record says it finished with the same inputs."""
    chain: dict = {}
    spent: Dict[str, float] = {}
    for stage in stages:
        chain = {**chain, stage.name: stage.inputs if stage.skip_reason is None else {"skipped": True}}
        key = stage_key(chain)
        if stage.skip_reason is not None:
            say(f"{stage.name}: not run ({stage.skip_reason})")
            continue
        if stage.name in awaited:
            began = time.monotonic()
            while not records.reload().finished(stage.name, key):
                say(f"{stage.name}: waiting for node 0 to finish it ({time.monotonic() - began:.0f} s)")
                time.sleep(poll_s)
            continue
        fresh = stage.name in force or any(spent.values())
        if not fresh and records.finished(stage.name, key) and stage.present():
            then = records.records[stage.name]
            say(f"{stage.name}: cached (finished {then['at']}, {then['seconds']:.0f} s then); skipped")
            continue
        if stage.wipe is not None and records.started_with(stage.name) not in (None, key):
            shutil.rmtree(stage.wipe, ignore_errors=True)  # another recipe or other data: not resumed
        print(f"\n[pipeline] === {stage.name} ===", flush=True)
        began = time.perf_counter()
        records.mark(stage.name, key, done=False)
        done = stage.run()
        spent[stage.name] = time.perf_counter() - began
        records.mark(stage.name, key, done=done, seconds=spent[stage.name])
        say(f"{stage.name}: done in {spent[stage.name]:.0f} s")
    return spent


def summarize(stages: List[Stage], records: StageRecords, spent: Dict[str, float], wall: float, report: Path) -> int:
    print("\n[pipeline] ================= stages =================")
    for stage in stages:
        if stage.skip_reason is not None:
            print(f"  {stage.name:<8} not run ({stage.skip_reason})")
            continue
        then = records.records.get(stage.name, {}).get("seconds") or 0.0
        note = f"{spent[stage.name]:.0f} s" if stage.name in spent else f"cached ({then:.0f} s when it ran)"
        print(f"  {stage.name:<8} {note:<28} {stage.artifact}")
    print(f"  total    {wall:.0f} s this run")
    from blockdraft.machine import describe

    print(f"  machine  {describe()}")
    result = json.loads(report.read_text())
    print("\n[pipeline] ================= report =================")
    from blockdraft.serve.report import print_table

    print_table(result)
    return 0 if result.get("passed") else 1

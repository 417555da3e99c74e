"""`python -m blockdraft.pipeline` (`blockdraft pipeline`): from a target to a draft proven in vLLM.

    blockdraft pipeline target=<HF dir> out=<dir> [prompts=sharegpt|tiny|<rows>] [experiment=<recipe>]
        [gate=true] [round_cost=true|false] [store=auto|true|false] [force=[train,serve]] [<stage>.<key>=value ...]
    blockdraft pipeline target=<HF dir> out=<dir> rows=<rows already answered> [heldout_rows=<rows>] ...

gate     (gate=true) the one-sample gate, first: does this target and serving stack serve the draft as
         training computes it? A failing verdict stops the run before the long stages, with the fix
(probe)  this machine's round cost with an untrained draft of the recipe's shape, and so the mean
         acceptance length the draft needs to pay here (round_cost=false skips it; recorded per machine)
regen    the target answers the prompts (vLLM where it can): <out>/regen/{train,heldout}.jsonl; with rows=,
         given: the held-out rows (heldout_rows=, or regen.num_heldout carved out by prompt content) kept apart
capture  the target's features of those rows, once (when training uses a feature store)
train    the recipe on the regenerated rows (torchrun when train.nproc or train.nnodes > 1)
export   the last checkpoint as a vLLM draft directory (float32 on a CPU, where vLLM serves fp32)
serve    the smoke-serve check on the held-out prompts: lossless, draft active, acceptance, speedup

Overrides: regen.*, capture.*, export.*, gate.*, serve.* are those apps' own keys (see their
--help); train.nproc, train.nnodes, train.node_rank, train.rdzv_endpoint, train.max_restarts go to
torchrun (several processes train elastically: a rank that dies restarts the group, which resumes
from the last checkpoint, up to train.max_restarts times, 3 by default); every other key (train.*,
draft.*, optim.*, data.*, draft=<kind>, optim=muon, ...) is a training override given unchanged to
the capture and to training. A key no stage knows is refused before
any work. Each stage's record is in <out>/stages.json: a rerun prints `cached` for a stage whose
output-changing inputs did not change (speed, logging and progress keys are in no key) and reruns
only what a changed setting affects; an interrupted stage resumes; a larger train.max_steps or
train.max_minutes continues the run. Nothing finished is deleted: what a stage made with other inputs (or under
force=) is moved to <out>/superseded/<stage>-<time>/ first. On several nodes, run the same
command on each with its train.node_rank: node 0 runs every stage and writes the records, the
others wait for its rows on the shared file system (node_wait_minutes, 1440 by default) and join
training; a failure of node 0 stops them with its reason.

Exit status: 0 the serve check passed; 1 it failed or a stage failed (the message says which);
2 refused before any work; 130 interrupted (rerun the same command to resume).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

from blockdraft.errors import ConfigError
from blockdraft.out_lock import OutLock
from blockdraft.pipeline import commands
from blockdraft.pipeline.gate_stage import gate_stage, gate_verdict
from blockdraft.pipeline.given_rows import absolute_source, inspect_given
from blockdraft.pipeline.process import StageFailed, say
from blockdraft.pipeline.prompt_supply import check_prompt_supply
from blockdraft.pipeline.records import StageRecords
from blockdraft.pipeline.round_cost import early_round_cost
from blockdraft.pipeline.runner import NodeZeroFailed, Stage, run_stages, summarize
from blockdraft.pipeline.serve_prompts import check_serve_prompts
from blockdraft.pipeline.settings import PipelineSettings, check_settings, keys_help, parse_overrides
from blockdraft.pipeline.stages import decide_store, pipeline_stages
from blockdraft.pipeline.train_stage import train_batches


def prepare(s: PipelineSettings) -> dict:
    """Every check that needs no work: the pipeline's keys, then each stage app composed with its overrides."""
    # Stages run as commands from the repository and compose configs in this process: absolute paths mean the same to both.
    s.target = str(Path(s.target).absolute()) if s.target else s.target
    s.out = str(Path(s.out).absolute()) if s.out else s.out
    s.rows, s.heldout_rows = absolute_source(s.rows), absolute_source(s.heldout_rows)
    check_settings(s)
    cfgs = commands.composed(s)
    if s.rows:
        cfgs["given"] = inspect_given(s.rows, s.heldout_rows, cfgs["regen"].num_heldout)
        note_unused_regen_keys(s)
    else:
        check_prompt_supply(cfgs["regen"], cfgs["train"])
    check_serve_prompts(cfgs)
    return cfgs


def note_unused_regen_keys(s: PipelineSettings) -> None:
    """With rows= no regen runs: its keys shape nothing (regen.num_heldout still sizes a carved held-out set)."""
    used = () if s.heldout_rows else ("num_heldout",)
    unused = [f"regen.{w}" for w in s.regen if w.lstrip("+~").split("=")[0] not in used]
    if unused:
        say(f"note: rows= starts from rows already answered, so no regen runs and {' '.join(unused)} shape nothing")


def run_pipeline(s: PipelineSettings, before: Optional[List[Stage]] = None) -> int:
    """`before`: a preset's own stages, run first (the demo prepares its target, which the checks then read).
    Their results reach the later stages' keys through what those read (the target's files).
    Node 0 (or the only node) runs every stage and is the only writer of stages.json; a node of rank > 0
    follows its records, joins its training, and exits once training is done."""
    began = time.perf_counter()
    s.out = str(Path(s.out).absolute()) if s.out else s.out
    if not s.out:
        check_settings(s)  # says what is missing
    follower = s.node_rank > 0
    # Node 0 (or the only node) is the one writer of <out>: a second pipeline on it is refused here, before any
    # work; the stages take their own locks in their own directories below it. Nodes of rank > 0 only read it.
    lock = None if follower else OutLock(s.root, app="pipeline", remedy=PIPELINE_REMEDY).acquire()
    try:
        return _run_pipeline(s, before, began, follower)
    finally:
        if lock is not None:
            lock.release()


# What a second pipeline on the same out is told to do (the holder's pid and host filled in).
PIPELINE_REMEDY = ("Wait for that pipeline to end, or stop it (kill {pid} on {host}: its stage saves what it can and "
                   "stages.json says where it stopped) and rerun the same command, which resumes; for a separate run "
                   "use another out=")


def _run_pipeline(s: PipelineSettings, before: Optional[List[Stage]], began: float, follower: bool) -> int:
    records = StageRecords(s.root / "stages.json", writer=not follower)
    waits = dict(follower=follower, wait_s=s.node_wait_minutes * 60)
    spent = run_stages(before or [], records, s.force, s.root, **waits)
    cfgs = prepare(s)
    use_store, why = decide_store(s, cfgs, records, **waits)
    stages = pipeline_stages(s, cfgs, use_store, why, records)
    if follower:
        run_stages([st for st in stages if st.name in ("regen", "capture", "train")], records, s.force, s.root, **waits)
        say(f"node {s.node_rank}: training done; node 0 exports and serves")
        return 0
    # Minutes before hours: a target or serving stack that cannot serve the draft stops the run here, in a
    # chain of its own (no later stage's key holds the gate's).
    gate = gate_stage(s, cfgs)
    spent.update(run_stages([gate], records, s.force, s.root))
    gate_verdict(s)
    if s.round_cost:
        early_round_cost(s, cfgs, records)
    spent.update(run_stages(stages, records, s.force, s.root))
    return summarize([*(before or []), gate, *stages], records, spent, time.perf_counter() - began, s.paths()["report"])


def print_config(s: PipelineSettings) -> None:
    """`--cfg job`: what each stage would run, composed and checked, without running anything."""
    from omegaconf import OmegaConf

    cfgs = prepare(s)
    records = StageRecords(s.root / "stages.json", writer=False)
    use_store, why = decide_store(s, cfgs, records)
    batch = train_batches(s, cfgs["train"], use_store, records)[0]  # the continued run's, where there is one
    print(f"# feature store: {'yes' if use_store else 'no'} ({why})")
    if s.gate:
        print(f"# --- gate, before the long stages: {' '.join(commands.stage_argv('gate', s, use_store)[1:])}")
    if s.rows:
        carve = f"regen.num_heldout={cfgs['regen'].num_heldout} carved out by prompt content"
        print(f"# --- regen: given, rows={s.rows} ({cfgs['given'].count} rows), held out: {s.heldout_rows or carve}")
    for stage in ("regen", "capture", "train", "export", "serve")[1 if s.rows else 0:]:
        print(f"# --- {stage}: {' '.join(commands.stage_argv(stage, s, use_store, batch.words())[1:])}")
        print(OmegaConf.to_yaml(OmegaConf.structured(cfgs[stage])))


def main(argv: List[str], base: Optional[PipelineSettings] = None, before: Optional[List[Stage]] = None,
         doc: str = __doc__) -> int:
    from blockdraft.config.cfg_flag import split_cfg_job

    if any(a in ("-h", "--help") for a in argv):
        print(f"{doc.strip()}\n\n{keys_help(base or PipelineSettings())}")
        return 0
    try:
        argv, show_config = split_cfg_job(argv, "what each stage would run, composed")
        settings = parse_overrides(argv, base)
        if show_config:
            print_config(settings)
            return 0
        return run_pipeline(settings, before)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (StageFailed, NodeZeroFailed) as err:
        print(f"[pipeline] {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("[pipeline] interrupted; rerun the same command to resume where it stopped", file=sys.stderr)
        return 130

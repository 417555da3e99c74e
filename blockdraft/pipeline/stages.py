"""The pipeline's stages: each one's command, key, artifact and what is moved aside before it runs again,
and the feature store choice, made once per `out`."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import List, Optional

from blockdraft.pipeline import commands, keys
from blockdraft.pipeline.process import StageFailed, command_stage, readable_result, run_command, say
from blockdraft.pipeline.records import StageRecords
from blockdraft.pipeline.runner import NodeZeroFailed, Stage
from blockdraft.pipeline.settings import PipelineSettings
from blockdraft.pipeline.train_stage import train_stage


def use_feature_store(s: PipelineSettings, cfgs: dict) -> tuple:
    """(use it?, why): on a CPU always (the target runs once per row instead of once per step), on a
    GPU when training reads each row more than once; never a store that would fill the disk."""
    if s.store != "auto":
        return s.store == "true", f"store={s.store}"
    train, (rows, _) = cfgs["train"], planned_rows(cfgs)
    size, free = store_bytes(cfgs), free_bytes(s.root)
    if size > free / 2:
        return False, (f"a store of these rows would take up to {size / 2**30:.0f} GiB, more than half the "
                       f"{free / 2**30:.0f} GiB free: features captured online")
    if not commands.on_cuda():
        return True, "no GPU: the target runs once per row instead of once per step"
    loop = train.train
    rows_read = loop.max_steps * loop.micro_batch_size * loop.grad_accum * s.nproc * int(s.torchrun.get("nnodes", 1))
    if rows_read > rows:
        return True, f"training reads {rows_read} rows of {rows}: each more than once"
    return False, f"training reads {rows_read} rows of {rows}: each at most once, features captured online"


def planned_rows(cfgs: dict) -> tuple:
    """(training rows, the most tokens one can hold): regen's count and caps, or for given rows their count
    (all of them, an upper bound) at the recipe's data.seq_length, where training cuts them."""
    given, regen = cfgs.get("given"), cfgs["regen"]
    if given is not None:
        return given.count, int(cfgs["train"].data.seq_length)
    return regen.num_train, regen.max_prompt_tokens + regen.max_tokens * regen.max_turns


def decide_store(s: PipelineSettings, cfgs: dict, records: StageRecords, follower: bool = False,
                 wait_s: float = 86400.0, poll_s: float = 10.0) -> tuple:
    """store=auto is decided once per `out` and recorded: the store itself takes the free disk the first
    decision measured, so deciding again could flip it and train anew. Another node takes node 0's; a
    reader that writes nothing (`--cfg job`) decides without recording."""
    if s.store != "auto":
        return use_feature_store(s, cfgs)
    if not follower:
        recorded = records.choice("store")
        if recorded is None:
            use, why = use_feature_store(s, cfgs)
            if records.writer:
                records.choose("store", {"use": use, "why": why, "at": time.strftime("%Y-%m-%d %H:%M:%S")})
            return use, why
    else:
        deadline = time.monotonic() + wait_s
        while (recorded := records.reload().choice("store")) is None:
            if time.monotonic() > deadline:
                raise NodeZeroFailed("node 0 never recorded its store=auto choice in stages.json; check node 0, then rerun")
            time.sleep(poll_s)
    return recorded["use"], f"{recorded['why']}; store=auto as decided for this out on {recorded['at']}"


def store_bytes(cfgs: dict) -> float:
    """At most: every row at its longest (prompt and reply caps) x the features' width x the storage dtype."""
    from blockdraft.models.resolve import resolve_layer_ids
    from blockdraft.models.target_families import load_text_config

    capture, (rows, row_tokens) = cfgs["capture"], planned_rows(cfgs)
    config = load_text_config(capture.target.path)
    width = len(resolve_layer_ids(capture.draft, config)) * int(config.hidden_size)
    tokens = rows * row_tokens
    return float(tokens * width * (4 if capture.storage_dtype == "float32" else 2))


def free_bytes(out: Path) -> float:
    existing = next(p for p in (out, *out.parents) if p.exists())
    return float(shutil.disk_usage(existing).free)


def pipeline_stages(s: PipelineSettings, cfgs: dict, use_store: bool, why: str,
                    records: Optional[StageRecords] = None) -> List[Stage]:
    """`records`: the train stage continues a recorded run with its global batch (train_stage.py); a refusal
    that it cannot is raised here, before any stage runs."""
    from blockdraft.models.target_fingerprint import target_fingerprint

    p = s.paths()

    def serve() -> bool:
        p["report"].unlink(missing_ok=True)  # a report left from an earlier run must not pass for this one
        code = run_command(commands.stage_argv("serve", s, use_store))
        report = readable_result(p["report"])
        if report is None:
            raise StageFailed("serve", code, f"it wrote no readable report; see the vLLM logs under {p['report'].parent}")
        # A finished check is cached even when it failed (the report says why); a stopped one is not.
        if report.get("incomplete", True):
            return False
        if code not in (0, 1):  # a finished report, then a crash: not a result to cache
            raise StageFailed("serve", code, f"it exited {code} after its report; see the vLLM logs under {p['report'].parent}")
        return True

    regen = (given_stage(s, cfgs) if s.rows else
             Stage("regen", keys.regen_inputs(s, cfgs["regen"], target_fingerprint(s.target)),
                   command_stage("regen", commands.stage_argv("regen", s, use_store), "rerun: it resumes after the rows already written"),
                   lambda: p["train_rows"].is_file() and p["heldout_rows"].is_file(), p["train_rows"].parent,
                   moves=p["train_rows"].parent))
    stages = [
        regen,
        Stage("capture", keys.capture_inputs(s, cfgs["capture"]) if use_store else {},
              command_stage("capture", commands.stage_argv("capture", s, use_store), "rerun: it resumes at the unfinished shards, on any train.nproc"),
              lambda: (p["store"] / "index.json").is_file(), p["store"], moves=p["store"],
              skip_reason=None if use_store else why,
              joined=not commands.capture_through_vllm(s)),  # every node's ranks capture, as they train
        train_stage(s, cfgs["train"], use_store, records),
        Stage("export", keys.export_inputs(s, cfgs["export"]),
              command_stage("export", commands.stage_argv("export", s, use_store), "see the export's message above"),
              lambda: (p["export"] / "config.json").is_file(), p["export"], moves=p["export"]),
        Stage("serve", keys.serve_inputs(s, cfgs["serve"]), serve, lambda: readable_result(p["report"]) is not None, p["report"],
              moves=p["report"].parent),
    ]
    if use_store:
        say(f"training from a feature store ({why})")
    return stages


def given_stage(s: PipelineSettings, cfgs: dict) -> Stage:
    """The regen stage of a run given its rows: recorded as given, keyed by their content, and making only
    the split (pipeline/given_split.py): the held-out rows, and the training ones when carved."""
    from blockdraft.pipeline.given_split import GIVEN_NAME, write_given_split

    p, given, num_heldout = s.paths(), cfgs["given"], cfgs["regen"].num_heldout
    out = p["heldout_rows"].parent

    def run() -> bool:
        say(f"regen: given rows={given.rows}; held out: "
            f"{given.heldout_rows or f'regen.num_heldout={num_heldout} prompts carved out by their content'}")
        account = write_given_split(given.rows, given.heldout_rows, num_heldout, out, say)
        say(f"regen: {account['train']} training rows, {account['heldout']} held out, no prompt in both")
        return True

    made = [out / GIVEN_NAME, p["heldout_rows"], *([] if given.heldout_rows else [p["train_rows"]])]
    return Stage("regen", keys.given_inputs(s, given, num_heldout), run,
                 lambda: all(f.exists() for f in made), out, moves=out)

"""Before the long stages: can a draft pay on this machine at all?

A draft-and-verify round yields the draft's mean acceptance length in tokens and costs some
number of plain decode steps; the speedup is about their ratio. The round cost depends on the
machine (1.01 plain steps on one 2-core CPU, 1.42 on another of the same kind) and on the draft's
shape, not on its training: so it is measured here, in one to two minutes on a 2-core CPU, with an
untrained draft of the recipe's shape served by the same harness as the serve stage (both servers
loading side by side, a few short prompts interleaved), and the pipeline prints the acceptance
length the trained draft will need. The figure is kept per machine, vLLM, target and draft shape
(round_cost_record.py): a later pipeline on this machine, in any `out`, reads it instead of
measuring again. It is no stage of the chain, so it never makes a stage after it run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from blockdraft.pipeline import round_cost_record
from blockdraft.pipeline.process import run_command, say
from blockdraft.pipeline.records import StageRecords
from blockdraft.pipeline.settings import PipelineSettings

CHOICE = "round_cost"
# Four greedy prompts of 64 tokens a side, generated to their end, after one of warm-up: four pairs give the
# report's paired interval; an untrained draft is rejected at once, so each round yields one token and 256
# tokens a side are 256 rounds. (32 tokens a side gave an interval of 1.19 to 1.56 on a 2-core Xeon.)
PROBE_SETTINGS = ["prompts=tiny", "num_prompts=4", "max_tokens=64", "ignore_eos=true", "rounds=1",
                  "min_acceptance_length=null", "overwrite=true", "warmup_prompts=1"]
# What the probe takes of the user's serve overrides: how vLLM runs, not what it is asked.
PASSED_ON = ("vllm_python", "device", "kv_cache_gib", "max_num_seqs", "extra_vllm_args", "servers",
             "startup_timeout_s", "request_timeout_s", "num_speculative_tokens")
# Of those, what changes the figure (where the interpreter is and how long to wait do not).
KEYED = ("device", "kv_cache_gib", "max_num_seqs", "extra_vllm_args", "num_speculative_tokens")


def early_round_cost(s: PipelineSettings, cfgs: dict, records: StageRecords) -> Optional[float]:
    """The machine's round cost for this recipe's draft shape (measured once per machine, then read from
    the machine's record), printed with the acceptance length a draft needs to pay; None where it cannot be
    measured."""
    from blockdraft.machine import machine_facts
    from blockdraft.models.target_fingerprint import target_fingerprint
    from blockdraft.pipeline.records import stage_key

    serve = cfgs["serve"]
    if serve.engine == "reference":
        say("round cost: not measured (serve.engine=reference: the reference engine is a check, not a speed)")
        return None
    parts = {"machine": round_cost_record.machine_part(machine_facts()),
             "serving": round_cost_record.serving_stack(serve.vllm_python_path()),
             "target": target_fingerprint(s.target), "draft": _shape(cfgs["train"]),
             "serve": [w for w in s.serve if w.split("=")[0] in KEYED], "probe": PROBE_SETTINGS}
    key = stage_key(parts)
    recorded = round_cost_record.read(key)
    if recorded:
        cost = recorded.get("round_cost")
        stack = ", ".join(f"{name} {version}" for name, version in (parts["serving"] or {}).items())
        say(f"round cost: {_line(cost, recorded.get('interval'))} (measured {recorded['at']} on this machine with {stack or 'this serving stack'}; "
            f"kept in {round_cost_record.record_path()})")
        if records.writer:
            records.choose(CHOICE, {**recorded, "key": key, "seconds": 0.0, "reused": True})
        return cost
    began = time.perf_counter()
    cost, interval = _measure(s, cfgs)
    entry = {"round_cost": cost, "interval": interval, "seconds": time.perf_counter() - began, **parts}
    if cost is not None:
        round_cost_record.write(key, entry)
    if records.writer:
        records.choose(CHOICE, {**entry, "key": key, "at": time.strftime("%Y-%m-%d %H:%M:%S"), "reused": False})
    say(f"round cost: {_line(cost, interval)} (measured in {entry['seconds']:.0f} s)")
    return cost


def _line(cost: Optional[float], interval: Optional[list] = None) -> str:
    if cost is None:
        return "could not be measured here (see the probe's report above); the serve stage measures it again"
    spread = f" (95% interval {interval[0]:.2f} to {interval[1]:.2f})" if interval else ""
    return (f"a draft-and-verify round costs {cost:.2f} plain decode steps{spread} on this machine with this draft's "
            f"shape: the trained draft pays only with a mean acceptance length above {cost:.2f} "
            f"(a speedup of about acceptance / {cost:.2f})"
            + ("; below 1.0 the probe measured a phase slow: distrust it" if interval and interval[1] < 1.0 else ""))


def _shape(train_cfg) -> dict:
    """What decides a round's cost: the draft's kind, size and block, not its weights."""
    from dataclasses import asdict

    draft = asdict(train_cfg.draft)
    return {k: draft.get(k) for k in ("kind", "num_layers", "block_size", "draft_vocab_size", "target_layer_ids",
                                      "num_speculative_tokens")}


def _measure(s: PipelineSettings, cfgs: dict) -> tuple:
    """(round cost, its paired interval) from the probe's report; (None, None) where it wrote none."""
    from blockdraft.pipeline import commands

    root = s.root / "round_cost"
    say(f"round cost: serving an untrained draft of the recipe's shape on {root} (two vLLM servers loading side by "
        "side, then 4 short prompts a side: one to two minutes on a 2-core CPU; kept for later runs on this machine)")
    export = write_untrained_export(cfgs["train"], s.target, root)
    passed = [w for w in s.serve if w.split("=")[0] in PASSED_ON]
    argv = [commands.python(), "-m", "blockdraft.serve", f"draft_dir={export}", f"target_dir={s.target}",
            f"out={root / 'serve'}", *PROBE_SETTINGS, *passed]
    # Its report's verdict and pay line are about an untrained draft: only the round cost is read, and the
    # terminal shows the one line below instead of that table.
    log = root / "probe.log"
    run_command(argv, log=log)
    report = root / "serve" / "report.json"
    if not report.is_file():
        say(f"round cost: the probe wrote no report; its output is in {log}")
        return None, None
    result = json.loads(report.read_text())
    return result.get("round_cost"), result.get("round_cost_interval")


def write_untrained_export(train_cfg, target: str, root: Path) -> Path:
    """The recipe's draft with its initial weights, exported as the export stage would (float32 on a CPU)."""
    import torch

    from blockdraft.export.writer import export_draft
    from blockdraft.models import build_draft
    from blockdraft.models.io import save_draft
    from blockdraft.models.resolve import resolve_draft_config
    from blockdraft.models.target import special_token_ids
    from blockdraft.models.target_families import load_text_config
    from blockdraft.pipeline.commands import on_cuda
    from transformers import AutoTokenizer

    config = load_text_config(target)
    draft_cfg = resolve_draft_config(train_cfg.draft, config, special_token_ids(config, AutoTokenizer.from_pretrained(target)))
    torch.manual_seed(0)
    step_dir = root / "untrained" / "checkpoints" / "step_0"
    save_draft(step_dir, build_draft(draft_cfg))
    (step_dir / "config.yaml").write_text(f"target:\n  path: {target}\n")
    return export_draft(step_dir, root / "export", dtype="bfloat16" if on_cuda() else "float32", target_dir=target,
                        overwrite=True)

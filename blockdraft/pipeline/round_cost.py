"""Before the long stages: can a draft pay on this machine at all?

A draft-and-verify round yields the draft's mean acceptance length in tokens and costs some
number of plain decode steps; the speedup is about their ratio. The round cost depends on the
machine (1.01 plain steps on one 2-core CPU, 1.42 on another of the same kind) and on the draft's
shape, not on its training: so it is measured here, in minutes, with an untrained draft of the
recipe's shape served by the same harness as the serve stage, and the pipeline prints the
acceptance length the trained draft will need. Recorded in stages.json per machine, target and
draft shape; it is no stage of the chain, so it never makes a stage after it run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from blockdraft.pipeline.process import run_command, say
from blockdraft.pipeline.records import StageRecords
from blockdraft.pipeline.settings import PipelineSettings

CHOICE = "round_cost"
# A few greedy prompts generated to their end: enough rounds for a steady ratio (an untrained draft
# is rejected at once, so each round yields one token).
PROBE_SETTINGS = ["prompts=tiny", "num_prompts=2", "max_tokens=64", "ignore_eos=true", "rounds=1",
                  "min_acceptance_length=null", "overwrite=true", "warmup_prompts=1"]
# What the probe takes of the user's serve overrides: how vLLM runs, not what it is asked.
PASSED_ON = ("vllm_python", "device", "kv_cache_gib", "max_num_seqs", "extra_vllm_args", "servers",
             "startup_timeout_s", "request_timeout_s", "num_speculative_tokens")


def early_round_cost(s: PipelineSettings, cfgs: dict, records: StageRecords) -> Optional[float]:
    """The machine's round cost for this recipe's draft shape (measured once, then read from the
    record), printed with the acceptance length a draft needs to pay; None where it cannot be measured."""
    from blockdraft.machine import machine_facts
    from blockdraft.models.target_fingerprint import target_fingerprint
    from blockdraft.pipeline.records import stage_key

    serve = cfgs["serve"]
    if serve.engine == "reference":
        say("round cost: not measured (serve.engine=reference: the reference engine is a check, not a speed)")
        return None
    facts = machine_facts()
    key = stage_key({"machine": {k: facts[k] for k in ("cpu_model", "cores", "avx512f", "avx512_bf16", "amx", "gpu")},
                     "target": target_fingerprint(s.target), "draft": _shape(cfgs["train"]),
                     "serve": [w for w in s.serve if w.split("=")[0] in PASSED_ON]})
    recorded = records.choice(CHOICE)
    if recorded and recorded.get("key") == key:
        cost = recorded.get("round_cost")
        say(f"round cost: {_line(cost)} (measured {recorded['at']}; recorded in stages.json)")
        return cost
    began = time.perf_counter()
    cost = _measure(s, cfgs)
    if records.writer:
        records.choose(CHOICE, {"key": key, "round_cost": cost, "at": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "seconds": time.perf_counter() - began})
    say(f"round cost: {_line(cost)}")
    return cost


def _line(cost: Optional[float]) -> str:
    if cost is None:
        return "could not be measured here (see the probe's report above); the serve stage measures it again"
    return (f"a draft-and-verify round costs {cost:.2f} plain decode steps on this machine with this draft's "
            f"shape: the trained draft pays only with a mean acceptance length above {cost:.2f} "
            f"(a speedup of about acceptance / {cost:.2f})"
            + ("; below 1.0 the probe measured a phase slow: distrust it" if cost < 1.0 else ""))


def _shape(train_cfg) -> dict:
    """What decides a round's cost: the draft's kind, size and block, not its weights."""
    from dataclasses import asdict

    draft = asdict(train_cfg.draft)
    return {k: draft.get(k) for k in ("kind", "num_layers", "block_size", "draft_vocab_size", "target_layer_ids",
                                      "num_speculative_tokens")}


def _measure(s: PipelineSettings, cfgs: dict) -> Optional[float]:
    from blockdraft.pipeline import commands

    root = s.root / "round_cost"
    say(f"round cost: serving an untrained draft of the recipe's shape on {root} (two vLLM start-ups: about 2 minutes on a 2-core CPU)")
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
        return None
    return json.loads(report.read_text()).get("round_cost")


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

"""The reference engine with the demo draft against target-only greedy decoding, on SmolLM2-135M.

    .venv/bin/python scripts/bench/bench_engine_smollm2.py [--num-prompts 8] [--max-tokens 128]

Both decode the same held-out prompts (the demo's heldout.jsonl, chat template applied)
with the same target in transformers (fp32, CPU, batch size 1); the speculative run must
produce the very same tokens. Prints tokens/s of each, the speedup, the mean acceptance
length and the acceptance per position, and writes them to docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

from publish import command_line, provenance, publish


def load(args):
    import torch
    from transformers import AutoTokenizer

    from blockdraft.draft_format.importer import import_draft
    from blockdraft.engine.decoder import SpeculativeEngine
    from blockdraft.models.target import TargetModel
    from blockdraft.serve.prompts import encode_prompts, load_prompts

    draft, cfg = import_draft(args.draft)
    target = TargetModel.load(args.target, cfg.target_layer_ids, torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    prompts, _ = encode_prompts(load_prompts(args.prompts, args.num_prompts), tokenizer, True, 512 - args.max_tokens)
    engine = SpeculativeEngine(target, draft, eos_token_ids=[tokenizer.eos_token_id])
    return engine, prompts


def decode_all(engine, prompts, max_tokens: int) -> dict:
    """Target-only and speculative decoding of every prompt, timed; stops at the first mismatch."""
    totals = {"base_s": 0.0, "spec_s": 0.0, "tokens": 0, "steps": [], "k": engine.k, "prompts": len(prompts)}
    for i, prompt in enumerate(prompts):
        began = time.perf_counter()
        base = engine.target_generate(prompt.token_ids, max_tokens)
        totals["base_s"] += time.perf_counter() - began
        began = time.perf_counter()
        spec = engine.generate(prompt.token_ids, max_tokens)
        totals["spec_s"] += time.perf_counter() - began
        if spec.tokens != base.tokens:
            sys.exit(f"prompt {i} ({prompt.source}): speculative output differs from the target's; the engine is not lossless")
        totals["tokens"] += len(base.tokens)
        totals["steps"] += spec.stats.accepted_per_step
        print(f"  prompt {i + 1}/{len(prompts)}: {len(base.tokens)} tokens, identical", flush=True)
    return totals


def figures(t: dict) -> dict:
    steps, k = t["steps"], t["k"]
    return {
        "base_tps": t["tokens"] / t["base_s"], "spec_tps": t["tokens"] / t["spec_s"],
        "speedup": t["base_s"] / t["spec_s"], "accept_len": 1 + sum(steps) / max(1, len(steps)),
        "per_position": [sum(1 for m in steps if m > i) / max(1, len(steps)) for i in range(k)],
        "tokens": t["tokens"], "prompts": t["prompts"],
    }


def engine_section(f: dict, args, command: str) -> str:
    rows = [
        ("tokens/s, target alone (greedy)", f"{f['base_tps']:.1f}"),
        ("tokens/s, reference engine with the draft", f"{f['spec_tps']:.1f}"),
        ("speedup", f"{f['speedup']:.2f}x"),
        ("mean acceptance length", f"{f['accept_len']:.2f}"),
        ("acceptance per position", " ".join(f"{r:.2f}" for r in f["per_position"])),
        ("output identical to the target's", "yes, every token"),
        ("prompts / tokens generated", f"{f['prompts']} / {f['tokens']}"),
    ]
    table = "| figure | value |\n|---|---|\n" + "".join(f"| {a} | {b} |\n" for a, b in rows)
    setting = ("The project's reference engine (`blockdraft.engine`, transformers, fp32, batch size 1) with the "
               "demo draft, against the same target decoding alone, on the held-out prompts.\n")
    return provenance(command) + "\n" + setting + "\n" + table


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draft", default=".cache/demo/export")
    parser.add_argument("--target", default=".cache/targets/smollm2-135m-instruct")
    parser.add_argument("--prompts", default=".cache/demo/regen/heldout.jsonl")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    for path in (args.draft, args.target, args.prompts):
        if not Path(path).exists():
            sys.exit(f"{path} does not exist; run `make demo` first (it prepares the target, the rows and the export)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Before torch starts its threads: idle OpenMP threads sleep rather than spin, which keeps
    # timings sane on a 2-core machine where anything else is running.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    with torch.no_grad():
        engine, prompts = load(args)
        f = figures(decode_all(engine, prompts, args.max_tokens))
    body = engine_section(f, args, command_line())
    publish("engine", "Reference engine vs target-only greedy (SmolLM2-135M)", body)


if __name__ == "__main__":
    main()

"""Which way of keeping the serve stage's servers between rounds measures the speedup that fresh servers do.

    .venv/bin/python scripts/bench_serve_methods.py [--methods frozen fresh kept] [--rounds 3] [--num-prompts 16]
        [--draft .cache/demo/export] [--prompts .cache/demo/regen/heldout.jsonl]

Each method is one run of the serve harness (`python -m blockdraft.serve ... servers=<method>`) on the demo's
draft and held-out prompts, 128 tokens each, `--rounds` rounds with the two sides alternating: fresh (a new
baseline and draft server every round), frozen (one of each for every round, the idle one SIGSTOPped while the
other is measured) and kept (one of each, the idle one left running). Every server generates the warm-up
prompts before its first measured phase; the report gives the idle server's CPU seconds during each measured
phase, read from /proc. Needs `make demo` (its target, draft and held-out rows). One job at a time: run nothing
else on the cores meanwhile. Writes the `serve_methods` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_serve import REPO, command_line, provenance, shown_path, write_section

TARGET = REPO / ".cache" / "targets" / "smollm2-135m-instruct"


def serve(args, method: str, out: Path) -> tuple:
    started = time.monotonic()
    argv = [sys.executable, "-m", "blockdraft.serve", f"draft_dir={args.draft}", f"target_dir={TARGET}",
            f"prompts={args.prompts}", f"num_prompts={args.num_prompts}", "max_tokens=128", f"rounds={args.rounds}",
            f"servers={method}", f"out={out}"]
    print("$ " + " ".join(argv), flush=True)
    subprocess.run(argv, cwd=REPO, check=False)
    return json.loads((out / "report.json").read_text()), time.monotonic() - started


def row(method: str, report: dict, wall: float) -> str:
    rounds = report["rounds"]
    ratios = " / ".join(f"{r['speedup']:.3f}" for r in rounds)
    base = " / ".join(f"{r['tokens_per_s_baseline']:.2f}" for r in rounds)
    draft = " / ".join(f"{r['tokens_per_s_draft']:.2f}" for r in rounds)
    costs = " / ".join(f"{r['round_cost']:.2f}" for r in rounds)
    idle = report["idle_server_cpu_s"]
    idle_text = (f"{sum(idle.values()):.2f} ({min(idle.values()):.2f}-{max(idle.values()):.2f} a phase)" if idle
                 else "- (no idle server)")
    startups = [s for k, s in report["timings_s"].items() if k.startswith("startup_")]
    low, high = report["speedup_spread"]
    return (f"| {method} | **{report['speedup']:.3f}x** ({low:.3f}-{high:.3f}) | {ratios} | {base} | {draft} | {costs} "
            f"| {idle_text} | {len(startups)}, {sum(startups):.0f} s | {wall:.0f} | {report['lossless']} "
            f"| {report['mean_acceptance_length']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=["frozen", "fresh", "kept"], choices=["frozen", "fresh", "kept"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--draft", default=str(REPO / ".cache" / "demo" / "export"))
    parser.add_argument("--prompts", default=str(REPO / ".cache" / "demo" / "regen" / "heldout.jsonl"))
    args = parser.parse_args()
    for need in (TARGET / "config.json", Path(args.draft) / "config.json", Path(args.prompts)):
        if not need.is_file():
            sys.exit(f"{need} is missing: `make demo` writes the target, the draft and the held-out rows")
    rows, reports = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            reports[method], wall = serve(args, method, Path(tmp) / method)
            rows.append(row(method, reports[method], wall))
    table = ["| servers | speedup, median (spread) | per round | baseline tokens/s per round | draft tokens/s per round "
             "| round cost per round | idle server's CPU seconds in the measured phases | start-ups | stage seconds "
             "| lossless | accept_len |", "|---|---|---|---|---|---|---|---|---|---|---|"] + rows
    fresh = reports.get("fresh")
    notes = []
    if fresh:
        low, high = fresh["speedup_spread"]
        for method, report in reports.items():
            if method != "fresh":
                inside = low <= report["speedup"] <= high
                notes.append(f"{method}: median {report['speedup']:.3f}x against fresh {fresh['speedup']:.3f}x "
                             f"({report['speedup'] / fresh['speedup'] - 1:+.1%}), "
                             f"{'inside' if inside else 'outside'} the fresh rounds' spread {low:.3f}-{high:.3f}")
    body = ("\n".join(table) + f"\n\nThe draft `{shown_path(args.draft)}` on the first {args.num_prompts} prompts of "
            f"`{shown_path(args.prompts)}`, 128 tokens each, {args.rounds} rounds a method (baseline first in odd rounds), "
            f"the methods run one after another in the order above; {reports[args.methods[0]]['warmup_prompts']} "
            "warm-up prompts per server before its first measured phase; prefix caching off.\n\n"
            + "\n".join(f"- {n}" for n in notes))
    doc = write_section("serve_methods", "Serving: fresh, frozen or kept servers between rounds",
                        provenance(command_line()) + "\n" + body)
    print(body)
    print(f"written to {doc}")


if __name__ == "__main__":
    main()

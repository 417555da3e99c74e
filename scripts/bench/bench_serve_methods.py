"""Which way of keeping the serve stage's servers between rounds measures the speedup that fresh servers do.

    .venv/bin/python scripts/bench/bench_serve_methods.py [--methods frozen fresh kept] [--rounds 3] [--num-prompts 16]
        [--draft .cache/demo/export] [--prompts .cache/demo/regen/heldout.jsonl] [--out runs/serve_methods/pass2]
        [--earlier runs/serve_methods/pass1 ...]

Each method is one run of the serve harness (`python -m blockdraft.serve ... servers=<method>`) on the demo's
draft and held-out prompts, 128 tokens each, `--rounds` rounds with the two sides alternating: fresh (a new
baseline and draft server every round), frozen (one of each for every round, the idle one SIGSTOPped while the
other is measured) and kept (one of each, the idle one left running). Every server generates the warm-up
prompts before its first measured phase; the report gives the idle server's CPU seconds during each measured
phase, read from /proc. The methods run one after another, so drift of the machine falls on them unevenly: a
second pass in the reverse order (`--methods` reversed, `--earlier` naming the first pass's `--out`) puts every
method early and late, and the table gives each pass and all rounds together. Needs `make demo` (its target,
draft and held-out rows). One job at a time: run nothing else on the cores meanwhile. Writes the
`serve_methods` section of docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from publish import REPO, command_line, provenance, publish, shown_path

TARGET = REPO / ".cache" / "targets" / "smollm2-135m-instruct"


def serve(args, method: str, out: Path) -> tuple:
    started = time.monotonic()
    argv = [sys.executable, "-m", "blockdraft.serve", f"draft_dir={args.draft}", f"target_dir={TARGET}",
            f"prompts={args.prompts}", f"num_prompts={args.num_prompts}", "max_tokens=128", f"rounds={args.rounds}",
            f"servers={method}", f"out={out}"]
    print("$ " + " ".join(argv), flush=True)
    subprocess.run(argv, cwd=REPO, check=False)
    return json.loads((out / "report.json").read_text()), time.monotonic() - started


def row(method: str, report: dict, wall=None) -> str:
    wall = report["timings_s"]["total"] if wall is None else wall
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


def combined(method: str, reports: list) -> str:
    """All rounds of every pass of one method: the median of the rounds' speedups and their spread."""
    rounds = [r for report in reports for r in report["rounds"]]
    ratios = [r["speedup"] for r in rounds]
    costs = [r["round_cost"] for r in rounds]
    idle = [v for report in reports for v in report["idle_server_cpu_s"].values()]
    idle_text = f"{sum(idle):.2f} in all" if idle else "-"
    return (f"| {method}, all {len(rounds)} rounds | **{statistics.median(ratios):.3f}x** ({min(ratios):.3f}-{max(ratios):.3f}) "
            f"| | {statistics.median(r['tokens_per_s_baseline'] for r in rounds):.2f} (median) "
            f"| {statistics.median(r['tokens_per_s_draft'] for r in rounds):.2f} (median) | {statistics.median(costs):.2f} (median) "
            f"| {idle_text} | | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=["frozen", "fresh", "kept"], choices=["frozen", "fresh", "kept"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--draft", default=str(REPO / ".cache" / "demo" / "export"))
    parser.add_argument("--prompts", default=str(REPO / ".cache" / "demo" / "regen" / "heldout.jsonl"))
    parser.add_argument("--out", default=str(REPO / "runs" / "serve_methods" / "pass1"),
                        help="where this pass keeps each method's report (<out>/<method>/report.json)")
    parser.add_argument("--earlier", nargs="*", default=[], help="the --out of earlier passes, reported beside this one")
    args = parser.parse_args()
    for need in (TARGET / "config.json", Path(args.draft) / "config.json", Path(args.prompts)):
        if not need.is_file():
            sys.exit(f"{need} is missing: `make demo` writes the target, the draft and the held-out rows")
    passes = {}
    for number, earlier in enumerate(args.earlier, start=1):
        found = [json.loads(m.read_text()) for m in Path(earlier).glob("*/report.json")]
        passes[number] = {r["servers"]: (r, None) for r in sorted(found, key=lambda r: r["date"])}  # in the order run
    this = {}
    for method in args.methods:
        report, wall = serve(args, method, Path(args.out) / method)
        this[method] = (report, wall)
    passes[len(passes) + 1] = this
    table = ["| servers | speedup, median (spread) | per round | baseline tokens/s per round | draft tokens/s per round "
             "| round cost per round | idle server's CPU seconds in the measured phases | start-ups | stage seconds "
             "| lossless | accept_len |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for number, reports in passes.items():
        order = ", ".join(reports)
        table.append(f"| *pass {number} ({order})* | | | | | | | | | | |")
        table += [row(method, report, wall) for method, (report, wall) in reports.items()]
    methods = list(dict.fromkeys(m for reports in passes.values() for m in reports))
    by_method = {m: [reports[m][0] for reports in passes.values() if m in reports] for m in methods}
    if len(passes) > 1:
        table.append("| *all passes* | | | | | | | | | | |")
        table += [combined(m, by_method[m]) for m in methods]
    notes = []
    if "fresh" in by_method:
        fresh = [r["speedup"] for rep in by_method["fresh"] for r in rep["rounds"]]
        low, high, mid = min(fresh), max(fresh), statistics.median(fresh)
        for method in methods:
            if method != "fresh":
                ratios = [r["speedup"] for rep in by_method[method] for r in rep["rounds"]]
                median = statistics.median(ratios)
                notes.append(f"{method}: median {median:.3f}x over {len(ratios)} rounds against fresh {mid:.3f}x over "
                             f"{len(fresh)} ({median / mid - 1:+.1%}), {'inside' if low <= median <= high else 'outside'} "
                             f"the fresh rounds' spread {low:.3f}-{high:.3f}")
    first = next(iter(this.values()))[0]
    body = ("\n".join(table) + f"\n\nThe draft `{shown_path(args.draft)}` on the first {args.num_prompts} prompts of "
            f"`{shown_path(args.prompts)}`, 128 tokens each, {args.rounds} rounds a method and pass (baseline first in odd "
            f"rounds), the methods of a pass one after another in the order shown; {first['warmup_prompts']} warm-up "
            "prompts per server before its first measured phase; prefix caching off; `OMP_WAIT_POLICY` as the "
            "environment gives it (the demo's pipeline sets PASSIVE).\n\n" + "\n".join(f"- {n}" for n in notes))
    publish("serve_methods", "Serving: fresh, frozen or kept servers between rounds", provenance(command_line()) + "\n" + body)


if __name__ == "__main__":
    main()

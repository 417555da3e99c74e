"""vLLM serving with and without the demo draft on the held-out prompts: tokens/s, speedup,
mean acceptance length, acceptance per position; written to docs/benchmarks-history.md.

    .venv/bin/python scripts/bench/bench_serve.py                      # runs the smoke-serve harness
    .venv/bin/python scripts/bench/bench_serve.py --report .cache/demo/serve/report.json   # reuses a run

It needs the demo's export and held-out rows (`make demo` makes them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from publish import FIGURES, REPO, command_line, provenance, publish


def run_harness(args) -> Path:
    argv = [sys.executable, "-m", "blockdraft.serve", f"draft={args.draft}", f"target={args.target}",
            f"prompts={args.prompts}", f"num_prompts={args.num_prompts}", f"max_tokens={args.max_tokens}", f"out={args.out}"]
    print("$", " ".join(argv), flush=True)
    subprocess.run(argv, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    report = Path(args.out) / "report.json"
    if not report.is_file():
        sys.exit(f"the harness wrote no report at {report}; see the vLLM logs in {args.out}")
    return report


def serve_section(report: dict, plot: Optional[str], command: str, reused: Optional[str] = None) -> str:
    per_pos = report.get("acceptance_per_position") or []
    rows = [
        ("tokens/s, target alone (median of the rounds)", _f(report.get("tokens_per_s_baseline"))),
        ("tokens/s, with the draft (median of the rounds)", _f(report.get("tokens_per_s_draft"))),
        ("speedup (median of the rounds)", _f(report.get("speedup"), "x")),
        ("speedup of each round (order)", "; ".join(f"{_f(r.get('speedup'), 'x')} ({' then '.join(r.get('order', []))})"
                                                    for r in report.get("rounds") or []) or "-"),
        ("mean acceptance length", _f(report.get("mean_acceptance_length"))),
        ("acceptance per position", " ".join(f"{r:.2f}" for r in per_pos) or "-"),
        ("lossless (every output token identical)", str(report.get("lossless"))),
        ("prompts / max_tokens", f"{report.get('prompts_sent')} / {report.get('max_tokens')}"),
        ("num_speculative_tokens", str(report.get("num_speculative_tokens"))),
        ("vLLM", f"{report.get('vllm_version')} on {report.get('device')} ({report.get('runner')} runner)"),
    ]
    table = "| figure | value |\n|---|---|\n" + "".join(f"| {a} | {b} |\n" for a, b in rows)
    note = ("Greedy, batch size 1 (one request at a time), the demo draft on the held-out ShareGPT prompts "
            "(never trained on). Tokens/s counts generated tokens over request wall time.\n")
    figure = f"\n![acceptance per position]({plot})\n" if plot else ""
    if reused:
        # The figures are the harness run's own (its date is the report's), not this script's.
        note = f"From `{reused}`, written by the smoke-serve harness on {report.get('date')}. " + note
    return provenance(command) + "\n" + note + "\n" + table + figure


def demo_stage_times(report_path: Path) -> str:
    """The `make demo` stage times, when the report is the demo's (its stages.json is beside it)."""
    stages = report_path.parent.parent / "stages.json"
    if not stages.is_file():
        return ""
    records = json.loads(stages.read_text())
    rows = "".join(f"| {name} | {r.get('seconds') or 0:.0f} s | {r.get('at')} |\n" for name, r in records.items())
    total = sum(r.get("seconds") or 0 for r in records.values())
    return ("\n`make demo` stages as they last ran (environments already built):\n\n| stage | wall time | finished |\n"
            f"|---|---|---|\n{rows}| total | {total:.0f} s | |\n")


def _f(value, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def parse_args(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", help="use this report.json instead of running the harness")
    parser.add_argument("--draft", default=".cache/demo/export")
    parser.add_argument("--target", default=".cache/targets/smollm2-135m-instruct")
    parser.add_argument("--prompts", default=".cache/demo/regen/heldout.jsonl")
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", default="runs/bench_serve")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    report_path = Path(args.report) if args.report else run_harness(args)
    report = json.loads(report_path.read_text())
    plot = None
    if (report_path.parent / "acceptance.png").is_file():
        FIGURES.mkdir(parents=True, exist_ok=True)
        shutil.copy(report_path.parent / "acceptance.png", FIGURES / "serve_acceptance_smollm2.png")
        plot = "benchmarks/serve_acceptance_smollm2.png"
    body = serve_section(report, plot, command_line(), reused=args.report) + demo_stage_times(report_path)
    publish("serve", "Serving: vLLM with and without the demo draft (SmolLM2-135M)", body)


if __name__ == "__main__":
    main()

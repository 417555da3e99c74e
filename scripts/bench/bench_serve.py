"""vLLM serving with and without the demo draft on the held-out prompts: tokens/s, speedup,
mean acceptance length, acceptance per position; written to docs/benchmarks.md.

    .venv/bin/python scripts/bench/bench_serve.py                      # runs the smoke-serve harness
    .venv/bin/python scripts/bench/bench_serve.py --report .cache/demo/serve/report.json   # reuses a run

It needs the demo's export and held-out rows (`make demo` makes them). The other bench
scripts reuse this file's `write_section`, which owns the layout of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "benchmarks.md"
FIGURES = REPO / "docs" / "benchmarks"
DOC_HEADER = (
    "# Benchmarks\n\nEvery figure here comes from a script in `scripts/bench/` that rewrites its own section; "
    "rerun it to refresh the section. Timings on a shared 2-core machine vary by tens of percent from run to run.\n"
)


# --- docs/benchmarks.md, shared by every bench script ----------------------------------------
def machine_kind() -> str:
    """E.g. "2-core x86_64 CPU (AMD EPYC; no avx512f, avx512_bf16, amx), 24 GiB, no GPU": the CPU model and
    the ISA features that change kernels, since machines of one kind differ in both."""
    from blockdraft.machine import describe

    return describe()


def today() -> str:
    """The date as `date` prints it: what the section says it was measured on."""
    return subprocess.run(["date"], capture_output=True, text=True).stdout.strip()


def provenance(command: str) -> str:
    return f"Command: `{command}`  \nMachine: {machine_kind()}  \nDate: {today()}\n"


def write_section(key: str, title: str, body: str, doc: Path = DOC) -> Path:
    """Replace (or append) the section between `<!-- bench:key -->` markers; other sections stay."""
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    block = f"{start}\n## {title}\n\n{body.rstrip()}\n{end}\n"
    text = doc.read_text() if doc.is_file() else DOC_HEADER
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return doc


def shown_path(path) -> Path:
    """A path as a section shows it: relative to the repository when inside it, so no machine's checkout appears."""
    resolved = Path(path).resolve()
    return resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved


def command_line() -> str:
    """The invocation as a shell would take it back (arguments with spaces are quoted)."""
    script = str(Path(sys.argv[0]).relative_to(REPO) if Path(sys.argv[0]).is_absolute() else sys.argv[0])
    return shlex.join([".venv/bin/python", script, *sys.argv[1:]])


# --- serving -------------------------------------------------------------------------------
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
    print(body)
    print(f"written to {write_section('serve', 'Serving: vLLM with and without the demo draft (SmolLM2-135M)', body)}")


if __name__ == "__main__":
    main()

"""Training speed of the demo recipe on SmolLM2-135M: step time, tokens/s, where the time goes.

    .venv/bin/python scripts/bench/bench_train_smollm2.py [--steps 30] [--train-rows .cache/demo/regen/train.jsonl]

Runs `experiment=smollm2_dflash_cpu` for a few steps in a scratch run directory (no
validation), drops the first logging window (warm-up), and writes the rest to
docs/benchmarks-history.md. Needs the prepared target and the demo's training rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from publish import REPO, command_line, provenance, publish

EXPERIMENT = "smollm2_dflash_cpu"


def run_training(args, run_dir: Path) -> List[dict]:
    argv = [sys.executable, "-m", "blockdraft.train", f"experiment={EXPERIMENT}", f"run_dir={run_dir}",
            f"data.train={args.train_rows}", "data.val=null", f"train.max_steps={args.steps}",
            f"train.log_every={args.log_every}", "train.save_every=0", "train.progress=false", *args.overrides]
    print("$", " ".join(argv), flush=True)
    # As `make demo` trains: idle OpenMP threads sleep instead of spinning (see blockdraft/demo.py).
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env)
    if done.returncode != 0:
        sys.exit(f"training failed (exit {done.returncode})")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "step_time_s" in r]


def summarize(records: List[dict]) -> dict:
    steady = records[1:] or records  # the first window pays for allocation and caches
    mean = lambda key: statistics.mean(r[key] for r in steady)  # noqa: E731
    return {
        "step_time_s": mean("step_time_s"), "tokens_per_s": mean("tokens_per_s"),
        "share_target": mean("share_target"), "share_draft": mean("share_draft"),
        "peak_rss_gib": max(r.get("peak_rss_gib", 0.0) for r in records), "windows": len(steady),
    }


def train_section(figures: dict, args, command: str) -> str:
    rows = [
        ("step time (s)", f"{figures['step_time_s']:.2f}"),
        ("tokens/s (all tokens of the rows, target + draft)", f"{figures['tokens_per_s']:.0f}"),
        ("share of step in the target's forward", f"{figures['share_target']:.0%}"),
        ("share of step in the draft (forward + backward + loss)", f"{figures['share_draft']:.0%}"),
        ("peak RSS (GiB)", f"{figures['peak_rss_gib']:.2f}"),
    ]
    table = "| figure | value |\n|---|---|\n" + "".join(f"| {a} | {b} |\n" for a, b in rows)
    setting = (f"Recipe `{EXPERIMENT}` (the demo's), {args.steps} steps, means over {figures['windows']} windows of "
               f"{args.log_every} steps after the first; fp32 on CPU, torch threads = {os.cpu_count()}.\n")
    return provenance(command) + "\n" + setting + "\n" + table


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--train-rows", default=".cache/demo/regen/train.jsonl")
    parser.add_argument("overrides", nargs="*", help="more training overrides, key=value")
    args = parser.parse_args(argv)
    if not (REPO / args.train_rows).is_file() and not Path(args.train_rows).is_file():
        sys.exit(f"--train-rows {args.train_rows} does not exist; run `make demo` first (it regenerates them)")
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        figures = summarize(run_training(args, Path(tmp) / "run"))
    body = train_section(figures, args, command_line())
    publish("train", "Training: the demo recipe on SmolLM2-135M", body)


if __name__ == "__main__":
    main()

"""JetSpec's recipe before and after it followed its paper, on the tiny recipe: val accept_len and the
reference engine's mean acceptance length over the held-out tiny prompts.

    .venv/bin/python scripts/bench_jetspec_recipe.py [--steps 120] [--seeds 0 1]

Each variant trains `experiment=tiny_cpu draft=jetspec` for --steps steps (online: the full-distribution
KL needs the target's forward), exports it in float32 and decodes the 16 held-out prompts greedily,
48 tokens each, on the reference engine. Runs one job at a time; figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_serve import REPO, command_line, provenance, write_section

WORK = REPO / ".cache" / "bench" / "jetspec_recipe"
# (name, what it is, overrides on top of experiment=tiny_cpu draft=jetspec)
VARIANTS = [
    ("before", "the recipe before: the tiny recipe's slot decay (gamma 4), KL to the top-32",
     ["train.gamma=4.0", "train.teacher_top_k=32"]),
    ("uniform", "the paper's uniform slot weights, KL to the top-32", ["train.teacher_top_k=32"]),
    ("uniform_full", "the paper's uniform slot weights, KL to the full distribution (the recipe now)", ["train.teacher_top_k=null"]),
]
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}


def run(argv: list) -> None:
    print("$", " ".join(argv), flush=True)
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def variant(name: str, overrides: list, seed: int, steps: int) -> dict:
    work = WORK / f"{name}_seed{seed}"
    run([sys.executable, "-m", "blockdraft.train", "experiment=tiny_cpu", "draft=jetspec", f"run_dir={work / 'run'}",
         "overwrite=true", f"seed={seed}", f"train.max_steps={steps}", "train.progress=false", "train.save_every=0",
         *overrides])
    run([sys.executable, "-m", "blockdraft.export", f"checkpoint={work / 'run'}", f"out={work / 'export'}",
         "dtype=float32", "overwrite=true"])
    run([sys.executable, "-m", "blockdraft.serve", f"draft={work / 'export'}", "target=.cache/targets/tiny-qwen3",
         "prompts=.cache/tiny_cpu/val.jsonl", "num_prompts=16", "max_tokens=48", "rounds=1", "engine=reference",
         f"out={work / 'serve'}", "overwrite=true"])
    metrics = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in metrics if r.get("split") == "val"][-1]
    report = json.loads((work / "serve" / "report.json").read_text())
    return {"val_accept_len": val["val/accept_len"], "engine_accept_len": report["mean_acceptance_length"],
            "lossless": report["lossless"]}


def section(results: dict, args) -> str:
    lines = ["| variant | overrides | val accept_len per seed | mean | engine acceptance per seed | mean | lossless |",
             "|---|---|---|---|---|---|---|"]
    for name, what, overrides in VARIANTS:
        rows = [results[f"{name}@{s}"] for s in args.seeds if f"{name}@{s}" in results]
        if not rows:
            continue
        val = [r["val_accept_len"] for r in rows]
        eng = [r["engine_accept_len"] for r in rows]
        lines.append(f"| {what} | `{' '.join(overrides)}` | {' / '.join(f'{v:.3f}' for v in val)} | "
                     f"{statistics.mean(val):.3f} | {' / '.join(f'{v:.3f}' for v in eng)} | {statistics.mean(eng):.3f} | "
                     f"{'yes' if all(r['lossless'] for r in rows) else 'no'} |")
    setting = (f"`experiment=tiny_cpu draft=jetspec`, {args.steps} steps online, seeds {', '.join(map(str, args.seeds))}; "
               "val accept_len of the last validation (16 held-out rows), and the reference engine's mean acceptance "
               "length greedy over the same 16 prompts, 48 tokens each (block 4: at most 4).\n")
    return provenance(command_line()) + "\n" + setting + "\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    results_path = WORK / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for seed in args.seeds:
        for name, _, overrides in VARIANTS:
            results[f"{name}@{seed}"] = variant(name, overrides, seed, args.steps)
            WORK.mkdir(parents=True, exist_ok=True)
            results_path.write_text(json.dumps(results, indent=2) + "\n")
            print(name, seed, results[f"{name}@{seed}"], flush=True)
    doc = write_section("jetspec_recipe", "JetSpec as its paper trains it: before and after (tiny recipe)", section(results, args))
    print(f"wrote {doc}")


if __name__ == "__main__":
    main()

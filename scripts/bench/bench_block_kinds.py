"""LiLiCorr against DFlash2 and DFlash on the demo's feature store, at equal wall time: the reference engine's
mean acceptance length of each on the demo's held-out prompts.

    .venv/bin/python scripts/bench/bench_block_kinds.py [--demo .cache/demo] [--minutes 4] [--seed 0]
        [--num-prompts 8] [--max-tokens 96] [--out runs/bench_block_kinds]

Needs the demo's regen and store (`make demo`, or its stages up to capture). Each kind trains with its CPU
recipe (smollm2_dflash_cpu, smollm2_dflash2_cpu, smollm2_lilicorr_cpu) from the store; a budget of M
minutes is M*60 / the kind's own step time, measured by a 40-step probe on this machine, all probes
first and alone. Each run is exported (float32) and decoded greedily by the project's reference engine
(`blockdraft serve engine=reference`: vLLM serves DFlash2 and LiLiCorr only on its V2 GPU runner) on the
demo's held-out prompts: lossless is checked, and the mean acceptance length and the acceptance per
position are read from its report. Results are kept in <out>/results.json (resumable); writes its
section of docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench_dspark import export
from bench_scaling import ENV, PROBE_STEPS, probe_step_times, train
from publish import REPO, command_line, provenance, publish, shown_path

RECIPES = {"dflash": "smollm2_dflash_cpu", "dflash2": "smollm2_dflash2_cpu", "lilicorr": "smollm2_lilicorr_cpu"}


def decoded(export_dir: Path, args, out: Path) -> dict:
    """The reference engine's report on the held-out prompts."""
    argv = [sys.executable, "-m", "blockdraft.serve", f"draft={export_dir}", f"target={args.target}", "engine=reference",
            f"prompts={args.heldout}", f"num_prompts={args.num_prompts}", f"max_tokens={args.max_tokens}",
            f"out={out}", "overwrite=true"]
    print("$", " ".join(argv), flush=True)
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True)
    report = out / "report.json"
    if not report.is_file():
        sys.exit(f"the reference engine wrote no report for {export_dir}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(report.read_text())


def run_kind(kind: str, steps: int, args) -> dict:
    run_dir = Path(args.out) / kind
    train(run_dir, args.store, args.train_rows, "null", steps, args.seed, [f"target.path={args.target}"], validate=False,
          experiment=RECIPES[kind])
    report = decoded(export(run_dir, Path(args.out) / f"{kind}_export"), args, Path(args.out) / f"{kind}_serve")
    return {"kind": kind, "steps": steps, "lossless": report["lossless"],
            "mean_acceptance_length": report["mean_acceptance_length"],
            "acceptance_per_position": report["acceptance_per_position"], "prompts": report["prompts_sent"],
            "tokens": report["tokens_generated"]["draft"]}


def section(results: dict, args) -> str:
    lines = [
        f"Each kind trains {args.minutes:g} minutes of this machine's steps (the kind's own step time, from a "
        f"{PROBE_STEPS}-step probe), seed {args.seed}, from the feature store `{shown_path(Path(args.store))}` of the "
        "demo's training rows with its CPU recipe; then the project's reference engine decodes the first "
        f"{args.num_prompts} prompts of `{shown_path(Path(args.heldout))}` greedily, {args.max_tokens} tokens each, "
        "with the draft and without (vLLM serves DFlash2 and LiLiCorr only on its V2 GPU model runner).", "",
        "| kind | recipe | step time | steps | lossless | mean acceptance length | accepted per round, slot 1..3 |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in results["points"]:
        slots = " / ".join(f"{x:.2f}" for x in p["acceptance_per_position"])
        lines.append(f"| {p['kind']} | `{RECIPES[p['kind']]}` | {results['step_times'][p['kind']]:.3f} s | {p['steps']} | "
                     f"{p['lossless']} | **{p['mean_acceptance_length']:.3f}** | {slots} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", default=str(REPO / ".cache" / "demo"))
    parser.add_argument("--target", default=str(REPO / ".cache" / "targets" / "smollm2-135m-instruct"))
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", default=str(REPO / "runs" / "bench_block_kinds"))
    args = parser.parse_args()
    demo = Path(args.demo)
    args.store, args.train_rows, args.heldout = str(demo / "store"), str(demo / "regen" / "train.jsonl"), str(demo / "regen" / "heldout.jsonl")
    for needed in (Path(args.store), Path(args.train_rows), Path(args.heldout), Path(args.target)):
        if not needed.exists():
            sys.exit(f"{needed} is missing: run `make demo` (or pass --demo <its out> and --target) first")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {"step_times": {}, "points": []}
    probe_step_times(RECIPES, results, results_path, args.store, args.train_rows, [f"target.path={args.target}"])
    for kind in RECIPES:
        if not any(p["kind"] == kind for p in results["points"]):
            results["points"].append(run_kind(kind, int(args.minutes * 60 / results["step_times"][kind]), args))
            results_path.write_text(json.dumps(results, indent=2))
    publish("block_kinds", "LiLiCorr, DFlash2 and DFlash at equal wall time (SmolLM2-135M, the demo's store)",
            provenance(command_line()) + "\n" + section(results, args))


if __name__ == "__main__":
    main()

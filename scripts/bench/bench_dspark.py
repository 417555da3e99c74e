"""DSpark against DFlash on the demo's feature store, at equal wall time: the same minutes of
training for each, two seeds, held-out acceptance walked as serving walks a reply, per position,
and the DSpark confidence head's calibration.

    .venv/bin/python scripts/bench/bench_dspark.py [--demo .cache/demo] [--minutes 4] [--seeds 0 1]
        [--out runs/bench_dspark]

Needs the demo's regen and store (`make demo`, or its stages up to capture). Each kind trains with
its CPU recipe (`smollm2_dflash_cpu`, `smollm2_dspark_cpu`) from the store; a budget of M minutes is
M*60 / the kind's own step time, measured by a 40-step probe on this machine (the steps, not the
seconds, fix a run, so the runs may share the machine; the probes must not). Each run is exported
(float32) and scored on every held-out row, every anchor drawn: training's uniform mean and the walk
of each reply as serving takes it (`blockdraft.train.metrics.walked_rounds`, greedy: within an
accepted run the Markov head's teacher-forced previous token is the drafted one, so the walk is
exact). Calibration: on the walked rounds, per slot, the rounds that reached it, the share that
accepted it and the head's mean predicted acceptance. Results are kept in <out>/results.json
(resumable); writes its section of docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_heldout_walk import scored
from bench_scaling import ENV, PROBE_STEPS, probe_step_times, train
from publish import REPO, command_line, provenance, publish, shown_path

RECIPES = {"dflash": "smollm2_dflash_cpu", "dspark": "smollm2_dspark_cpu"}


def export(run_dir: Path, out: Path) -> Path:
    argv = [sys.executable, "-m", "blockdraft.export", f"checkpoint={run_dir}", f"out={out}", "dtype=float32", "overwrite=true"]
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"export of {run_dir} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return out


def run_point(kind: str, seed: int, steps: int, args, rows: list) -> dict:
    run_dir = Path(args.out) / f"{kind}_seed{seed}"
    records = train(run_dir, args.store, args.train_rows, "null", steps, seed, [], validate=False, experiment=RECIPES[kind])
    last = [r for r in records if "accept_len" in r and r.get("split") != "val"][-1]
    with tempfile.TemporaryDirectory() as tmp:
        s = scored(export(run_dir, Path(args.out) / f"{kind}_seed{seed}_export"), rows, Path(tmp), RECIPES[kind])
    return {"kind": kind, "seed": seed, "steps": steps, "train_accept_len": last["accept_len"], **s}


def fmt(xs, digits=3) -> str:
    return " / ".join(f"{x:.{digits}f}" for x in xs)


def section(results: dict, step_times: dict, args) -> str:
    points = results["points"]
    lines = [
        f"Both kinds train {args.minutes:g} minutes of this machine's steps (the kind's own step time, measured by a "
        f"{PROBE_STEPS}-step probe), from the feature store `{shown_path(Path(args.store))}` of the demo's "
        f"training rows, one row per step, each with its CPU recipe; scored on the {points[0]['rows']} held-out rows "
        f"of `{shown_path(Path(args.heldout))}` (the target's own greedy replies), every anchor drawn.", "",
        "| kind | seed | step time | steps | held-out accept_len, walked | accepted per round, slot 1..K | uniform over anchors | rounds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(f"| {p['kind']} | {p['seed']} | {step_times[p['kind']]:.3f} s | {p['steps']} | {p['walked']:.3f} | "
                     f"{fmt(p['walked_slots'])} | {p['uniform']:.3f} | {p['rounds']} |")
    for kind in RECIPES:
        walked = [p["walked"] for p in points if p["kind"] == kind]
        if walked:
            spread = f", spread {max(walked) - min(walked):.3f}" if len(walked) > 1 else ""
            lines.append(f"| **{kind}** | mean of {len(walked)} | | | **{statistics.mean(walked):.3f}**{spread} | | | |")
    lines += ["", "The DSpark confidence head on the walked rounds: per slot, the rounds that reached it (every slot "
              "before it accepted), the share of them that accepted it, and the head's mean predicted acceptance.", "",
              "| seed | slot | rounds reaching it | realised acceptance | mean predicted |", "|---|---|---|---|---|"]
    for p in points:
        c = p.get("calibration")
        if not c:
            continue
        for k, (reached, accepted, predicted) in enumerate(zip(c["reached"], c["accepted"], c["predicted_sum"]), start=1):
            if reached:
                lines.append(f"| {p['seed']} | {k} | {reached} | {accepted / reached:.3f} | {predicted / reached:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", default=str(REPO / ".cache" / "demo"))
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", default=str(REPO / "runs" / "bench_dspark"))
    args = parser.parse_args()
    demo = Path(args.demo)
    args.store, args.train_rows, args.heldout = str(demo / "store"), str(demo / "regen" / "train.jsonl"), str(demo / "regen" / "heldout.jsonl")
    for needed in (Path(args.store), Path(args.train_rows), Path(args.heldout)):
        if not needed.exists():
            sys.exit(f"{needed} is missing: run `make demo` (or pass --demo <its out>) first")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {"step_times": {}, "points": []}
    rows = Path(args.heldout).read_text().splitlines()
    probe_step_times(RECIPES, results, results_path, args.store, args.train_rows)
    for seed in args.seeds:
        for kind in RECIPES:
            if any(p["kind"] == kind and p["seed"] == seed for p in results["points"]):
                continue
            steps = int(args.minutes * 60 / results["step_times"][kind])
            results["points"].append(run_point(kind, seed, steps, args, rows))
            results_path.write_text(json.dumps(results, indent=2))
    results["points"].sort(key=lambda p: (list(RECIPES).index(p["kind"]), p["seed"]))
    publish("dspark", "DSpark against DFlash at equal wall time (SmolLM2-135M, the demo's store)",
            provenance(command_line()) + "\n" + section(results, results["step_times"], args))


if __name__ == "__main__":
    main()

"""What a training budget buys on SmolLM2-135M: held-out accept_len against training minutes and
training rows, for one recipe, from a feature store; a table and a plot in docs/benchmarks-history.md.

    .venv/bin/python scripts/bench/bench_scaling.py --store DIR [--minutes 3 6 12] [--rows 500 1000]
        [--step-time S] [--recipe OVERRIDE ...] [--serve-report LABEL=report.json ...]

The store holds the demo's training rows and the held-out rows as its val split, e.g. the demo's
own store with the held-out split added: `python -m blockdraft.capture
experiment=smollm2_dflash_cpu data.val=.cache/demo/regen/heldout.jsonl out=DIR ...` with the demo's
capture settings; `--rows N` trains on its first N rows (data.max_rows). A budget of M minutes
is M*60 / step-time steps, the step time measured by a probe once per recipe, or given with
--step-time (e.g. the lever table's, measured on an idle machine). Steps, not seconds, fix a
point, so the points may run while the machine does other work; the minutes they stand for are
the idle machine's. Each point is kept in <out>/results.json as it finishes: a rerun skips
the points it has (resumable). Smoke-serve reports of drafts trained with the same recipe add
vLLM's own acceptance at their budgets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import List

from publish import FIGURES, REPO, command_line, provenance, publish

EXPERIMENT = "smollm2_dflash_cpu"
PROBE_STEPS = 40
ENV = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1"}


def train(run_dir: Path, store: str, train_rows: str, val_rows: str, steps: int, seed: int, overrides: List[str],
          validate: bool = True, experiment: str = EXPERIMENT) -> List[dict]:
    """One training run from the store; returns its metrics records."""
    argv = [sys.executable, "-m", "blockdraft.train", f"experiment={experiment}", f"run_dir={run_dir}", "overwrite=true",
            f"seed={seed}", f"data.features={store}", f"data.train={train_rows}",
            f"data.val={val_rows if validate else 'null'}",
            f"train.max_steps={steps}", "train.val_every=0", "train.save_every=0", "train.progress=false",
            "train.log_every=10", *overrides]
    print("$", " ".join(argv), flush=True)
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{run_dir.name} failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_seconds(records: List[dict]) -> float:
    """The median logged step time, the first window (warm-up, lazy initialisation) left out."""
    times = [r["step_time_s"] for r in records if "step_time_s" in r][1:]
    return statistics.median(times)


def probe_step_times(recipes: dict, results: dict, results_path: Path, store: str, train_rows: str,
                     overrides: List[str] = ()) -> None:
    """Each kind's step time on this machine from a PROBE_STEPS-step run of its recipe (`recipes`: kind ->
    experiment), into results["step_times"], saved after each (a rerun keeps those measured). The probes run
    first and alone: their step times set every equal-time run's steps."""
    for kind, experiment in recipes.items():
        if kind not in results["step_times"]:
            probe = train(results_path.parent / f"probe_{kind}", store, train_rows, "null", PROBE_STEPS, 0,
                          list(overrides), validate=False, experiment=experiment)
            results["step_times"][kind] = step_seconds(probe)
            results_path.write_text(json.dumps(results, indent=2))


def kept_runs(results_path: Path, runs) -> dict:
    """`runs`: (key, measure) pairs. Each key is measured once and kept in `results_path` as it finishes, so a
    rerun skips the keys it has (resumable) and measures only the new ones; returns every key's result."""
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for key, measure in runs:
        if key in results:
            print(f"{key}: kept from {results_path}")
            continue
        results[key] = measure()
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=2) + "\n")
        print(key, results[key], flush=True)
    return results


def budget_point(args, out: Path, step_time: float, rows: int, minutes: float) -> dict:
    """One point of the curve: the first `rows` rows trained for what `minutes` buy, validated at the end."""
    steps = round(minutes * 60 / step_time)
    records = train(out / f"{rows}@{minutes:g}", args.store, args.train_rows, args.val_rows, steps, args.seed,
                    [*args.recipe, f"data.max_rows={rows}"])
    val = [r for r in records if r.get("split") == "val"][-1]
    return {"rows": rows, "minutes": minutes, "steps": steps, "val_accept_len": val["val/accept_len"],
            "val_acc": val["val/acc_per_slot"], "command": command_line()}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for rows in sorted({r["rows"] for r in results.values()}):
        points = sorted((r["minutes"], r["val_accept_len"]) for r in results.values() if r["rows"] == rows)
        ax.plot(*zip(*points), marker="o", label=f"{rows} rows")
    # Budgets double from point to point: on a log axis each doubling is one step to the right.
    minutes = sorted({r["minutes"] for r in results.values()})
    ax.set_xscale("log", base=2)
    ax.set_xticks(minutes, [f"{m:g}" for m in minutes])
    ax.set_xlabel("training minutes (idle 2-core CPU)")
    ax.set_ylabel("held-out accept_len (block 4)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def section(results: dict, args, step_time: float, figure: Path) -> str:
    lines = ["| rows | minutes | steps | passes over the rows | held-out accept_len | acc slot 1 / 2 / 3 |", "|---|---|---|---|---|---|"]
    for r in sorted(results.values(), key=lambda r: (r["rows"], r["minutes"])):
        acc = " / ".join(f"{a:.3f}" for a in r["val_acc"])
        lines.append(f"| {r['rows']} | {r['minutes']:g} | {r['steps']} | {r['steps'] / r['rows']:.1f} | "
                     f"{r['val_accept_len']:.3f} | {acc} |")
    served = [f"- {label}: vLLM mean acceptance length {rep['mean_acceptance_length']:.3f} ("
              + " / ".join(f"{a:.2f}" for a in rep["acceptance_per_position"]) + f" per position), median speedup "
              f"{rep['speedup']:.2f}x, a round {rep['round_cost']:.2f} plain steps" for label, rep in reports(args.serve_report)]
    setting = (f"Recipe: `experiment={EXPERIMENT} {' '.join(args.recipe)}` from the feature store `{args.store}`, one row per "
               f"step; the first N rows of the demo's regenerated rows (data.max_rows); a minute is {60 / step_time:.0f} "
               f"steps ({step_time:.3f} s a step on an idle machine); validated once at the end on the 48 held-out rows.\n")
    # A resumed run keeps the points of earlier invocations: name each command that measured a point.
    measured_by = list(dict.fromkeys(r.get("command", "(not recorded)") for r in results.values()))
    body = provenance(command_line()) + "\n" + setting
    if measured_by != [command_line()]:
        body += "\nThe points were measured by (each is kept in results.json with its command):\n\n" + \
            "\n".join(f"- `{c}`" for c in measured_by) + "\n"
    body += "\n" + "\n".join(lines) + "\n"
    if served:
        body += "\nvLLM on the held-out prompts (smoke-serve reports of drafts of this recipe):\n\n" + "\n".join(served) + "\n"
    return body + f"\n![accept_len against training minutes]({figure.relative_to(FIGURES.parent)})\n"


def reports(pairs):
    for pair in pairs:
        label, _, path = pair.partition("=")
        yield label, json.loads(Path(path).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--train-rows", default=".cache/demo/regen/train.jsonl")
    parser.add_argument("--val-rows", default=".cache/demo/regen/heldout.jsonl")
    parser.add_argument("--minutes", type=float, nargs="+", default=[3.0, 6.0, 12.0])
    parser.add_argument("--rows", type=int, nargs="+", default=[500, 1000])
    parser.add_argument("--recipe", nargs="*", default=[], help="overrides of the recipe measured")
    parser.add_argument("--step-time", type=float, default=None, help="seconds per step on an idle machine; default: probe")
    parser.add_argument("--serve-report", nargs="*", default=[], help="LABEL=report.json of a draft of this recipe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".cache/bench/scaling")
    args = parser.parse_args()
    out = Path(args.out)
    step_time = args.step_time or step_seconds(
        train(out / "probe", args.store, args.train_rows, args.val_rows, PROBE_STEPS, args.seed, args.recipe, validate=False))
    results = kept_runs(out / "results.json", [(f"{rows}@{minutes:g}", partial(budget_point, args, out, step_time, rows, minutes))
                                               for rows in args.rows for minutes in args.minutes])
    figure = FIGURES / "scaling.png"
    plot(results, figure)
    title = "What a budget buys: held-out accept_len against training minutes and rows (SmolLM2-135M)"
    publish("scaling", title, section(results, args, step_time, figure))


if __name__ == "__main__":
    main()

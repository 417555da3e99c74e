"""DSpark's Markov table under AdamW: the whole table stepped (torch's AdamW) against only the rows a batch saw
(blockdraft's SeenRowsAdamW), and what that makes of a DSpark step against a DFlash step.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench/bench_markov_step.py [--rows 49152] [--rank 64]
        [--seen 128] [--repeats 30] [--demo .cache/demo]

The optimizer part: one [rows, rank] table (SmolLM2's vocabulary x the CPU recipe's Markov rank), a
gradient in `--seen` random rows, each optimizer's step timed `--repeats` times, the two alternating.
With --demo (a finished demo's store), the part that matters: 40 training steps of smollm2_dflash_cpu
and of smollm2_dspark_cpu from the store, the median step of each (the first logged window left out),
alternated twice. Writes its section of docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_scaling import step_seconds, train
from publish import command_line, provenance, publish, shown_path

import torch

from blockdraft.train.seen_rows_adamw import SeenRowsAdamW


def optimizer_ms(rows: int, rank: int, seen: int, repeats: int) -> dict:
    """Median milliseconds of one step of each optimizer over the table, alternating."""
    times = {"AdamW, the whole table": [], "SeenRowsAdamW, the rows seen": []}
    tables = {}
    for name, make in (("AdamW, the whole table", torch.optim.AdamW), ("SeenRowsAdamW, the rows seen", SeenRowsAdamW)):
        table = torch.nn.Parameter(torch.randn(rows, rank) * 0.02)
        table.row_lazy = True
        tables[name] = (table, make([table], lr=2e-3, weight_decay=0.01))
    for i in range(repeats):
        for name, (table, opt) in tables.items():
            grad = torch.zeros(rows, rank)
            grad[torch.randint(0, rows, (seen,))] = torch.randn(seen, rank)
            table.grad = grad
            began = time.perf_counter()
            opt.step()
            if i:  # the first step allocates the moments
                times[name].append((time.perf_counter() - began) * 1000)
    return {name: statistics.median(t) for name, t in times.items()}


def step_ratio(demo: Path, passes: int) -> dict:
    """Median training step of each CPU recipe from the demo's store, alternated `passes` times (the target the
    store was captured from: the demo's, beside its out)."""
    store, rows = str(demo / "store"), str(demo / "regen" / "train.jsonl")
    target = [f"target.path={demo.parent / 'targets' / 'smollm2-135m-instruct'}"]
    times = {"dflash": [], "dspark": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(passes):
            for kind in times:
                records = train(Path(tmp) / f"{kind}{i}", store, rows, "null", 40, 0, target, validate=False,
                                experiment=f"smollm2_{kind}_cpu")
                times[kind].append(step_seconds(records))
    return {kind: statistics.median(t) for kind, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=49152)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--seen", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--demo", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    ms = optimizer_ms(args.rows, args.rank, args.seen, args.repeats)
    lines = [f"One optimizer step over a [{args.rows}, {args.rank}] table with a gradient in {args.seen} random rows, "
             f"median of {args.repeats - 1} steps each, the two alternating, 2 threads.", "",
             "| optimizer | ms a step |", "|---|---|"]
    lines += [f"| {name} | {value:.2f} |" for name, value in ms.items()]
    if args.demo:
        demo = Path(args.demo)
        if not (demo / "store").is_dir():
            sys.exit(f"{demo / 'store'} is missing: run `make demo` (or pass --demo <its out>) first")
        steps = step_ratio(demo, 2)
        lines += ["", f"40 training steps of each CPU recipe from `{shown_path(demo / 'store')}`, one row a step, median "
                  "step (the first logged window left out), the kinds alternating, two passes:", "",
                  "| recipe | step (s) | against DFlash |", "|---|---|---|"]
        lines += [f"| `smollm2_{kind}_cpu` | {t:.4f} | {t / steps['dflash']:.2f}x |" for kind, t in steps.items()]
    publish("markov_step", "DSpark's Markov table: AdamW over every row or over the rows seen",
            provenance(command_line(env="OMP_WAIT_POLICY=PASSIVE")) + "\n" + "\n".join(lines))


if __name__ == "__main__":
    main()

"""Learning levers at equal wall time on SmolLM2-135M: held-out accept_len after the same training
seconds, one lever at a time on top of the demo recipe.

    .venv/bin/python scripts/bench_levers.py --store DIR [--minutes 3] [--only NAME ...] [--seed N]

The store must hold the demo's training rows and its held-out rows as the val split, e.g. the
demo's own store with the held-out split added: `python -m blockdraft.data.capture
experiment=smollm2_dflash_cpu data.val=.cache/demo/regen/heldout.jsonl out=DIR ...` with the
demo's capture settings. Each lever trains the same rows in the same order for `--minutes` of
its own steps (budget_runs.train_for: a probe measures its step time first), validates once on
the held-out rows, and runs alone on the cores. Rows accumulate in <out>/results.json over
invocations; the table goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_objectives import result_key
from bench_serve import command_line, provenance, write_section
from budget_runs import EXPERIMENT, row_count, train_for

# (name, what it tests, overrides on top of the demo recipe)
LEVERS = [
    ("base", "the demo recipe (AdamW, 1 layer, 64 anchors, fp32)", []),
    ("all_anchors", "every valid anchor of a row (replies are at most 128 tokens)", ["train.num_anchors=128"]),
    ("two_layers", "two draft layers", ["draft.num_layers=2"]),
    # 8,230 distinct ids in the 1000 training replies: the other 8,154 rows of a 16384 head are the
    # lowest unused ids, which still cover 96.2% of the held-out reply tokens against 92.1%.
    ("head_16384", "a 16384-token draft head", ["draft.draft_vocab_size=16384"]),
    ("init_from_target", "layers, norm and fc started from the target's last layer (read from its files)",
     ["init_from_target=true"]),
    ("bf16_autocast", "the draft's matmuls in bfloat16 autocast", ["train.dtype=bfloat16"]),
    ("muon", "Muon for the matrices, Newton-Schulz in float32, 5 steps", ["optim=muon", "optim.lr=2e-3"]),
    ("muon_ns3", "Muon, 3 Newton-Schulz steps in float32", ["optim=muon", "optim.lr=2e-3", "optim.muon_ns_steps=3"]),
    ("muon_bf16", "Muon, Newton-Schulz in bfloat16 (torch's own)", ["optim=muon", "optim.lr=2e-3", "optim.muon_ns_dtype=bfloat16"]),
    # The two that moved it, together.
    ("muon_bf16_init", "Muon in bfloat16 and init_from_target together",
     ["optim=muon", "optim.lr=2e-3", "optim.muon_ns_dtype=bfloat16", "init_from_target=true"]),
    ("peak_lr_3e-3", "the schedule: peak 3e-3, warm-up 2%", ["optim.lr=3e-3", "optim.warmup_ratio=0.02"]),
]


def section(results: dict, args) -> str:
    lines = ["| lever | overrides | seed | steps in the budget | step (s) | held-out accept_len | acc slot 1 / 2 / 3 |",
             "|---|---|---|---|---|---|---|"]
    for name, what, overrides in LEVERS:
        for key in sorted(k for k in results if k == name or k.startswith(name + "@")):
            r = results[key]
            acc = " / ".join(f"{a:.3f}" for a in r["val_acc"])
            lines.append(f"| {what} | `{' '.join(overrides) or '-'}` | {key.partition('@')[2] or '0'} | {r['steps']} | "
                         f"{r['step_time_s']:.3f} | {r['val_accept_len']:.3f} | {acc} |")
    setting = (f"Base: `experiment={EXPERIMENT} {' '.join(args.base)}`, trained from the feature store `{args.store}` (the "
               f"demo's {row_count(args.train_rows)} regenerated rows) for {args.minutes:g} minutes of its own steps, the steps set from a "
               "40-step probe of the same settings so the schedule ends with the budget; validated once at the end on "
               "the 48 held-out rows (accept_len: 1 + the run of correct drafted slots, as vLLM counts a round, over "
               "the draft's own vocabulary). The target's forward is not in the budget: it ran once, into the store.\n")
    return provenance(command_line()) + "\n" + setting + "\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--train-rows", default=".cache/demo/regen/train.jsonl")
    parser.add_argument("--val-rows", default=".cache/demo/regen/heldout.jsonl")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--base", nargs="*", default=[], help="overrides every run shares")
    parser.add_argument("--only", nargs="*", default=None, help="run only these levers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".cache/bench/levers")
    args = parser.parse_args()
    results_path = Path(args.out) / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for name, _, overrides in LEVERS:
        if args.only is None or name in args.only:
            key = result_key(name, args.seed)
            results[key] = train_for(Path(args.out) / key, args.minutes * 60, args.store, args.train_rows, args.val_rows,
                                     args.seed, [*args.base, *overrides])
            results_path.parent.mkdir(parents=True, exist_ok=True)
            results_path.write_text(json.dumps(results, indent=2) + "\n")
            print(key, results[key], flush=True)
    title = "Learning levers at equal wall time: held-out accept_len after the same training minutes (SmolLM2-135M)"
    print(f"wrote {write_section('learning_levers', title, section(results, args))}")


if __name__ == "__main__":
    main()

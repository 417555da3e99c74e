"""Learning levers at the slowest CPU's demo budget: a few hundred rows passed over many times. Held-out
accept_len along the run (validated every --val-every steps) and at its end, for each lever; a table in
docs/benchmarks-history.md.

    .venv/bin/python scripts/bench/bench_small_data.py --store DIR [--kl-store DIR] [--rows 200] [--steps 3140]
        [--levers base frozen_mlp ...] [--seeds 0 1] [--out .cache/bench/small_data]

On a CPU without AVX512-BF16 or AMX the demo's 30 minutes leave room for 200 regenerated rows and about 3000
training steps (blockdraft/demo.py, SIZES["other"]: 3140 with hard labels, 2830 with the soft labels it takes
since this measurement): some 15 passes over 23k reply tokens. The store holds those rows
and the held-out rows as its val split, captured in float32 as that CPU captures them, e.g.

    python -m blockdraft.capture experiment=smollm2_dflash_cpu target.path=<smollm2> data.train=<out>/regen/train.jsonl
        data.val=<out>/regen/heldout.jsonl data.max_rows=200 compute_dtype=float32 rows_per_forward=8 out=DIR

and --kl-store the same with `train.kl_weight=1.0` (the target's top-32 next-token distribution kept beside the
features, for the soft-label lever). Steps, not seconds, fix a run, so the runs may share the machine with
other work; the step time column is what each run measured. Each run is kept in <out>/results.json as it
finishes: a rerun skips the runs it has.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from bench_scaling import kept_runs, step_seconds, train
from publish import command_line, provenance, publish

# name -> (overrides, which store): each lever changes one thing of the demo recipe.
LEVERS = {
    "base": ([], "store"),
    "frozen_mlp": (["train.frozen=[mlp]"], "store"),
    "frozen_layer": (["train.frozen=[layers.0.mlp,layers.0.self_attn]"], "store"),
    "soft_labels": (["train.kl_weight=1.0"], "kl_store"),
    "vocab_16384": (["draft.draft_vocab_size=16384"], "store"),
    "feature_noise": (["train.feature_noise_std=0.5"], "store"),
    "lr_1e-3": (["optim.lr=1.0e-3"], "store"),
    # Served one drafted token a round (that CPU's preset): a block of 2 spends every supervised slot on slot 1.
    "soft_block_2": (["train.kl_weight=1.0", "draft.block_size=2"], "kl_store"),
}


def run_lever(args, name: str, seed: int) -> dict:
    overrides, store_key = LEVERS[name]
    store = getattr(args, store_key)
    if store is None:
        raise SystemExit(f"lever {name} needs --{store_key.replace('_', '-')} (see this script's docstring)")
    records = train(Path(args.out) / f"{name}_s{seed}", store, args.train_rows, args.val_rows, args.steps, seed,
                    [*overrides, f"data.max_rows={args.rows}", f"train.val_every={args.val_every}"])
    val = [r for r in records if r.get("split") == "val"]
    last_train = [r for r in records if "loss" in r][-1]
    return {"lever": name, "seed": seed, "overrides": overrides, "store": store,
            "step_s": step_seconds(records), "curve": [[r["step"], r["val/accept_len"]] for r in val],
            "val_accept_len": val[-1]["val/accept_len"], "val_acc": val[-1]["val/acc_per_slot"],
            "outside_vocab": val[-1].get("val/label_outside_vocab_share"),
            "train_accept_len": last_train["accept_len"], "command": command_line()}


def section(results: dict, args) -> str:
    steps = sorted({s for r in results.values() for s, _ in r["curve"]})
    head = " | ".join(f"at {s}" for s in steps)
    lines = [f"| lever | overrides | seed | step (s) | held-out accept_len {head} | acc slot 1 / 2 / 3 at the end | "
             "training accept_len at the end |", "|---|---|---|---|" + "---|" * len(steps) + "---|---|"]
    for r in sorted(results.values(), key=lambda r: (list(LEVERS).index(r["lever"]), r["seed"])):
        curve = dict((s, a) for s, a in r["curve"])
        cells = " | ".join(f"{curve[s]:.3f}" if s in curve else "-" for s in steps)
        acc = " / ".join(f"{a:.3f}" for a in r["val_acc"])
        lines.append(f"| {r['lever']} | `{' '.join(r['overrides']) or '-'}` | {r['seed']} | {r['step_s']:.3f} | {cells} | "
                     f"{acc} | {r['train_accept_len']:.2f} |")
    measured_by = list(dict.fromkeys(r["command"] for r in results.values()))
    body = provenance(command_line()) + (
        f"\nRecipe: `experiment=smollm2_dflash_cpu` from the feature store `{args.store}` (float32 features), its first "
        f"{args.rows} rows (data.max_rows), {args.steps} steps of one row, validated every {args.val_every} steps on the "
        "48 held-out rows (accept_len: 1 + the run of correct drafted slots over every anchor, as training reports it).\n")
    if measured_by != [command_line()]:
        body += "\nThe runs were measured by:\n\n" + "\n".join(f"- `{c}`" for c in measured_by) + "\n"
    return body + "\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--kl-store", default=None)
    parser.add_argument("--train-rows", default=".cache/demo/regen/train.jsonl")
    parser.add_argument("--val-rows", default=".cache/demo/regen/heldout.jsonl")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=3140)
    parser.add_argument("--val-every", type=int, default=785)
    parser.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default=".cache/bench/small_data")
    args = parser.parse_args()
    results = kept_runs(Path(args.out) / "results.json",
                        [(f"{name}@{seed}", partial(run_lever, args, name, seed)) for seed in args.seeds for name in args.levers])
    title = "Learning levers at the slowest CPU's demo budget: 200 rows, 3140 steps (SmolLM2-135M)"
    publish("small_data", title, section(results, args))


if __name__ == "__main__":
    main()

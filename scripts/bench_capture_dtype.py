"""What the capture's bfloat16 forward does to the draft: held-out accept_len after the same training
steps from a store captured in bfloat16 and from one captured in float32 (SmolLM2-135M).

    .venv/bin/python scripts/bench_capture_dtype.py --store DIR [--steps 3000] [--seeds 0 1]

DIR is the demo's rows with the held-out rows as the val split, captured with
`capture.compute_dtype=auto` as the demo does (bench_levers.py says how). The float32 twin is
captured beside it (DIR-float32, once: the same rows, settings and float16 storage, only the
target's matmuls in float32). Both train the demo recipe for the same steps and seeds, so the store
is the only difference; the steps are counted, not timed, so the runs may share the machine.
Results accumulate in <out>/results.json; the table goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench_serve import REPO, command_line, provenance, write_section
from budget_runs import ENV, EXPERIMENT, row_count, train


def capture_float32(store: Path, train_rows: str, val_rows: str) -> Path:
    """The float32 twin of the store; a capture resumes a store it finds, so a finished twin costs a start-up."""
    twin = store.with_name(store.name + "-float32")
    argv = [sys.executable, "-m", "blockdraft.data.capture", f"experiment={EXPERIMENT}", f"data.train={train_rows}",
            f"data.val={val_rows}", f"out={twin}", "compute_dtype=float32"]
    print("$", " ".join(argv), flush=True)
    subprocess.run(argv, cwd=REPO, env=ENV, check=True)
    return twin


def compute_dtype(store: Path) -> str:
    # A float32 capture leaves the field out of the identity (stores made before it stay valid).
    return json.loads((store / "index.json").read_text())["identity"].get("compute_dtype", "float32")


def section(results: dict, args) -> str:
    lines = ["| store | the target's matmuls | seed | steps | held-out accept_len | acc slot 1 / 2 / 3 |", "|---|---|---|---|---|---|"]
    for key in sorted(results):
        r = results[key]
        acc = " / ".join(f"{a:.3f}" for a in r["val_acc"])
        lines.append(f"| `{r['store']}` | {r['compute_dtype']} | {r['seed']} | {r['steps']} | {r['val_accept_len']:.3f} | {acc} |")
    setting = (f"Recipe: `experiment={EXPERIMENT}` for {args.steps} steps of one row from each store (the demo's "
               f"{row_count(args.train_rows)} regenerated rows, float16 storage either way), validated once at the end on the 48 held-out rows, whose "
               "features come from the same capture as the training rows.\n")
    return provenance(command_line()) + "\n" + setting + "\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="the bfloat16 (auto) store with a val split")
    parser.add_argument("--train-rows", default=".cache/demo/regen/train.jsonl")
    parser.add_argument("--val-rows", default=".cache/demo/regen/heldout.jsonl")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default=".cache/bench/capture_dtype")
    args = parser.parse_args()
    results_path = Path(args.out) / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    store = Path(args.store)
    for each in (store, capture_float32(store, args.train_rows, args.val_rows)):
        dtype = compute_dtype(each)
        for seed in args.seeds:
            key = f"{dtype}@{seed}@{args.steps}"
            if key in results:
                print(f"{key}: kept from {results_path}")
                continue
            records = train(Path(args.out) / key, str(each), args.train_rows, args.val_rows, args.steps, seed, [])
            val = [r for r in records if r.get("split") == "val"][-1]
            results[key] = {"store": str(each), "compute_dtype": dtype, "seed": seed, "steps": args.steps,
                            "val_accept_len": val["val/accept_len"], "val_acc": val["val/acc_per_slot"]}
            results_path.parent.mkdir(parents=True, exist_ok=True)
            results_path.write_text(json.dumps(results, indent=2) + "\n")
            print(key, results[key], flush=True)
    title = "Capture in bfloat16 or float32: held-out accept_len after the same steps (SmolLM2-135M)"
    print(f"wrote {write_section('capture_dtype', title, section(results, args))}")


if __name__ == "__main__":
    main()

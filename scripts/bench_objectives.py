"""The training options of the objectives issue side by side on SmolLM2-135M: held-out accept_len
after the same budget, one option at a time on top of one base recipe.

    .venv/bin/python scripts/bench_objectives.py --store DIR [--steps 1200] [--only NAME ...]

The store must hold the demo's training rows and held-out rows (data.val) with soft labels,
e.g. `python -m blockdraft.data.capture experiment=smollm2_dflash_cpu data.val=<heldout.jsonl>
train.kl_weight=0.5 train.teacher_top_k=32 out=DIR`. Every run trains the same rows in the same
order for the same steps from that store (so the target's forward is not part of the budget),
validates once at the end on the held-out rows, and runs alone on the cores. Figures go to
docs/benchmarks.md; each run's metrics stay under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from bench_serve import REPO, command_line, provenance, write_section
from budget_runs import row_count

EXPERIMENT = "smollm2_dflash_cpu"
# (name, what it tests, overrides on top of the base)
VARIANTS = [
    ("base", "the base recipe", []),
    ("mask_embedding", "1. trained mask embedding (mean init)", ["draft.train_mask_embedding=true", "draft.mask_embedding_init=mean"]),
    ("dpace", "2. D-PACE position weights (alpha 0.5)", ["train.position_weighting=dpace"]),
    ("muon", "3. Muon for the matrices (muon_lr 2e-2, Newton-Schulz in float32)", ["optim=muon", "optim.lr=2e-3"]),
    ("soft_labels", "4. soft labels: CE + KL to the target's top-32", ["train.kl_weight=1.0"]),
    ("feature_noise", "5. Gaussian noise on the features (std 0.5)", ["train.feature_noise_std=0.5"]),
    # The D-PACE normalisations (losses.LOSS_NORMALIZATIONS): what the weighted sum is divided by.
    ("dpace_by_weights", "6a. D-PACE, divided by the sum of its weights",
     ["train.position_weighting=dpace", "train.loss_normalization=weights"]),
    ("dpace_by_blocks", "6b. D-PACE, divided by the blocks", ["train.position_weighting=dpace", "train.loss_normalization=blocks"]),
    ("dpace_by_tokens", "6c. D-PACE, divided by the supervised slots",
     ["train.position_weighting=dpace", "train.loss_normalization=tokens"]),
]
BASE = ["draft.draft_vocab_size=8192", "draft.train_mask_embedding=false", "train.position_weighting=decay",
        "train.kl_weight=0.0", "train.feature_noise_std=0.0"]
ENV = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1"}


def run_variant(args, name: str, overrides: List[str]) -> dict:
    run_dir = Path(args.out) / result_key(name, args.seed)
    argv = [sys.executable, "-m", "blockdraft.train", f"experiment={EXPERIMENT}", f"run_dir={run_dir}", "overwrite=true",
            f"seed={args.seed}",
            f"data.features={args.store}", f"data.train={args.train_rows}", f"data.val={args.val_rows}",
            f"train.max_steps={args.steps}", "train.val_every=0", "train.save_every=0", "train.progress=false",
            *args.base, *overrides]
    print("$", " ".join(argv), flush=True)
    began = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if r.get("split") == "val"][-1]
    train = [r for r in records if "step_time_s" in r]
    first = next(r for r in train)
    return {"val_accept_len": val["val/accept_len"], "val_acc": val["val/acc_per_slot"], "first_loss": first["loss"],
            "step_time_s": sum(r["step_time_s"] for r in train[1:]) / max(1, len(train) - 1),
            "wall_s": time.perf_counter() - began}


def result_key(name: str, seed: int) -> str:
    # Seed 0 keeps the plain name, so the rows measured before seeds were recorded stay where they were.
    return name if seed == 0 else f"{name}@{seed}"


def section(results: dict, args) -> str:
    lines = ["| option | overrides | seed | held-out accept_len | acc slot 1 / 2 / 3 | first-window loss | step (s) |",
             "|---|---|---|---|---|---|---|"]
    for name, what, overrides in VARIANTS:
        for key in sorted(k for k in results if k == name or k.startswith(name + "@")):
            r = results[key]
            seed = key.partition("@")[2] or "0"
            acc = " / ".join(f"{a:.3f}" for a in r["val_acc"])
            lines.append(f"| {what} | `{' '.join(overrides) or '-'}` | {seed} | {r['val_accept_len']:.3f} | {acc} | "
                         f"{r['first_loss']:.2f} | {r['step_time_s']:.3f} |")
    setting = (f"Base: `experiment={EXPERIMENT} {' '.join(args.base)}`, {args.steps} steps of one row from the feature "
               f"store `{args.store}` (the demo's {row_count(args.train_rows)} regenerated rows, float16), validated once at the end on the "
               "48 held-out rows (accept_len: 1 + the run of correct drafted slots, as vLLM counts a round, over the "
               "draft's own vocabulary). One row per option; everything else equal. Rows accumulate in "
               f"`{args.out}/results.json` over invocations (`--only` reruns some); each run stays under `{args.out}/<name>`.\n")
    return provenance(command_line()) + "\n" + setting + "\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--train-rows", default=".cache/demo/regen/train.jsonl")
    parser.add_argument("--val-rows", default=".cache/demo/regen/heldout.jsonl")
    parser.add_argument("--steps", type=int, default=1200)
    # The table's base: the demo recipe before this table chose its options (a later recipe that
    # adopts some of them must not move the base under the rows).
    parser.add_argument("--base", nargs="*", default=BASE, help="overrides every run shares")
    parser.add_argument("--only", nargs="*", default=None, help="run only these variants")
    parser.add_argument("--out", default=".cache/bench/objectives")
    parser.add_argument("--section", default="objectives", help="the docs/benchmarks.md section the table goes to")
    parser.add_argument("--title", default="Objectives and inputs: held-out accept_len after the same budget (SmolLM2-135M)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (anchors, data order, initial weights)")
    args = parser.parse_args()
    results_path = Path(args.out) / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for name, _, overrides in VARIANTS:
        if args.only is None or name in args.only:
            key = result_key(name, args.seed)
            results[key] = run_variant(args, name, overrides)
            results_path.parent.mkdir(parents=True, exist_ok=True)
            results_path.write_text(json.dumps(results, indent=2) + "\n")
            print(key, results[key], flush=True)
    doc = write_section(args.section, args.title, section(results, args))
    print(f"wrote {doc}")


if __name__ == "__main__":
    main()

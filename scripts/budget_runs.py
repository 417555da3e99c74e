"""Training runs from a feature store sized by wall time instead of steps: what the lever and
scaling benchmarks share.

A run of B seconds first trains a short probe of the same settings to measure its step time,
then trains B / step_time steps, so the learning-rate schedule ends where the budget does
(a run cut off by a clock would be compared mid-schedule). The target's forward is not in the
budget (it ran once, into the store); start-up and the final validation are not either.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from bench_serve import REPO

EXPERIMENT = "smollm2_dflash_cpu"
PROBE_STEPS = 40
ENV = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1"}


def train(run_dir: Path, store: str, train_rows: str, val_rows: str, steps: int, seed: int, overrides: List[str],
          validate: bool = True) -> List[dict]:
    """One training run from the store; returns its metrics records."""
    argv = [sys.executable, "-m", "blockdraft.train", f"experiment={EXPERIMENT}", f"run_dir={run_dir}", "overwrite=true",
            f"seed={seed}", f"data.features={store}", f"data.train={train_rows}",
            f"data.val={val_rows if validate else 'null'}",
            f"train.max_steps={steps}", "train.val_every=0", "train.save_every=0", "train.progress=false",
            "train.log_every=10", *overrides]
    print("$", " ".join(argv), flush=True)
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{run_dir.name} failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def row_count(rows: str) -> int:
    """The conversations in a JSONL file of regenerated rows: what a section says it trained on."""
    with open(REPO / rows) as f:
        return sum(1 for line in f if line.strip())


def training_seconds(records: List[dict]) -> float:
    """The loop's own time: each logged window's step time times its steps."""
    windows = [r for r in records if "step_time_s" in r]
    return sum(r["step_time_s"] * (r["step"] - before) for r, before in zip(windows, [0] + [w["step"] for w in windows]))


def step_seconds(records: List[dict]) -> float:
    """The median logged step time, the first window (warm-up, lazy initialisation) left out."""
    times = [r["step_time_s"] for r in records if "step_time_s" in r][1:]
    return statistics.median(times)


def train_for(run_dir: Path, budget_s: float, store: str, train_rows: str, val_rows: str, seed: int,
              overrides: List[str]) -> dict:
    """Probe, then train for `budget_s` seconds of steps and validate once at the end."""
    probe = train(run_dir.with_name(run_dir.name + "-probe"), store, train_rows, val_rows, PROBE_STEPS, seed, overrides,
                  validate=False)
    steps = max(PROBE_STEPS, round(budget_s / step_seconds(probe)))
    began = time.perf_counter()
    records = train(run_dir, store, train_rows, val_rows, steps, seed, overrides)
    val = [r for r in records if r.get("split") == "val"][-1]
    return {"steps": steps, "step_time_s": step_seconds(records), "budget_s": budget_s,
            "train_s": training_seconds(records), "wall_s": time.perf_counter() - began,
            "val_accept_len": val["val/accept_len"], "val_acc": val["val/acc_per_slot"]}

"""Training throughput on CPU: step time, tokens/s, time shares and peak memory from metrics.jsonl.

Runs `experiment=tiny_cpu` (or the experiment given) for DFlash and DFlash2, with one process and
with `torchrun --nproc_per_node=2`, and prints the steady-state figures (the first logged window,
which includes warm-up, is left out).

    .venv/bin/python scripts/bench/bench_train.py [experiment] [extra overrides...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from publish import REPO, stamp


def run(experiment: str, kind: str, nproc: int, extra: list) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench_train_")) / "run"
    launcher = [sys.executable, "-m", "blockdraft.train"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "-m", "blockdraft.train"]
    args = [f"experiment={experiment}", f"draft={kind}", f"run_dir={run_dir}", "train.progress=false",
            "train.max_steps=120", "train.log_every=20", "train.save_every=0", "data.val=null", *extra]
    if kind == "dflash2" and experiment == "tiny_cpu":
        args.append("draft.conv_group_size=8")  # the tiny target is 64 wide
    subprocess.run([*launcher, *args], cwd=REPO, check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})  # one thread per rank: 2 ranks use both cores
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in rows if "split" not in r][1:]
    mean = lambda key: sum(r[key] for r in steady) / len(steady)  # noqa: E731
    return {"kind": kind, "procs": nproc, "step_time_s": mean("step_time_s"), "tokens_per_s": mean("tokens_per_s"),
            "share_target": mean("share_target"), "share_draft": mean("share_draft"), "share_other": mean("share_other"),
            "peak_rss_gib": max(r.get("peak_rss_gib", 0.0) for r in steady)}


def main() -> None:
    experiment = sys.argv[1] if len(sys.argv) > 1 else "tiny_cpu"
    extra = sys.argv[2:]
    print(f"training benchmark: experiment={experiment} {' '.join(extra)}; {stamp()}")
    print(f"{'draft':<8} {'procs':>5} {'step s':>8} {'tokens/s':>9} {'target':>7} {'draft':>6} {'other':>6} {'peak RSS/rank':>14}")
    for kind in ("dflash", "dflash2"):
        for nproc in (1, 2):
            r = run(experiment, kind, nproc, extra)
            print(f"{r['kind']:<8} {r['procs']:>5} {r['step_time_s']:8.4f} {r['tokens_per_s']:9.0f} "
                  f"{r['share_target']:7.1%} {r['share_draft']:6.1%} {r['share_other']:6.1%} {r['peak_rss_gib']:11.2f} GiB", flush=True)


if __name__ == "__main__":
    main()

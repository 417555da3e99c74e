"""Peak resident memory per rank of online training on 2 gloo ranks, with the target and the draft each
replicated or sharded, against the target's size. Section `target_memory` of docs/benchmarks-history.md.

The target is a random Qwen3 of at least 1 GB built from a config (32 layers of width 1024, MLP 2048, float32),
saved under .cache/targets/ once; the draft is the tiny recipe's (one layer at the target's width). Each run
trains a few steps under torchrun; the largest rank's peak RSS is what the launcher's children report
(`ru_maxrss` of RUSAGE_CHILDREN: the largest single process, not a sum), and rank 0's own peak is in its
metrics (`peak_rss_gib`). Runs alternate in the order given and repeat (`--repeats`); the median is shown.

    .venv/bin/python scripts/bench/bench_target_memory.py [--repeats 2] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from publish import REPO, command_line, provenance, write_section

TARGET = REPO / ".cache" / "targets" / "bench-qwen3-w1024-l32"
SETTINGS = [("none", "ddp"), ("fsdp", "ddp"), ("none", "fsdp"), ("fsdp", "fsdp")]
GIB = 2**30


def big_target() -> int:
    """Builds the target once (the tiny family's shape at width 1024: MLP 2048, 32 heads of 32, one KV head);
    returns the bytes of its parameters."""
    import torch
    import transformers

    from blockdraft.models.tiny_target import save_tiny_target

    save_tiny_target(TARGET, "qwen3", hidden_size=1024, num_layers=32)
    config = transformers.AutoConfig.from_pretrained(TARGET)
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(config)
    return sum(p.numel() * 4 for p in model.parameters())


def train(target_sharding: str, draft_sharding: str, steps: int, run_dir: Path) -> dict:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "blockdraft.train",
            "experiment=tiny_cpu", f"target.path={TARGET}", "target.tiny=null", "prepare.regenerate_builtin=null",
            "data.val=null", "draft.target_layer_ids=[1,15,29]", f"distributed.target_sharding={target_sharding}",
            f"train.draft_sharding={draft_sharding}", f"train.max_steps={steps}", "train.micro_batch_size=2",
            "train.log_every=1", "train.progress=false", f"run_dir={run_dir}", "overwrite=true"]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    # Run from a child so that RUSAGE_CHILDREN holds only this run's processes.
    probe = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(done.stdout[-3000:] + done.stderr[-3000:] if done.returncode else '', file=sys.stderr); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)")
    done = subprocess.run([sys.executable, "-c", probe, *argv], cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{target_sharding}/{draft_sharding} failed:\n{done.stderr[-4000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"largest_rank_gib": int(done.stdout.split()[-1]) * 1024 / GIB,
            "rank0_gib": max(r["peak_rss_gib"] for r in rows if "peak_rss_gib" in r),
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    target_bytes = big_target()
    results = {s: [] for s in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for setting in SETTINGS:
                got = train(*setting, args.steps, Path(tmp) / f"{setting[0]}-{setting[1]}")
                print(f"[{repeat + 1}/{args.repeats}] target {setting[0]}, draft {setting[1]}: {got}", flush=True)
                results[setting].append(got)
    rows = ["| target_sharding | draft_sharding | largest rank's peak RSS, GiB (median, spread) | rank 0 | vs the target's size | wall s |",
            "|---|---|---|---|---|---|"]
    for (t, d), runs in results.items():
        peaks = [r["largest_rank_gib"] for r in runs]
        median = statistics.median(peaks)
        rows.append(f"| {t} | {d} | {median:.2f} ({min(peaks):.2f}-{max(peaks):.2f}) | "
                    f"{statistics.median(r['rank0_gib'] for r in runs):.2f} | {median * GIB / target_bytes:.2f}x | "
                    f"{statistics.median(r['seconds'] for r in runs):.0f} |")
    body = (provenance(command_line(env="OMP_WAIT_POLICY=PASSIVE"))
            + f"\nTarget: random Qwen3, 32 layers of width 1024 (MLP 2048), float32: **{target_bytes / GIB:.2f} GiB**; "
              f"2 gloo ranks, {args.steps} steps of the tiny recipe's draft (one layer at the target's width), "
              f"{args.repeats} runs each, alternating.\n\n" + "\n".join(rows) + "\n")
    print(body)
    write_section("target_memory", "Online training: peak memory per rank, target and draft replicated or sharded", body)


if __name__ == "__main__":
    main()

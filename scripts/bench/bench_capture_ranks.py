"""Capture on one process against two ranks under torchrun (gloo): rows/s, and the two stores compared row by
row (every row's tensors equal). Section `capture_ranks` of docs/benchmarks-history.md. With --by-shard, two
ranks holding the target by shard (distributed.target_sharding=fsdp: every layer all-gathered in every forward)
against two holding it whole, at 1 and at 8 rows per forward: what a forward's gathers cost against its compute.

The target is a small random Qwen3 (width 512, 8 layers, the project's tiny tokenizer) built from a config
under .cache/targets/; the rows are the tiny recipe's, repeated (`--rows`, each made distinct) into one file.
One process uses torch's threads on every core; torchrun gives each rank one thread, so both use the machine.

    .venv/bin/python scripts/bench/bench_capture_ranks.py [--rows 384] [--rows-per-shard 32] [--by-shard]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from publish import REPO, command_line, provenance, write_section

TARGET = REPO / ".cache" / "targets" / "bench-qwen3-w512-l8"
LAYERS = "[1,3,6]"


def small_target() -> Path:
    from blockdraft.models.tiny_target import save_tiny_target

    return save_tiny_target(TARGET, "qwen3", hidden_size=512, num_layers=8)


def write_rows(out: Path, count: int) -> Path:
    source = [json.loads(line) for line in (REPO / ".cache" / "tiny_cpu" / "train.jsonl").read_text().splitlines() if line.strip()]
    with out.open("w") as f:
        for i in range(count):
            row = json.loads(json.dumps(source[i % len(source)]))
            row["messages"][0]["content"] = f"{i}: " + row["messages"][0]["content"]
            f.write(json.dumps(row) + "\n")
    return out


def capture(ranks: int, rows: Path, out: Path, rows_per_shard: int, threads: int = 0, extra=()) -> dict:
    launch = [sys.executable, "-m", "blockdraft.capture"] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m", "blockdraft.capture"]
    words = ["experiment=tiny_cpu", f"target.path={TARGET}", "target.tiny=null", "prepare.regenerate_builtin=null",
             f"data.train={rows}", "data.val=null", "data.seq_length=512", f"draft.target_layer_ids={LAYERS}",
             f"rows_per_shard={rows_per_shard}", "train.progress=false", f"data.cache_dir={out}-cache", *extra, f"out={out}"]
    started = time.perf_counter()
    done = subprocess.run([*launch, *words], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **({"OMP_NUM_THREADS": str(threads)} if threads else {})})
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    loops = [float(s) for s in re.findall(r"\[capture\] train(?: on rank \d+ of \d+)?: .* in ([\d.]+) s", done.stdout)]
    index = json.loads((out / "index.json").read_text())["splits"]["train"]
    return {"ranks": ranks, "wall_s": wall, "loop_s": max(loops), "rows": index["rows"], "tokens": index["tokens"]}


def compare_stores(a: Path, b: Path) -> dict:
    """Every row of two stores: whether all tensors are equal bit for bit, whether the integer ones (ids, masks,
    documents) are, and the largest feature difference."""
    import torch

    from blockdraft.data.feature_store import FeatureStore, FeatureStoreDataset

    rows_a, rows_b = (FeatureStoreDataset(FeatureStore.open(root), "train") for root in (a, b))
    assert len(rows_a) == len(rows_b)
    exact, integers, worst = True, True, 0.0
    for i in range(len(rows_b)):
        ra, rb = rows_a[i], rows_b[i]
        assert ra.keys() == rb.keys()
        exact &= all(torch.equal(ra[k], rb[k]) for k in rb)
        integers &= all(torch.equal(ra[k], rb[k]) for k in rb if not rb[k].is_floating_point())
        worst = max(worst, float((ra["features"] - rb["features"]).abs().max()))
    return {"exact": exact, "integers": integers, "worst": worst}


def shown(c: dict) -> str:
    if c["exact"]:
        return "every row's tensors bit-equal"
    return f"ids, masks, documents equal; features within {c['worst']:.1e}" if c["integers"] else "ROWS DIFFER"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=384)
    parser.add_argument("--rows-per-shard", type=int, default=32)
    parser.add_argument("--by-shard", action="store_true", help="time the target held by shard against whole instead")
    args = parser.parse_args()
    small_target()
    if args.by_shard:
        return by_shard(args)
    with tempfile.TemporaryDirectory() as tmp:
        rows = write_rows(Path(tmp) / "rows.jsonl", args.rows)
        results = [capture(ranks, rows, Path(tmp) / f"store-{ranks}", args.rows_per_shard) for ranks in (1, 2)]
        # One process on one thread: the kernels of a torchrun rank, so any difference left is the split's.
        capture(1, rows, Path(tmp) / "store-1t", args.rows_per_shard, threads=1)
        against_one = compare_stores(Path(tmp) / "store-2", Path(tmp) / "store-1")
        against_one_thread = compare_stores(Path(tmp) / "store-2", Path(tmp) / "store-1t")
    lines = ["| ranks | wall s (start to end) | capture loop s (slowest rank) | rows/s (loop) | tokens/s (loop) | store against 1 process |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['ranks']} | {r['wall_s']:.1f} | {r['loop_s']:.1f} | {r['rows'] / r['loop_s']:.1f} | "
                     f"{r['tokens'] / r['loop_s']:.0f} | {'(itself)' if r['ranks'] == 1 else shown(against_one)} |")
    lines.append(f"| 1, one thread | | | | | 2 ranks' store: {shown(against_one_thread)} |")
    speedup = results[0]["loop_s"] / results[1]["loop_s"]
    body = (f"{results[0]['rows']} rows ({results[0]['tokens']} tokens) of the tiny recipe's rows, a random Qwen3 of width 512 "
            f"and 8 layers, layers {LAYERS} kept in float16, {args.rows_per_shard} rows per shard. Two gloo ranks "
            f"capture {speedup:.2f}x as fast as one process in the capture loop; the wall time adds each "
            "process's start (interpreter, torch, the target, tokenisation on rank 0 first). A rank runs on one "
            "thread, as the last row's process does: the stores compare as the last column says.\n\n"
            + "\n".join(lines) + "\n\n" + provenance(command_line(env="OMP_WAIT_POLICY=PASSIVE")))
    print(body)
    write_section("capture_ranks", "Capture over ranks: 2 gloo ranks against 1 process", body)


def by_shard(args) -> None:
    """Two ranks, the target whole on each against by shard, at 1 and 8 rows per forward; each store against the
    whole one of the same rows per forward."""
    lines = ["| rows per forward | target on each rank | capture loop s (slowest rank) | tokens/s (loop) | by shard / whole | store against whole |",
             "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        rows = write_rows(Path(tmp) / "rows.jsonl", args.rows)
        for per in (1, 8):
            runs = {}
            for how, extra in (("whole", []), ("by shard", ["distributed.target_sharding=fsdp"])):
                out = Path(tmp) / f"store-{per}-{how.replace(' ', '-')}"
                runs[how] = (capture(2, rows, out, args.rows_per_shard, extra=[f"rows_per_forward={per}", *extra]), out)
            (whole, whole_out), (shard, shard_out) = runs["whole"], runs["by shard"]
            same = shown(compare_stores(shard_out, whole_out))
            for how, (r, _) in runs.items():
                ratio = f"{r['loop_s'] / whole['loop_s']:.2f}x the time" if how == "by shard" else ""
                lines.append(f"| {per} | {how} | {r['loop_s']:.1f} | {r['tokens'] / r['loop_s']:.0f} | {ratio} | "
                             f"{same if how == 'by shard' else '(itself)'} |")
    body = (f"{args.rows} rows of the tiny recipe's rows, a random Qwen3 of width 512 and 8 layers (layers {LAYERS} "
            "kept, so 7 of 8 layers run), 2 gloo ranks of one thread each. By shard, each forward all-gathers every "
            "layer it runs from the other rank (gloo over loopback), the next layer's gather issued as a layer starts; "
            "more rows per forward spread that over more tokens.\n\n"
            + "\n".join(lines) + "\n\n" + provenance(command_line(env="OMP_WAIT_POLICY=PASSIVE")))
    print(body)
    write_section("capture_by_shard", "Capture by shard: 2 gloo ranks holding the target by shard against whole", body)


if __name__ == "__main__":
    main()

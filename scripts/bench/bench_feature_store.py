"""Feature store and reduced vocabulary on SmolLM2-135M: capture speed, store size, step time, coverage.

    .venv/bin/python scripts/bench/bench_feature_store.py [--steps 40] [--train-rows .cache/demo/regen/train.jsonl] [--store DIR]

1. Captures the demo's training rows once (`python -m blockdraft.capture`, float16):
   tokens/s and bytes per 1k tokens.
2. Trains the demo recipe for a few steps online (full vocabulary), then from the store with the
   full vocabulary and with `draft.draft_vocab_size` 8192 and 16384: step time and time shares.
   The head's share (vocabulary projection + CE, forward and backward) is timed on its own on
   the recipe's shapes, since the step's backward cannot be split by module.
3. The share of reply tokens the N most frequent ones cover, N = 8192, 16384, 32768.
Runs one job at a time (never two on the cores) and writes docs/benchmarks-history.md. `--store DIR`
keeps the store there (a later run with the same DIR reuses it and times only the training).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import torch

from publish import REPO, command_line, provenance, publish
from bench_train_smollm2 import EXPERIMENT, run_training, summarize

VOCAB_SIZES = (8192, 16384)
COVERAGE_SIZES = (8192, 16384, 32768)
ENV = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1"}


def capture(args, out: Path) -> dict:
    """A fresh capture's figures; a complete store at `out` from an earlier run is reused (figures from its index)."""
    if (out / "index.json").is_file() and "capture_seconds" in json.loads((out / "index.json").read_text()).get("bench", {}):
        return json.loads((out / "index.json").read_text())["bench"]
    argv = [sys.executable, "-m", "blockdraft.capture", f"experiment={EXPERIMENT}", f"data.train={args.train_rows}",
            "data.val=null", f"out={out}", "train.progress=false"]
    print("$", " ".join(argv), flush=True)
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"capture failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    m = re.search(r"\[capture\] train: (\d+) tokens in ([\d.]+) s \((\d+) tokens/s\)", done.stdout)
    tokens, seconds = int(m.group(1)), float(m.group(2))
    size = sum(p.stat().st_size for p in (out / "train").glob("*.safetensors"))
    figures = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "bytes_per_1k": size / tokens * 1000,
               "bytes": size, "capture_seconds": seconds, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    index = json.loads((out / "index.json").read_text())
    (out / "index.json").write_text(json.dumps({**index, "bench": figures}, indent=2) + "\n")  # the reader ignores extra keys
    return figures


def step_runs(args, store: Path, tmp: Path) -> List[tuple]:
    runs = [("online, full vocabulary", []), ("store, full vocabulary", [f"data.features={store}"])]
    runs += [(f"store, draft_vocab_size {n}", [f"data.features={store}", f"draft.draft_vocab_size={n}"]) for n in VOCAB_SIZES]
    out = []
    for i, (name, overrides) in enumerate(runs):
        run_args = argparse.Namespace(**{**vars(args), "overrides": overrides})
        out.append((name, summarize(run_training(run_args, tmp / f"run{i}"))))
    return out


def head_seconds(vocab: int, slots: int, hidden: int = 576, repeats: int = 20) -> float:
    """One step's head: [slots, H] @ [V, H]^T, CE, backward to the hidden states (the head is frozen)."""
    h = torch.randn(slots, hidden, requires_grad=True)
    w, labels = torch.randn(vocab, hidden) * hidden**-0.5, torch.randint(0, vocab, (slots,))
    times = []
    for _ in range(repeats + 2):
        began = time.perf_counter()
        torch.nn.functional.cross_entropy(h @ w.T, labels).backward()
        times.append(time.perf_counter() - began)
    return statistics.median(times[2:])


def coverage_rows(store: Path) -> List[tuple]:
    from blockdraft.data.feature_store import FeatureStore, FeatureStoreDataset
    from blockdraft.train.draft_vocab import coverage, reply_token_counts, required_tokens, select_draft_vocab

    dataset = FeatureStoreDataset(FeatureStore.open(store), "train")
    vocab = FeatureStore.open(store).identity["target"]["vocab_size"]
    counts = reply_token_counts(dataset, vocab)
    required = required_tokens(dataset, [2])  # SmolLM2's eos, <|im_end|>
    rows = [(n, coverage(counts, select_draft_vocab(counts, n, required))) for n in COVERAGE_SIZES]
    return rows, int(counts.sum()), int((counts > 0).sum())


def section(cap: dict, steps: List[tuple], heads: dict, cov, args, command: str) -> str:
    cov_rows, reply_tokens, distinct = cov
    online = steps[0][1]["step_time_s"]
    lines = [provenance(command), "",
             f"Capture of the demo's {args.train_rows} (recipe `{EXPERIMENT}`, layers [1, 10, 18, 27], float16):", "",
             "| figure | value |", "|---|---|",
             f"| capture throughput | {cap['tokens_per_s']:.0f} tokens/s ({cap['tokens']} tokens in {cap['seconds']:.0f} s, measured {cap['date']}) |",
             f"| store size | {cap['bytes_per_1k'] / 2**20:.2f} MiB per 1k tokens ({cap['bytes'] / 2**20:.0f} MiB in all) |", "",
             f"Training step, demo recipe (one row, 64 anchors x 3 slots), {args.steps} steps, mean over the windows after the first. "
             "The head column is the vocabulary projection + CE, forward and backward, timed alone on the same shapes "
             "(part of the draft column).", "",
             "| run | step (s) | vs online | target | draft | of which head | other |", "|---|---|---|---|---|---|---|"]
    for name, fig in steps:
        vocab = next((n for n in VOCAB_SIZES if name.endswith(str(n))), 49152)
        head = heads[vocab] / fig["step_time_s"]
        other = 1 - fig["share_target"] - fig["share_draft"]
        lines.append(f"| {name} | {fig['step_time_s']:.3f} | {fig['step_time_s'] / online:.2f}x | {fig['share_target']:.0%} | "
                     f"{fig['share_draft']:.0%} | {head:.0%} | {other:.0%} |")
    lines += ["", f"Reply tokens covered by the N most frequent ({reply_tokens:,} reply tokens, {distinct:,} distinct ids of 49,152):", "",
              "| N | share of reply tokens |", "|---|---|"] + [f"| {n} | {share:.2%} |" for n, share in cov_rows]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--train-rows", default=".cache/demo/regen/train.jsonl")
    parser.add_argument("--store", help="capture into (or reuse) this store instead of a temporary one")
    args = parser.parse_args(argv)
    if not (REPO / args.train_rows).is_file():
        sys.exit(f"--train-rows {args.train_rows} does not exist; run `make demo` first (it regenerates them)")
    with tempfile.TemporaryDirectory(prefix="bench_store_") as tmp:
        store = Path(args.store) if args.store else Path(tmp) / "store"
        cap = capture(args, store)
        steps = step_runs(args, store, Path(tmp))
        heads = {v: head_seconds(v, slots=64 * 3) for v in (49152, *VOCAB_SIZES)}
        cov = coverage_rows(store)
    body = section(cap, steps, heads, cov, args, command_line())
    publish("feature_store", "Feature store and reduced vocabulary (SmolLM2-135M)", body)


if __name__ == "__main__":
    main()

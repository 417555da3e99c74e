"""What regeneration and capture can give back to training: one lever at a time, on SmolLM2-135M.

    .venv/bin/python scripts/bench_stage_levers.py regen   [--rows 96] [--workers 32] [--rounds 1]
    .venv/bin/python scripts/bench_stage_levers.py workers [--rows 96] [--workers-list 32 64 96] [--rounds 1]
    .venv/bin/python scripts/bench_stage_levers.py capture [--rows 64] [--train-rows .cache/demo/regen/train.jsonl]

regen    `python -m blockdraft.data.regen` on the same ShareGPT rows with vLLM's OpenMP threads bound
         its own way (auto: every core but one, kept for the engine loop) and on every core (all),
         alternating; generated tokens/s from regen.json.
workers  the same regeneration on every core with each number of requests in flight (`regen.workers`,
         which is also vLLM's max_num_seqs), in an order that alternates between rounds.
capture  `python -m blockdraft.data.capture` of the same rows of the demo's regenerated training set,
         float32 in the store so only the computation differs: rows per target forward 1, 4 and 8,
         and bfloat16 matmuls; tokens/s, and the features' relative error against the float32 capture.
(How the serve stage's servers are kept between rounds: scripts/bench_serve_methods.py.)
Needs the demo's target (for capture its rows: `make demo`). One job at a time: run nothing
else on the cores meanwhile. Writes its section of docs/benchmarks.md.
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
from typing import List

import torch
from safetensors.torch import load_file

from bench_serve import REPO, command_line, provenance, shown_path, write_section

TARGET = REPO / ".cache" / "targets" / "smollm2-135m-instruct"
ENV = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1"}


def run(argv: List[str]) -> str:
    print("$", " ".join(argv), flush=True)
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def regen(args, tmp: Path) -> str:
    rows = []
    for round_number in range(1, args.rounds + 1):
        order = ("auto", "all") if round_number % 2 else ("all", "auto")
        for bind in order:
            manifest = regen_run(args, tmp / f"regen-{bind}-{round_number}", args.workers, bind)
            split = manifest["splits"]["train"]["last_run"]
            rows.append((round_number, bind, split["tokens"], split["seconds"], split["tokens_per_s"],
                         manifest.get("vllm_omp_binding")))
    table = ["| round | `regen.cpu_threads_bind` | tokens | seconds | generated tokens/s | vLLM's binding line |",
             "|---|---|---|---|---|---|"]
    table += [f"| {r} | `{b}` | {t} | {s:.1f} | {tps:.1f} | {line} |" for r, b, t, s, tps, line in rows]
    by = {b: [tps for _, bb, _, _, tps, _ in rows if bb == b] for b in ("auto", "all")}
    ratio = (sum(by["all"]) / len(by["all"])) / (sum(by["auto"]) / len(by["auto"]))
    return "\n".join(table) + (f"\n\nEvery core against vLLM's default: {ratio:.2f}x the generated tokens/s "
                               f"({args.rows} ShareGPT rows, {args.workers} in flight, replies of at most 128 tokens).")


def regen_run(args, out: Path, workers: int, bind: str) -> dict:
    run([sys.executable, "-m", "blockdraft.data.regen", f"target={TARGET}", f"out={out}", "prompts=sharegpt",
         f"num_train={args.rows}", "num_heldout=0", "max_tokens=128", "max_prompt_tokens=256",
         f"workers={workers}", f"cpu_threads_bind={bind}", "progress=false"])
    return json.loads((out / "regen.json").read_text())


def workers(args, tmp: Path) -> str:
    rows = []
    for round_number in range(1, args.rounds + 1):
        order = args.workers_list if round_number % 2 else args.workers_list[::-1]
        for n in order:
            split = regen_run(args, tmp / f"regen-{n}-{round_number}", n, "all")["splits"]["train"]["last_run"]
            rows.append((round_number, n, split["tokens"], split["seconds"], split["tokens_per_s"]))
    table = ["| round | `regen.workers` | tokens | seconds | generated tokens/s |", "|---|---|---|---|---|"]
    table += [f"| {r} | {n} | {t} | {s:.1f} | {tps:.1f} |" for r, n, t, s, tps in rows]
    return "\n".join(table) + (f"\n\n{args.rows} ShareGPT rows, replies of at most 128 tokens, "
                               "`regen.cpu_threads_bind=all`.")


def capture(args, tmp: Path) -> str:
    rows_file = tmp / "rows.jsonl"
    rows_file.write_text("".join(Path(args.train_rows).read_text().splitlines(keepends=True)[: args.rows]))
    variants = [("1 row per forward, float32", ["rows_per_forward=1", "compute_dtype=float32"]),
                ("4 rows per forward, float32", ["rows_per_forward=4", "compute_dtype=float32"]),
                ("8 rows per forward, float32", ["rows_per_forward=8", "compute_dtype=float32"]),
                ("1 row per forward, bfloat16", ["rows_per_forward=1", "compute_dtype=bfloat16"]),
                ("8 rows per forward, bfloat16", ["rows_per_forward=8", "compute_dtype=bfloat16"])]
    results, reference = [], None
    for label, overrides in variants:
        out = tmp / re.sub(r"\W+", "-", label)
        stdout = run([sys.executable, "-m", "blockdraft.data.capture", "experiment=smollm2_dflash_cpu",
                      f"target.path={TARGET}", f"data.train={rows_file}", "data.val=null", "storage_dtype=float32",
                      "train.progress=false", f"out={out}", *overrides])
        m = re.search(r"\[capture\] train: (\d+) tokens in ([\d.]+) s", stdout)
        features = torch.cat([load_file(str(p))["features"] for p in sorted((out / "train").glob("*.safetensors"))])
        reference = features if reference is None else reference
        error = ((features - reference).norm() / reference.norm()).item()
        results.append((label, int(m.group(1)), float(m.group(2)), error))
    base = results[0][1] / results[0][2]
    table = ["| capture | tokens | seconds | tokens/s | vs 1 row, float32 | features' relative error vs 1 row, float32 |",
             "|---|---|---|---|---|---|"]
    table += [f"| {label} | {t} | {s:.1f} | {t / s:.0f} | {t / s / base:.2f}x | {e:.2e} |" for label, t, s, e in results]
    return "\n".join(table) + (f"\n\nThe first {args.rows} rows of `{shown_path(args.train_rows)}`, "
                               "SmolLM2-135M's layers [1, 10, 18, 27].")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("section", choices=("regen", "workers", "capture"))
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--workers-list", type=int, nargs="+", default=[32, 64, 96])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--section", dest="key", default=None,
                        help="the docs/benchmarks.md section written (default stage_levers_<section>): another machine's table")
    parser.add_argument("--train-rows", default=str(REPO / ".cache" / "demo" / "regen" / "train.jsonl"))
    args = parser.parse_args()
    args.rows = args.rows or (64 if args.section == "capture" else 96)
    if not (TARGET / "config.json").is_file():
        sys.exit(f"no target at {TARGET}: `make demo` (or python -m blockdraft.models.prepare_gguf) prepares it")
    with tempfile.TemporaryDirectory() as tmp:
        body = {"regen": regen, "workers": workers, "capture": capture}[args.section](args, Path(tmp))
    title = {"regen": "Regeneration: vLLM's CPU thread binding", "workers": "Regeneration: requests in flight",
             "capture": "Capture: rows per forward and bfloat16"}
    doc = write_section(args.key or f"stage_levers_{args.section}", title[args.section], provenance(command_line()) + "\n" + body)
    print(body)
    print(f"written to {doc}")


if __name__ == "__main__":
    main()

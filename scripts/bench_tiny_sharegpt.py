"""blockdraft's side of a setting another trainer was measured in: a tiny random Qwen3 target with
SmolLM2's vocabulary, raw ShareGPT conversations, 300 steps of 4 rows, block 8, 32 anchors, 2 layers.

    .venv/bin/python scripts/bench_tiny_sharegpt.py [--rows 1200] [--val-rows 100] [--steps 300] [--variant NAME ...]

Builds the target (random weights, seed 0; SmolLM2-135M-Instruct's tokenizer and chat template
from the demo's prepared target) and the rows (the first --rows + --val-rows ShareGPT
conversations with an assistant turn, as they are: every assistant turn is supervised), then
trains each variant on the same rows and reports the held-out accept_len of its last validation.
Writes docs/benchmarks.md; runs one job at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench_serve import REPO, command_line, provenance, write_section

WORK = REPO / ".cache" / "bench" / "tiny_sharegpt"
SMOLLM2 = REPO / ".cache" / "targets" / "smollm2-135m-instruct"
BASE = ["target.tiny=null", "draft.num_layers=2", "draft.block_size=8", "train.num_anchors=32", "train.micro_batch_size=4",
        "train.grad_accum=1", "optim.lr=6e-4", "data.seq_length=1024", "train.log_every=50", "train.save_every=0",
        "train.progress=false", "draft.mask_token_id=6", "prepare.regenerate_builtin=null", "train.gamma=7.0"]
VARIANTS = {"defaults": []}


def build_target(path: Path) -> Path:
    """A random Qwen3 (6 layers, hidden 64) over SmolLM2's 49,152-token vocabulary."""
    if (path / "config.json").is_file():
        return path
    from transformers import AutoTokenizer

    from blockdraft.models.tiny_target import build_tiny_model

    if not (SMOLLM2 / "tokenizer.json").is_file():
        sys.exit(f"{SMOLLM2} is missing: run `python -m blockdraft.models.prepare_gguf` (or `make demo`) first")
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    model = build_tiny_model("qwen3", 0, vocab_size=len(tokenizer))
    model.config.eos_token_id, model.config.pad_token_id, model.config.bos_token_id = 2, 2, None
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, path)
    return path


def write_rows(rows: int, val_rows: int) -> tuple[Path, Path]:
    from blockdraft.data.sharegpt import iter_json_array, sharegpt_path

    train, val = WORK / f"train_{rows}.jsonl", WORK / f"val_{val_rows}.jsonl"
    if train.is_file() and val.is_file():
        return train, val
    kept = []
    with open(sharegpt_path()) as f:
        for record in iter_json_array(f):
            turns = record.get("conversations") or []
            if any(t.get("from") == "gpt" and t.get("value", "").strip() for t in turns):
                kept.append({"conversations": turns})
            if len(kept) == rows + val_rows:
                break
    WORK.mkdir(parents=True, exist_ok=True)
    train.write_text("".join(json.dumps(r) + "\n" for r in kept[:rows]))
    val.write_text("".join(json.dumps(r) + "\n" for r in kept[rows:]))
    return train, val


def run(name: str, overrides: list, target: Path, train: Path, val: Path, steps: int) -> dict:
    run_dir = WORK / "runs" / name
    argv = [sys.executable, "-m", "blockdraft.train", f"target.path={target}", f"data.train={train}", f"data.val={val}",
            f"run_dir={run_dir}", "overwrite=true", f"train.max_steps={steps}", *BASE, *overrides]
    print("$", " ".join(argv), flush=True)
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val_line = [r for r in records if r.get("split") == "val"][-1]
    return {"val_accept_len": val_line["val/accept_len"], "val_acc": val_line["val/acc_per_slot"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1200)
    parser.add_argument("--val-rows", type=int, default=100)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--variant", nargs="*", default=list(VARIANTS))
    args = parser.parse_args()
    target = build_target(WORK / "target")
    train, val = write_rows(args.rows, args.val_rows)
    results = {name: run(name, VARIANTS[name], target, train, val, args.steps) for name in args.variant}
    lines = ["| variant | overrides | held-out accept_len | acc slots 1-3 |", "|---|---|---|---|"]
    for name, r in results.items():
        acc = " / ".join(f"{a:.3f}" for a in r["val_acc"][:3])
        lines.append(f"| {name} | `{' '.join(VARIANTS[name]) or '-'}` | {r['val_accept_len']:.3f} | {acc} |")
    setting = (f"Target: random Qwen3 (6 layers, hidden 64, seed 0) with SmolLM2-135M-Instruct's tokenizer. Rows: the "
               f"first {args.rows} ShareGPT conversations with an assistant turn (every assistant turn supervised), "
               f"the next {args.val_rows} held out. `{' '.join(BASE)}`, {args.steps} steps.\n")
    doc = write_section("tiny_sharegpt", "A tiny random target on raw ShareGPT (blockdraft's side of a cross-trainer setting)",
                        provenance(command_line()) + "\n" + setting + "\n" + "\n".join(lines) + "\n")
    print(json.dumps(results, indent=2))
    print(f"wrote {doc}")


if __name__ == "__main__":
    main()

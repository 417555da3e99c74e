"""A feature store captured by transformers against one captured through vLLM (`capture.backend=vllm`), end to end on
the demo target: the per-layer feature differences over every row of the two stores, and the two pipeline runs'
training and serve reports side by side. Section `capture_engines` of docs/benchmarks-history.md.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench/bench_capture_engines.py [--out .cache/bench/engines]
        [--num-train 300] [--num-heldout 24] [--steps 1800] [--serve-prompts 16] [--force-serve] [--compare-only]

One command reproduces the table: (1) the target answers `--num-train` ShareGPT prompts and `--num-heldout` held-out
ones once (`python -m blockdraft.regen`, the demo's lengths: 128 reply tokens, 256 prompt tokens), into
<out>/rows; (2) two pipeline runs from those rows (`rows=`, `heldout_rows=`), one after the other, that differ only in
`capture.backend` (transformers, the default, and vllm): `store=true`, the same steps and seed, the capture in float32
(vLLM on a CPU runs float32 whatever compute_dtype says, so the transformers side keeps the recipe's float32 too), the
demo's serve settings; (3) both stores read row by row (FeatureStoreDataset) and compared per target layer; (4) each
run's serve/report.json, stages.json and run/metrics.jsonl read. Every stage is cached by the pipeline: a rerun
reads the finished runs and only compares (--compare-only runs nothing at all). Needs `make demo`'s target
(.cache/targets/smollm2-135m-instruct) and the serving environment (.venv-serve).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from publish import REPO, command_line, provenance, shown_path, write_section

TARGET = ".cache/targets/smollm2-135m-instruct"
BACKENDS = ("transformers", "vllm")
LSCPU_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16")


def run_logged(words: list, log: Path) -> float:
    """Run a command from the repository root, its output both printed and kept in `log`; its wall seconds."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    print("$ " + " ".join(words), flush=True)
    began = time.perf_counter()
    with log.open("a") as f, subprocess.Popen(words, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
        proc.wait()
    if proc.returncode:
        raise SystemExit(f"{words[2]} failed (exit {proc.returncode}); its log: {log}")
    return time.perf_counter() - began


def regen(args, rows: Path) -> None:
    if (rows / "train.jsonl").is_file() and (rows / "heldout.jsonl").is_file() and (rows / "regen.json").is_file():
        print(f"[bench] rows already regenerated in {rows}", flush=True)
        return
    rows.mkdir(parents=True, exist_ok=True)
    seconds = run_logged([".venv/bin/python", "-m", "blockdraft.regen", f"target={TARGET}", f"out={rows}", "prompts=sharegpt",
                          f"num_train={args.num_train}", f"num_heldout={args.num_heldout}", "max_tokens=128",
                          "max_prompt_tokens=256", "workers=96"], rows / "regen.log")
    (rows / "bench_seconds.json").write_text(json.dumps({"regen_wall_s": seconds}) + "\n")


def pipeline_words(args, rows: Path, backend: str) -> list:
    words = [".venv/bin/python", "-m", "blockdraft.pipeline", f"target={TARGET}", "experiment=smollm2_dflash_cpu",
             f"out={Path(args.out) / backend}", f"rows={rows / 'train.jsonl'}", f"heldout_rows={rows / 'heldout.jsonl'}",
             "store=true", "round_cost=false", "data.val=null", "seed=0",
             f"train.max_steps={args.steps}", "train.max_minutes=null", "capture.rows_per_forward=8",
             f"serve.num_prompts={args.serve_prompts}", "serve.warmup_prompts=2", "serve.max_tokens=128", "serve.rounds=1"]
    words += ["force=[serve]"] if getattr(args, "force_serve", False) else []
    return words + (["capture.backend=vllm"] if backend == "vllm" else [])


def compare_stores(a: Path, b: Path) -> dict:
    """Per target layer over every row of every split both stores hold: max and mean |a - b|, max and mean |a|, max |b|;
    and whether the rows' ids and masks are equal."""
    import torch

    from blockdraft.data.feature_store import FeatureStore, FeatureStoreDataset

    store_a, store_b = FeatureStore.open(a), FeatureStore.open(b)
    layers = store_a.identity["target_layer_ids"]
    assert layers == store_b.identity["target_layer_ids"], (layers, store_b.identity["target_layer_ids"])
    width = store_a.identity["target"]["hidden_size"]
    splits = [s for s in ("train", "val") if store_a.has_split(s) and store_b.has_split(s)]
    n = len(layers)
    worst, diff_sum, value_sum = torch.zeros(n), torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    peak_a, peak_b, worst_row = torch.zeros(n), torch.zeros(n), [None] * n
    differing = torch.zeros(n, dtype=torch.float64)
    rows = tokens = 0
    same_rows = True
    for split in splits:
        rows_a, rows_b = FeatureStoreDataset(store_a, split), FeatureStoreDataset(store_b, split)
        if len(rows_a) != len(rows_b):
            raise SystemExit(f"{split}: {len(rows_a)} rows in {a}, {len(rows_b)} in {b}")
        for i in range(len(rows_a)):
            ra, rb = rows_a[i], rows_b[i]
            same_rows &= all(torch.equal(ra[k], rb[k]) for k in ("input_ids", "loss_mask", "document_lengths"))
            fa = ra["features"].view(-1, n, width)
            fb = rb["features"].view(-1, n, width)
            d = (fa - fb).abs()
            row_worst = d.amax(dim=(0, 2))
            for j in range(n):
                if row_worst[j] > worst[j]:
                    worst[j], worst_row[j] = row_worst[j], f"{split} {i}"
            diff_sum += d.sum(dim=(0, 2)).double()
            differing += (d > 0).sum(dim=(0, 2)).double()
            value_sum += fa.abs().sum(dim=(0, 2)).double()
            peak_a = torch.maximum(peak_a, fa.abs().amax(dim=(0, 2)))
            peak_b = torch.maximum(peak_b, fb.abs().amax(dim=(0, 2)))
            rows += 1
            tokens += fa.shape[0]
    count = tokens * width
    return {"splits": splits, "rows": rows, "tokens": tokens, "same_rows": same_rows, "layers": [
        {"layer": layer, "max_diff": float(worst[j]), "mean_diff": float(diff_sum[j] / count),
         "max_value": float(peak_a[j]), "max_value_b": float(peak_b[j]), "mean_value": float(value_sum[j] / count),
         "differing": float(differing[j] / count),
         "worst_row": worst_row[j]} for j, layer in enumerate(layers)],
        "storage_dtype": store_a.identity["storage_dtype"]}


def compare_exports(a: Path, b: Path) -> dict:
    """The two exported drafts' tensors: how many differ at all, and the largest |a - b|."""
    import torch
    from safetensors.torch import load_file

    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    for name in ("mask_embedding.pt",):
        if (a / name).is_file() and (b / name).is_file():
            ta[name], tb[name] = (torch.load(str(p / name), map_location="cpu") for p in (a, b))
    assert ta.keys() == tb.keys()
    floats = [k for k in ta if torch.is_tensor(ta[k]) and ta[k].is_floating_point()]
    worst = max(float((ta[k].float() - tb[k].float()).abs().max()) for k in floats)
    equal = sum(torch.equal(ta[k], tb[k]) for k in ta if torch.is_tensor(ta[k]))
    return {"tensors": len(ta), "equal": equal, "worst": worst}


def run_figures(out: Path) -> dict:
    """What one pipeline run measured: its serve report, stage seconds, last training metrics and capture log lines."""
    report = json.loads((out / "serve" / "report.json").read_text())
    stages = json.loads((out / "stages.json").read_text())
    metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = [m for m in metrics if "loss" in m and "step" in m][-1]
    log = (out / "bench_pipeline.log").read_text() if (out / "bench_pipeline.log").is_file() else ""
    ready = re.findall(r"\[capture\] vLLM \d+ ready after (\d+) s", log)
    loop = re.findall(r"\[capture\] train: .* in ([\d.]+) s", log)
    seconds = {name: (stages.get(name) or {}).get("seconds") for name in ("capture", "train", "export", "serve")}
    return {"report": report, "seconds": seconds, "last": last, "server_start_s": float(ready[-1]) if ready else None,
            "capture_loop_s": float(loop[-1]) if loop else None}


def fmt(value, spec: str = ".3f", none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def interval(report: dict) -> str:
    iv = report.get("speedup_interval")
    if isinstance(iv, dict):
        low, high = iv.get("low"), iv.get("high")
    elif isinstance(iv, (list, tuple)) and len(iv) == 2:
        low, high = iv
    else:
        return ""
    return f" ({fmt(low)} to {fmt(high)})" if low is not None and high is not None else ""


def lscpu_line() -> str:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("Flags")), []))
    return f"CPU model (lscpu): {model}; flags: " + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in LSCPU_FLAGS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".cache/bench/engines")
    parser.add_argument("--num-train", type=int, default=300)
    parser.add_argument("--num-heldout", type=int, default=24)
    parser.add_argument("--steps", type=int, default=1800)
    parser.add_argument("--serve-prompts", type=int, default=16)
    parser.add_argument("--force-serve", action="store_true", help="measure both serve stages again (force=[serve])")
    parser.add_argument("--compare-only", action="store_true", help="run nothing: read the stores and reports there")
    args = parser.parse_args()
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    out = REPO / args.out
    rows = out / "rows"
    if not args.compare_only:
        regen(args, rows)
        for backend in BACKENDS:  # one after the other: the serve stage measures speed
            (out / backend).mkdir(parents=True, exist_ok=True)
            run_logged(pipeline_words(args, Path(args.out) / "rows", backend), out / backend / "bench_pipeline.log")

    diff = compare_stores(out / "transformers" / "store", out / "vllm" / "store")
    runs = {backend: run_figures(out / backend) for backend in BACKENDS}
    drafts = compare_exports(out / "transformers" / "export", out / "vllm" / "export")
    regen_s = json.loads((rows / "bench_seconds.json").read_text()).get("regen_wall_s") if (rows / "bench_seconds.json").is_file() else None
    counts = {split: sum(1 for line in (rows / f"{split}.jsonl").read_text().splitlines() if line.strip())
              for split in ("train", "heldout")}

    layer_lines = ["| target layer | max abs diff | mean abs diff | max abs value (transformers / vLLM) | mean abs value | mean diff / mean value | stored values that differ | worst row |",
                   "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in diff["layers"]:
        layer_lines.append(f"| {r['layer']} | {r['max_diff']:.3g} | {r['mean_diff']:.3g} | {r['max_value']:.4g} / {r['max_value_b']:.4g} | "
                           f"{r['mean_value']:.3g} | {r['mean_diff'] / r['mean_value']:.2e} | {100 * r['differing']:.4f}% | {r['worst_row']} |")

    run_lines = ["| | transformers capture | vLLM capture |", "|---|---|---|"]

    def row(label, get):
        run_lines.append(f"| {label} | " + " | ".join(get(runs[b]) for b in BACKENDS) + " |")

    row("lossless, draft active", lambda f: f"{f['report'].get('lossless')}, {f['report'].get('draft_active')}")
    row("mean acceptance length", lambda f: f"**{fmt(f['report'].get('mean_acceptance_length'))}**")
    row("drafts, drafted tokens, accepted tokens", lambda f: ", ".join(
        f"{int(f['report']['spec_decode'][k])}" for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")))
    row("acceptance per position", lambda f: " / ".join(fmt(x, '.2f') for x in f['report'].get('acceptance_per_position') or []))
    row("speedup (95% interval over prompts)", lambda f: f"{fmt(f['report'].get('speedup'))}x{interval(f['report'])}")
    row("round cost", lambda f: fmt(f['report'].get('round_cost'), '.2f'))
    row("capture stage s (vLLM: server start-up)", lambda f: fmt(f['seconds']['capture'], '.1f')
        + (f" ({f['server_start_s']:.0f})" if f['server_start_s'] is not None else ""))
    row("capture loop s", lambda f: fmt(f['capture_loop_s'], '.1f'))
    row("train stage s", lambda f: fmt(f['seconds']['train'], '.1f'))
    row("serve stage s", lambda f: fmt(f['seconds']['serve'], '.1f'))
    row("last logged step: loss, accept_len (training)", lambda f: f"{f['last']['step']}: {f['last']['loss']:.4f}, {f['last'].get('accept_len', float('nan')):.3f}")

    body = "\n".join([
        provenance(command_line(env="OMP_WAIT_POLICY=PASSIVE")),
        lscpu_line() + "\n",
        f"SmolLM2-135M-Instruct, recipe `smollm2_dflash_cpu`; rows regenerated once by the target through vLLM "
        f"({counts['train']} training rows and {counts['heldout']} held out, ShareGPT prompts, 128 reply tokens at most"
        + (f"; regen {regen_s:.0f} s" if regen_s else "") + "), then two pipeline runs from them "
        "(`rows=`, `heldout_rows=`) that differ only in `capture.backend`: `store=true`, float32 capture (vLLM's CPU "
        f"kernels; the transformers side the recipe's float32), float16 store, {args.steps} steps, seed 0, "
        f"`data.val=null`, served on {args.serve_prompts} held-out prompts x 128 tokens in one round of kept servers "
        "(2 warm-up prompts each), one run after the other. Their pipeline commands:\n",
        *[f"    {' '.join(pipeline_words(args, Path(args.out) / 'rows', b))}" for b in BACKENDS],
        "",
        f"Features over every row the two stores hold ({', '.join(diff['splits'])}: {diff['rows']} rows, {diff['tokens']} "
        f"tokens, stored in {diff['storage_dtype']}), |transformers - vLLM| per target layer; the ids, loss masks and "
        f"documents of every row {'equal' if diff['same_rows'] else 'DIFFER'}:\n",
        *layer_lines,
        "",
        "The two runs (serve/report.json, stages.json, run/metrics.jsonl):\n",
        *run_lines,
        "",
        f"The two exported drafts: {drafts['equal']} of {drafts['tensors']} tensors bit-equal, the largest |difference| "
        f"{drafts['worst']:.3g}.",
    ])
    print(body)
    write_section("capture_engines", "Capture engines: a transformers store against a vLLM store, trained and served (SmolLM2-135M)", body)
    print(f"written to {shown_path(REPO / 'docs' / 'benchmarks-history.md')}")


if __name__ == "__main__":
    main()

"""Per-layer differences between the transformers capture and the vLLM capture of the same rows.

    .venv/bin/python scripts/compare_capture_backends.py --target DIR [--rows R.jsonl] [--num-rows N]
        [--layers 1,10,18,27] [--max-len 512] [--teacher-top-k 0] [--servers 1] [--workers 8]

(a) transformers: RowForward over TargetModel (what `python -m blockdraft.capture` runs), fp32, per row;
(b) vLLM: capture servers started with blockdraft.capture.vllm_servers (extract_hidden_states and our
    connector; fp32 on CPU, the served dtype elsewhere), read back by blockdraft.capture.vllm_rows.VllmRows.
Rows: the first N conversations of a JSONL file (`messages` or `conversations`), rendered with the target's chat
template and cut to --max-len tokens; every token supervised (loss_mask all set), one document per row.
Prints a markdown table: per target layer, max and mean |transformers - vLLM| and the max |value| of the
transformers features; with --teacher-top-k, the stored top-k's id agreement and max |logit difference|.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def read_ids(target: str, rows_path: Path, num_rows: int, max_len: int) -> list:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    out = []
    for line in rows_path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        messages = row.get("messages") or [
            {"role": {"human": "user", "gpt": "assistant"}.get(m.get("from"), m.get("from")), "content": m.get("value")}
            for m in row.get("conversations", [])]
        ids = tokenizer.apply_chat_template(messages, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        out.append([int(t) for t in ids[:max_len]])
        if len(out) == num_rows:
            break
    if not out:
        sys.exit(f"no rows in {rows_path}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(REPO / ".cache" / "targets" / "tiny-qwen3"))
    ap.add_argument("--rows", default=str(REPO / ".cache" / "tiny_cpu" / "train.jsonl"))
    ap.add_argument("--num-rows", type=int, default=8)
    ap.add_argument("--layers", default=None, help="target_layer_ids, comma-separated (default: 1, L/2, L-2)")
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--teacher-top-k", type=int, default=0)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--kv-cache-gib", type=int, default=2)
    ap.add_argument("--out", default=None, help="where server logs go (default: a temporary directory)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from blockdraft.capture.forward import RowForward
    from blockdraft.capture.vllm_config import CaptureVllmConfig, check_capture_vllm
    from blockdraft.capture.vllm_rows import VllmRows
    from blockdraft.capture.vllm_servers import capture_servers
    from blockdraft.data.dataset import collate
    from blockdraft.models.target import TargetModel

    model = TargetModel.load(args.target, [0])
    num_layers = model.num_layers
    layers = ([int(x) for x in args.layers.split(",")] if args.layers
              else sorted({1, num_layers // 2, num_layers - 2}))
    model = TargetModel.load(args.target, layers)
    prompts = read_ids(args.target, Path(args.rows), args.num_rows, args.max_len)
    items = [{"input_ids": torch.tensor(ids), "loss_mask": torch.ones(len(ids), dtype=torch.bool),
              "document_lengths": torch.tensor([len(ids)]), "prompt_hashes": torch.zeros(1, dtype=torch.long)}
             for ids in prompts]
    wheres = [f"row {i}" for i in range(len(items))]
    tokens = sum(map(len, prompts))
    print(f"[rows] {len(items)} rows, {tokens} tokens, layers {layers} of {num_layers}, target {args.target}", flush=True)

    began = time.perf_counter()
    online = RowForward(model, torch.device("cpu"), torch.float32, args.teacher_top_k, "float32")
    want = [online.rows([item], collate([item], pad_id=0), [where])[0] for item, where in zip(items, wheres)]
    hf_s = time.perf_counter() - began

    cfg = CaptureVllmConfig(servers=args.servers, workers=args.workers, kv_cache_gib=args.kv_cache_gib)
    check_capture_vllm(cfg, args.teacher_top_k)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="compare_capture_"))
    with capture_servers(cfg, args.target, layers, args.teacher_top_k, args.max_len + 1, out) as servers:
        began = time.perf_counter()
        with VllmRows(servers.urls, servers.scratch_dir, layers, args.teacher_top_k, workers=args.workers,
                      timeout_s=cfg.request_timeout_s) as client:
            got = client.rows(items, wheres)
        vllm_s = time.perf_counter() - began

    hidden = model.hidden_size
    print()
    print("| target layer | vLLM aux layer | max abs diff | mean abs diff | max abs value |")
    print("|---:|---:|---:|---:|---:|")
    for j, layer in enumerate(layers):
        a = torch.cat([w["features"].view(len(w["input_ids"]), len(layers), hidden)[:, j] for w in want])
        b = torch.cat([g["features"].view(len(g["input_ids"]), len(layers), hidden)[:, j] for g in got])
        d = (a - b).abs()
        print(f"| {layer} | {layer + 1} | {float(d.max()):.3g} | {float(d.mean()):.3g} | {float(a.abs().max()):.3g} |")
    ids_equal = all(torch.equal(w["input_ids"], g["input_ids"]) for w, g in zip(want, got))
    print(f"\ninput ids equal: {ids_equal}")
    if args.teacher_top_k:
        agree = sum(int((w["teacher_ids"] == g["teacher_ids"]).all(-1).sum()) for w, g in zip(want, got))
        rows_k = sum(len(w["teacher_ids"]) for w in want)
        logit = max(float((w["teacher_logits"] - g["teacher_logits"]).abs().max()) for w, g in zip(want, got))
        print(f"teacher top-{args.teacher_top_k}: ids equal at {agree}/{rows_k} positions; max |logit diff| {logit:.3g}")
    print(f"transformers {hf_s:.1f} s; vLLM {vllm_s:.1f} s after start-up ({tokens} tokens; logs in {out})")


if __name__ == "__main__":
    main()

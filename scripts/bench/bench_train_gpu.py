"""Training-step throughput of a Qwen3-8B-shaped DFlash draft on one GPU.

The draft of the Qwen3-8B recipe (hidden 4096, 32 heads / 8 kv heads, head_dim 128, 5 layers,
block 16, 512 anchors, vocabulary 151,936) on one 4096-token row, fed by a random-weight target of
Qwen3-8B's width with as many layers as the captured ids [1, 9, 17, 25, 33] need (35: a draft may
not read the last layer; the capture stops after layer 33, so 34 run). Random weights change no
timing: only shapes matter. bf16 autocast, the chunked loss (1024 slots a chunk),
AdamW, as the recipe trains.

For each setting (flex | sdpa, with / without activation checkpointing) it reports tokens/s, the
step time split into target / draft / loss / other, the peak memory, and the model FLOPs
utilisation: the step's model FLOPs (target forward, draft forward and backward, the loss's head
forward and its backward into the draft; no recomputation) over the step time and the GPU's dense
bf16 rate (--peak-tflops; 989 for an H200 SXM), and over the bf16 matmul rate measured first.

    python scripts/bench/bench_train_gpu.py --out bench_train_gpu.json   # on a GPU, about 3 minutes
    python scripts/bench/bench_train_gpu.py --dry-run                    # the same code on CPU, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from blockdraft.config.recipe import LoopConfig  # noqa: E402
from blockdraft.losses.block import chunked_cross_entropy_rows, slot_weights, weighted_mean  # noqa: E402
from blockdraft.models import build_draft  # noqa: E402
from blockdraft.models.features import batch_features  # noqa: E402
from blockdraft.models.resolve import DraftConfig, resolve_draft_config  # noqa: E402
from blockdraft.models.target import TargetModel  # noqa: E402
from blockdraft.train.step import block_attention_mask, draw_blocks, train_step  # noqa: E402


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_layers: int
    layer_ids: tuple
    block: int
    anchors: int
    seq: int
    loss_chunk: int


QWEN3_8B = Shape(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288, vocab=151_936,
                 draft_layers=5, layer_ids=(1, 9, 17, 25, 33), block=16, anchors=512, seq=4096, loss_chunk=1024)
# The dry run: the same code at a size a CPU runs in seconds.
TINY = Shape(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
             draft_layers=2, layer_ids=(1, 3), block=4, anchors=8, seq=64, loss_chunk=16)
MASK_ID = 151_669  # a reserved Qwen3 token, as the recipe uses (any id < vocab; the tiny run takes vocab - 1)
SETTINGS = {"flex": ("flex", False), "flex+ckpt": ("flex", True), "sdpa": ("sdpa", False), "sdpa+ckpt": ("sdpa", True)}


def build_target(shape: Shape, device):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=max(shape.layer_ids) + 2, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, tie_word_embeddings=False,
        architectures=["Qwen3ForCausalLM"],
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in bf16 and on the device: 15 GB and seconds, not 31 GB and minutes
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return TargetModel(model, list(shape.layer_ids)), config


def build_batch(shape: Shape, device) -> dict:
    """One row of one document: a 1/4 prompt and a 3/4 reply (the loss tokens)."""
    t = shape.seq
    g = torch.Generator().manual_seed(0)
    loss = torch.zeros(1, t, dtype=torch.bool)
    loss[:, t // 4:] = True
    batch = {"input_ids": torch.randint(0, shape.vocab - 2, (1, t), generator=g), "loss_mask": loss,
             "attention_mask": torch.ones(1, t, dtype=torch.bool), "position_ids": torch.arange(t)[None],
             "document_ids": torch.zeros(1, t, dtype=torch.long)}
    return {k: v.to(device) for k, v in batch.items()}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def autocast(device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


# --- model FLOPs ------------------------------------------------------------------------------
def linear_flops(tokens: int, fan_in: int, fan_out: int) -> float:
    return 2.0 * tokens * fan_in * fan_out


def layer_matmul_flops(shape: Shape, tokens: int) -> float:
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    attn = linear_flops(tokens, h, q) * 2 + linear_flops(tokens, h, kv) * 2  # q, o; k, v
    return attn + linear_flops(tokens, h, shape.intermediate) * 3  # gate, up, down


def forward_flops(shape: Shape, attended_pairs: float, supervised: int) -> dict:
    """Forward FLOPs by part; attended_pairs: (query, key) pairs the draft's block mask allows."""
    t, q_tokens = shape.seq, shape.anchors * shape.block
    qd, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    run_layers = max(shape.layer_ids) + 1  # the capture stops after the deepest captured layer
    return {
        "target_matmul": run_layers * layer_matmul_flops(shape, t),
        "target_attention": run_layers * 2 * 2.0 * qd * t * (t + 1) / 2,  # causal: QK^T and PV
        "draft_matmul": linear_flops(t, len(shape.layer_ids) * shape.hidden, shape.hidden) + shape.draft_layers * (
            linear_flops(t, shape.hidden, kv) * 2 + layer_matmul_flops(shape, q_tokens)),  # fc; context k, v; the block
        "draft_attention": shape.draft_layers * 2 * 2.0 * qd * attended_pairs,
        "head": linear_flops(supervised, shape.hidden, shape.vocab),
    }


def step_flops(forward: dict) -> dict:
    """A training step's model FLOPs: the frozen target's forward; the draft's forward and backward
    (twice the forward: activations and weights); the frozen head's forward and its backward into
    the hidden states (once the forward). Recomputation is not counted."""
    return {"target": forward["target_matmul"] + forward["target_attention"],
            "draft": 3 * (forward["draft_matmul"] + forward["draft_attention"]), "loss": 2 * forward["head"]}


def attended_pairs(blocks, batch, shape: Shape) -> float:
    from blockdraft.train.masks import dense_block_mask

    mask = dense_block_mask(blocks.anchors, blocks.anchor_valid, batch["attention_mask"], batch["document_ids"],
                            batch["position_ids"], blocks.block_position_ids, shape.block)
    return float(mask.sum())


# --- the step, whole and in phases ------------------------------------------------------------
def phased_step(draft, target, batch, cfg: LoopConfig, backend: str, device) -> dict:
    """The training step's work in its parts, each timed alone: the split of `train_step`'s time.
    The loss's backward runs into a detached copy of the hidden states, then the draft's from there."""
    b = draft.config.block_size
    times = {}
    t0 = sync(device)
    with autocast(device):
        features = batch_features(target, batch)
        t1 = sync(device)
        blocks = draw_blocks(batch, cfg, b, draft.config.mask_token_id, torch.Generator().manual_seed(1))
        mask = block_attention_mask(blocks, batch, b, backend, None)
        ctx_kv = draft.context_kv(features, batch["position_ids"])
        hidden = draft(draft.embed(blocks.block_ids, target.embed_tokens), blocks.block_position_ids, ctx_kv, mask, b)
        sup = blocks.label_mask
        h_sup = hidden.view(*sup.shape, -1)[sup]
        t2 = sync(device)
        leaf = h_sup.detach().requires_grad_(True)
        ce = chunked_cross_entropy_rows(leaf, target.lm_head_weight, blocks.labels[sup], cfg.loss_chunk_size)
        loss = weighted_mean(ce, slot_weights(blocks.slot_weights_offset[sup], cfg.gamma))
        loss.backward()
        t3 = sync(device)
        h_sup.backward(leaf.grad)
    t4 = sync(device)
    times.update(target=t1 - t0, draft=(t2 - t1) + (t4 - t3), loss=t3 - t2)
    return times


def measure(shape: Shape, setting: str, steps: int, warmup: int, device, target) -> dict:
    backend, ckpt = SETTINGS[setting]
    draft_cfg = resolve_draft_config(DraftConfig(
        kind="dflash", num_layers=shape.draft_layers, block_size=shape.block,
        mask_token_id=MASK_ID if shape.vocab > MASK_ID else shape.vocab - 1,
        target_layer_ids=list(shape.layer_ids)), target.model.config)
    torch.manual_seed(0)
    draft = build_draft(draft_cfg).to(device).train()
    draft.activation_checkpointing = ckpt
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4, fused=device.type == "cuda")
    cfg = LoopConfig(num_anchors=shape.anchors, gamma=7.0, loss_chunk_size=shape.loss_chunk,
                     attention_backend=backend, activation_checkpointing=ckpt)
    batch = build_batch(shape, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step_times, last = [], None
    for i in range(warmup + steps):
        started = sync(device)
        with autocast(device):
            last = train_step(draft, target, batch, cfg, torch.Generator().manual_seed(i), backend)
            last.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            step_times.append(sync(device) - started)
    step = sorted(step_times)[len(step_times) // 2]
    phases = [phased_step(draft, target, batch, cfg, backend, device) for _ in range(max(1, min(3, steps)))]
    split = {k: sorted(p[k] for p in phases)[len(phases) // 2] for k in phases[0]}
    split["other"] = max(0.0, step - sum(split.values()))
    blocks = draw_blocks(batch, cfg, shape.block, draft_cfg.mask_token_id, torch.Generator().manual_seed(0))
    flops = step_flops(forward_flops(shape, attended_pairs(blocks, batch, shape), int(blocks.label_mask.sum())))
    record = {"setting": setting, "backend": backend, "activation_checkpointing": ckpt, "steps": steps,
              "step_time_s": step, "step_time_spread_s": [min(step_times), max(step_times)],
              "tokens_per_s": shape.seq / step, "split_s": split, "model_tflop": sum(flops.values()) / 1e12,
              "model_tflop_by_part": {k: v / 1e12 for k, v in flops.items()}, "loss": float(last.loss.detach())}
    if device.type == "cuda":
        record["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    del draft, optimizer
    return record


def matmul_tflops(device) -> float:
    """Measured bf16 matmul rate (8192^3, mean of 10 after 3 warm-ups): the GPU's attainable peak."""
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    started = sync(device)
    for _ in range(10):
        a @ b
    return 10 * 2 * n**3 / (sync(device) - started) / 1e12


def markdown(records, peak: float, measured: float | None) -> str:
    head = ("| setting | step (s) | tokens/s | target / draft / loss / other (s) | peak memory (GiB) | "
            f"MFU vs {peak:.0f} TFLOP/s |" + (f" MFU vs measured {measured:.0f} |" if measured else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in records:
        s = r["split_s"]
        rate = r["model_tflop"] / r["step_time_s"]
        mem = f"{r['peak_memory_gib']:.1f}" if "peak_memory_gib" in r else "-"
        line = (f"| {r['setting']} | {r['step_time_s']:.3f} | {r['tokens_per_s']:.0f} | "
                f"{s['target']:.3f} / {s['draft']:.3f} / {s['loss']:.3f} / {s['other']:.3f} | {mem} | {rate / peak:.1%} |")
        lines.append(line + (f" {rate / measured:.1%} |" if measured else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, SDPA only: checks the code runs")
    parser.add_argument("--settings", default="flex,sdpa,flex+ckpt,sdpa+ckpt")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (flex compiles in the first)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 rate (H200 SXM: 989)")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    args = parser.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    if args.dry_run:
        device, shape, steps, warmup = torch.device("cpu"), TINY, 1, 1
        settings = [s for s in settings if s.startswith("sdpa")]  # no flex backward on CPU
    elif not torch.cuda.is_available():
        print("no CUDA device: run this on a GPU machine, or pass --dry-run to check it on a CPU", file=sys.stderr)
        return 2
    else:
        device, shape, steps, warmup = torch.device("cuda"), QWEN3_8B, args.steps, args.warmup
    print(f"[bench] {shape}", flush=True)
    measured = matmul_tflops(device) if device.type == "cuda" else None
    started = time.perf_counter()
    target, _ = build_target(shape, device)
    print(f"[bench] target of {max(shape.layer_ids) + 2} layers built in {time.perf_counter() - started:.1f} s"
          + (f"; bf16 matmul {measured:.0f} TFLOP/s" if measured else ""), flush=True)
    records = []
    for setting in settings:
        started = time.perf_counter()
        record = measure(shape, setting, steps, warmup, device, target)
        record["wall_s"] = time.perf_counter() - started
        records.append(record)
        print(f"[bench] {setting}: {record['step_time_s']:.3f} s/step, loss {record['loss']:.3f} "
              f"({record['wall_s']:.0f} s with warm-up)", flush=True)
        if not math.isfinite(record["loss"]):
            print(f"[bench] {setting}: the loss is not finite", file=sys.stderr)
            return 1
    table = markdown(records, args.peak_tflops, measured)
    print(table)
    if args.out:
        # Here, not at the top: the GPU check's test loads this file alone, without its folder on sys.path.
        from publish import machine_kind, today

        payload = {"shape": shape.__dict__, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                   "machine": machine_kind(), "date": today(),
                   "torch": torch.__version__, "peak_tflops": args.peak_tflops, "measured_matmul_tflops": measured,
                   "records": records, "table": table}
        args.out.write_text(json.dumps(payload, indent=2, default=list))
    return 0


if __name__ == "__main__":
    sys.exit(main())

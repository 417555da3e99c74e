"""Checkpoint write and read times of a draft, ddp (rank 0 writes model.safetensors + the optimizer, the others wait)
against fsdp (every rank writes its shards with torch.distributed.checkpoint), and the fsdp checkpoint read back on
this world size. Run under torchrun; the read on another world size is a second run with --read <checkpoint>.

    .venv/bin/python -m torch.distributed.run --nproc_per_node=2 scripts/bench/bench_draft_checkpoint.py --hidden 1024 --out /tmp/ckpt_bench
    .venv/bin/python scripts/bench/bench_draft_checkpoint.py --hidden 1024 --read /tmp/ckpt_bench/fsdp/checkpoints/step_1
"""

import argparse
import shutil
import time
from pathlib import Path

import torch

from blockdraft.models import build_draft, sharded_io
from blockdraft.models.resolve import DraftConfig, resolve_draft_config
from blockdraft.models.tiny_target import tiny_config
from blockdraft.ranks.distributed import barrier, init_distributed
from blockdraft.train import checkpoint as ckpt
from blockdraft.train.parallelize import parallelize_draft


def draft_and_optimizer(hidden: int, layers: int, strategy: str, dist):
    target = tiny_config("qwen3", vocab_size=1024, num_layers=8, hidden_size=hidden)
    cfg = resolve_draft_config(DraftConfig(kind="dflash", num_layers=layers, block_size=4, mask_token_id=5,
                                           target_layer_ids=[1, 3, 5]), target)
    torch.manual_seed(0)
    draft = build_draft(cfg)
    parallelize_draft(draft, dist, strategy)
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)
    for p in draft.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's moments exist, as in a checkpoint of a trained run
    return draft, optimizer


def timed(fn) -> float:
    barrier()
    start = time.perf_counter()
    fn()
    barrier()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default="/tmp/draft_checkpoint_bench")
    ap.add_argument("--read", default=None, help="an fsdp checkpoint to read on this world size")
    args = ap.parse_args()
    dist = init_distributed()
    say = print if dist.is_main else (lambda *a, **k: None)
    if args.read:
        draft, optimizer = draft_and_optimizer(args.hidden, args.layers, "fsdp", dist)
        say(f"read on {dist.world_size} rank(s): {timed(lambda: sharded_io.read_shards(Path(args.read), draft, optimizer)):.2f} s")
        return
    out = Path(args.out)
    if dist.is_main:
        shutil.rmtree(out, ignore_errors=True)
    for strategy in ("ddp", "fsdp"):
        draft, optimizer = draft_and_optimizer(args.hidden, args.layers, strategy, dist)
        params = sum(p.numel() for p in draft.parameters())
        run = out / strategy
        if strategy == "ddp":
            state = {"step": 1, "optimizer": optimizer.state_dict(), "world_size": dist.world_size}
            save = lambda: dist.is_main and ckpt.save_checkpoint(run, 1, draft, state, "{}\n", 3)  # noqa: E731
        else:
            state = {"step": 1, "world_size": dist.world_size}
            save = lambda: ckpt.save_sharded_checkpoint(run, 1, draft, optimizer, state, "{}\n", 3, dist.is_main)  # noqa: E731
        seconds = timed(save)
        size = sum(f.stat().st_size for f in (run / "checkpoints" / "step_1").rglob("*") if f.is_file())
        say(f"{strategy}: {params / 1e6:.0f}M params, write {seconds:.2f} s on {dist.world_size} rank(s), {size / 2**20:.0f} MiB")
        if strategy == "ddp":
            say(f"ddp: resume verification (hash) {timed(lambda: ckpt.verify_checkpoint(run / 'checkpoints' / 'step_1')):.2f} s per rank")
        else:
            path = run / "checkpoints" / "step_1"
            say(f"fsdp: resume verification (hash split over ranks) "
                f"{timed(lambda: ckpt.verify_checkpoint(path, (dist.rank, dist.world_size))):.2f} s")
            say(f"fsdp: read on {dist.world_size} rank(s) {timed(lambda: sharded_io.read_shards(path, draft, optimizer)):.2f} s")


if __name__ == "__main__":
    main()
